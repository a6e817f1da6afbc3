"""Without dataset statistics a tiled or packed study is priced from the stated prior (prior.py): its
numbers against a hand count of InternVL's grids through the tiling rule, packed rows carrying their
samples' images, the assumed marking in `predict --json`, and `plan`'s warning when the verdict flips
between the prior's two ends (and not otherwise)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from helpers import REPO
from mimo_jobs.cli.app import app
from mimo_jobs.contract.datastats import DataStats
from mimo_jobs.model.presets import get_preset
from mimo_jobs.predict.datastats import data_mix, from_stats
from mimo_jobs.study.spec import DataSpec

runner = CliRunner()
TINY = get_preset("tiny").encoder  # patch 4, image size 16: a full tile is 16 tokens
TILE = 16
PROD = REPO / "studies/scale_33n_68n_100n.yaml"


def _energon(tmp_path: Path, **kw) -> DataSpec:
    return DataSpec(provider="energon", path=str(tmp_path / "no-stats-here"), **kw)


def test_the_prior_by_hand_from_internvls_grids(tmp_path):
    # InternVL's candidate grids (cols x rows, 1 <= cols*rows <= 4): 1x1, 1x2, 2x1, 1x3, 3x1, 1x4, 2x2, 4x1;
    # an image filling each gives that grid's tiles, plus the thumbnail for every grid but 1x1
    tiles = [1, 2, 2, 3, 3, 4, 4, 4]
    with_thumb = [t + (t > 1) for t in tiles]  # 1, 3, 3, 4, 4, 5, 5, 5
    m = data_mix(_energon(tmp_path, max_tiles=4, thumbnail=True), TINY, 4096)
    assert m.assumed and m.source.startswith("assumed: one image per sample")
    assert m.image_tokens_mean == pytest.approx(TILE * sum(with_thumb) / 8) == 60
    assert m.tokens_per_image == TILE  # every encoder sample is a full tile
    assert m.image_tokens_max == 5 * TILE
    assert m.range == (TILE, 5 * TILE)  # one tile an image .. four tiles and the thumbnail
    plain = data_mix(_energon(tmp_path, max_tiles=4), TINY, 4096)
    assert plain.image_tokens_mean == pytest.approx(TILE * sum(tiles) / 8) == 46
    assert plain.range == (TILE, 4 * TILE)
    # untiled: one full-size image a sample, the range a point
    one = data_mix(_energon(tmp_path), TINY, 4096)
    assert (one.image_tokens_mean, one.image_tokens_max, one.range) == (TILE, TILE, (TILE, TILE))
    # a sample is at most its row: with seq_length 64 the 80-token images count 64
    short = data_mix(_energon(tmp_path, max_tiles=4, thumbnail=True), TINY, 64)
    assert short.image_tokens_mean == pytest.approx((16 + 48 + 48 + 5 * 64) / 8)
    # the mock provider and dataset statistics are no assumption
    assert not data_mix(DataSpec(), TINY, 64).assumed


def test_a_packed_row_carries_its_samples_images(tmp_path):
    seq, text = 4096, 128  # the prior's text tokens a sample (prior.PRIOR_TEXT_TOKENS)
    m = data_mix(_energon(tmp_path, max_tiles=4, thumbnail=True, packing=True), TINY, seq)
    assert m.image_tokens_mean == pytest.approx(seq / (text + 60) * 60)
    assert m.image_tokens_max == (seq // (text + 80)) * 80  # as many of the largest samples as fit
    lo, hi = m.range
    assert lo == pytest.approx(seq / (text + 16) * 16) and hi == pytest.approx(seq / (text + 80) * 80)
    assert "samples per row of 4096" in m.source
    unpacked = data_mix(_energon(tmp_path, max_tiles=4, thumbnail=True), TINY, seq)
    assert m.image_tokens_mean > 20 * unpacked.image_tokens_mean
    # measured statistics are scaled the same way, by their measured text tokens
    st = DataStats("s.json", 10, 40.0, 50, 60, 24.0, 30, 2.0, 3, 20.0, {})
    rows = from_stats(st, 640)
    assert rows.image_tokens_mean == pytest.approx(640 / (24 + 40) * 40) and not rows.assumed
    assert rows.image_tokens_max == (640 // (24 + 60)) * 60
    assert rows.text_tokens_mean == pytest.approx(640 / (24 + 40) * 24)  # the row's text: its samples'
    assert from_stats(st).image_tokens_mean == 40.0  # unpacked: one sample a row


def _study(tmp_path: Path, data: dict, name: str = "prior.yaml", time_model: str | None = None) -> Path:
    doc = yaml.safe_load(PROD.read_text())
    doc["trainer"]["data"] = data
    if time_model is not None:
        doc["cluster"]["hardware"] = {"gpu": "H100", "time_model": time_model}
    doc["cluster"]["partition"] = "batch"
    doc["cluster"]["container"] = {"image": "/images/x.sqsh", "runtime": "pyxis"}
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


MOCK = {"provider": "mock", "image_sizes": [378]}  # full-size images: one tile each
TILED = {"provider": "energon", "path": "/data/none", "max_tiles": 12, "thumbnail": True}


def test_predict_marks_the_image_tokens_assumed(tmp_path):
    study = _study(tmp_path, TILED)
    r = runner.invoke(app, ["predict", str(study), "--json"])
    assert r.exit_code == 0, r.output
    run = json.loads(r.output)["runs"][0]
    tok = run["image_tokens"]
    assert tok["assumed"] is True and tok["source"].startswith("assumed: ")
    # SigLIP 384/14: 27 x 27 tokens a tile; 12 tiles + thumbnail (9477) is more than the study's row of 4096
    assert tok["range"] == [729, 4096]
    text = runner.invoke(app, ["predict", str(study)], env={"COLUMNS": "250"})
    assert "image tokens assumed (range 729 to 4096 image tokens a sample)" in text.output
    assert f"data stats --study {study}" in text.output
    mock = runner.invoke(app, ["predict", str(_study(tmp_path, MOCK, "mock.yaml")), "--json"])
    tok = json.loads(mock.output)["runs"][0]["image_tokens"]
    assert tok["assumed"] is False and tok["range"] is None


def test_plan_says_when_the_verdict_flips_within_the_prior(tmp_path, monkeypatch):
    # the flipping case was found by the FLOPs model on the default efficiencies (steptime.Efficiency): hold
    # them, not the H100's fitted ones (hardware.FITTED_EFFICIENCY), which move where the verdicts change
    monkeypatch.setattr("mimo_jobs.predict.steptime.FITTED_EFFICIENCY", {})
    study = _study(tmp_path, TILED, time_model="flops")
    r = runner.invoke(app, ["plan", "--from", str(study), "--nodes", "8", "--gbs", "768,128", "--top", "3"])
    assert r.exit_code == 0, r.output
    flips = [ln for ln in r.output.splitlines() if ln.startswith("# assumed image mix")]
    # gbs 768 on 8 nodes: colocated at one tile an image, the encoder on nodes of its own at a full row
    assert flips == [
        "# assumed image mix: colocated best at the low end (729 image tokens a sample), heterogeneous "
        f"(vision 2 nodes) at the high end (4096): measure with mimo-jobs data stats --study {study}"
    ]
    assert "every verdict below is assumed" in r.output
    j = runner.invoke(app, ["plan", "--from", str(study), "--nodes", "8", "--gbs", "768,128", "--json"])
    doc = json.loads(j.output)
    assert doc["image_tokens"]["assumed"] is True and doc["image_tokens"]["range"] == [729, 4096]
    ends = {p["gbs"]: p["assumed_mix"] for p in doc["plans"]}
    assert ends[768]["flips"] and ends[768]["low"]["verdict"] == "colocated"
    assert ends[768]["high"]["verdict"] == "heterogeneous (vision 2 nodes)"
    # gbs 128: the same split at both ends, no warning
    assert not ends[128]["flips"] and ends[128]["low"]["verdict"] == ends[128]["high"]["verdict"]
    # the mock provider's images are exact: nothing assumed, nothing re-priced
    m = runner.invoke(
        app, ["plan", "--from", str(_study(tmp_path, MOCK, "m.yaml")), "--nodes", "8", "--json"]
    )
    mdoc = json.loads(m.output)
    assert mdoc["image_tokens"]["assumed"] is False and mdoc["plans"][0]["assumed_mix"] is None

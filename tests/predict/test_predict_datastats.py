"""predict prices a dataset's measured tokens (`data stats` JSON) instead of one full-size image per sample:
the figures equal a hand count of the generator's recorded image sizes, and it says which it used; stats of
another image geometry are refused when named and passed over when only found beside the data."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from mimo_jobs.cli.app import app
from mimo_jobs.contract.datastats import stats_file_for
from mimo_jobs.study.load import StudyError, load_study

runner = CliRunner()
# energon's loader asks for pinned memory; CPU torch warns that there is no accelerator
pytestmark = pytest.mark.filterwarnings("ignore:'pin_memory' argument is set as true")
# tiny preset (patch 4, image size 16): (h, w) -> tokens by hand, (H/4)(W/4); a full-size image is 16
SIZES = {(8, 8): 4, (12, 12): 9, (16, 8): 8}
FULL = 16


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """A synthetic energon blend and its `data stats --json -o` file (written through the CLI)."""
    from mimo_jobs.data.synth import SynthConfig, synth

    root = tmp_path_factory.mktemp("pricing")
    cfg = SynthConfig(samples=40, text_only_fraction=0.25, image_sizes=tuple(SIZES), samples_per_shard=20)
    with contextlib.redirect_stdout(io.StringIO()):
        res = synth(root / "ds", cfg)
    out = root / "measured.json"
    r = runner.invoke(app, ["data", "stats", str(res.blend), "--seq-length", "64", "--json", "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["samples"] == cfg.samples  # --json prints the document it wrote
    recorded = json.loads((res.root / "synth.json").read_text())["image_sizes_by_key"]
    return root, res.blend, out, recorded


def _study(root: Path, blend: Path, **data) -> Path:
    doc = {
        "name": "priced",
        "cluster": {"executor": "local", "accelerator": "cpu", "gpus_per_node": 3},
        "trainer": {
            "model": "tiny",
            "seq_length": 96,
            "train_iters": 2,
            "data": {"provider": "energon", "path": str(blend), **data},
        },
        "matrix": {"points": [{"nodes": 1, "encoder": {"dp": 1}, "llm": {"dp": 2}, "gbs": 4}]},
    }
    path = root / "study.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _shape(study: Path):
    from mimo_jobs.predict.run import shape_of
    from mimo_jobs.study.expand import runs_of

    (run,) = runs_of(load_study(study))
    return shape_of(run.layout, run.trainer)


def test_stats_price_the_measured_tokens(dataset, tmp_path):
    root, blend, measured, recorded = dataset
    per_sample = [sum(SIZES[tuple(hw)] for hw in sizes) for sizes in recorded.values()]
    images = [n for n in per_sample if n]  # one image a sample here
    shutil.copy(measured, tmp_path / "m.json")
    with_stats = _shape(_study(tmp_path, blend, stats="m.json"))  # relative to the study file
    assert with_stats.image_tokens_mean == pytest.approx(sum(per_sample) / len(per_sample))
    assert with_stats.tokens_per_image == pytest.approx(sum(n * n for n in images) / sum(images))
    assert with_stats.image_tokens_max == max(per_sample) == 9
    assert str(tmp_path / "m.json") in with_stats.data_source
    without = _shape(_study(tmp_path, blend))
    assert (without.image_tokens_mean, without.tokens_per_image, without.image_tokens_max) == (
        FULL,
        FULL,
        FULL,
    )
    assert without.data_source.startswith("assumed: one full-size image per sample")
    assert with_stats.image_tokens_mean < without.image_tokens_mean

    from mimo_jobs.predict.run import sample_flops

    fl = sample_flops(with_stats.preset, 96, load_study(_study(tmp_path, blend, stats="m.json")).trainer.data)
    assert fl.encoder < sample_flops(without.preset, 96, None).encoder

    # run.yaml (read with no study context, e.g. by the trainer or a report) does not need the file; the
    # planner then passes it over, saying so
    from mimo_jobs.predict.datastats import data_mix
    from mimo_jobs.study.spec import TrainerSpec

    trainer = load_study(_study(tmp_path, blend, stats="m.json")).trainer.model_dump(mode="json")
    (tmp_path / "m.json").unlink()
    data = TrainerSpec.model_validate(trainer).data
    mix = data_mix(data, with_stats.preset.encoder)
    assert (
        mix.image_tokens_mean == FULL
        and "passed over" in mix.source
        and "no such statistics file" in mix.source
    )


def test_stats_beside_the_data_are_found_and_predict_says_so(dataset, tmp_path):
    root, blend, measured, _ = dataset
    ds = tmp_path / "ds"
    shutil.copytree(blend.parent, ds)
    beside = stats_file_for(ds / blend.name)
    assert beside == ds / "blend.stats.json"
    shutil.copy(measured, beside)
    study = _study(tmp_path, ds / blend.name)
    assert str(beside) in _shape(study).data_source
    r = runner.invoke(app, ["predict", str(study), "--gpu", "H100", "--json"])
    assert r.exit_code == 0, r.output
    (run,) = json.loads(r.output)["runs"]
    assert run["image_tokens"]["max"] == 9 and str(beside) in run["image_tokens"]["source"]
    r = runner.invoke(app, ["predict", str(study), "--gpu", "H100"], env={"COLUMNS": "250"})
    assert r.exit_code == 0 and f"image tokens: dataset statistics {beside}" in r.output, r.output
    # made for another tiling: passed over, saying why
    doc = json.loads(beside.read_text())
    doc["geometry"]["max_tiles"] = 4
    beside.write_text(json.dumps(doc))
    src = _shape(study).data_source
    assert src.startswith("assumed: one full-size image per sample") and "passed over" in src
    assert "max_tiles 4" in src


def test_tiling_without_stats_prices_the_largest_image_for_memory(dataset, tmp_path):
    _, blend, _, _ = dataset
    s = _shape(_study(tmp_path, blend, max_tiles=4, thumbnail=True))
    # time: the stated prior (tests/predict/test_image_prior.py has its arithmetic); memory: 4 tiles + the
    # thumbnail of 16 tokens each
    assert s.image_tokens_max == 5 * FULL and s.image_assumed and s.image_range == (FULL, 5 * FULL)


def test_bad_stats_are_refused_naming_the_field(dataset, tmp_path):
    _, blend, measured, _ = dataset
    doc = json.loads(measured.read_text())
    cases = {
        "missing.json": None,
        "notjson.json": "{",
        "old.json": json.dumps({**doc, "format": 1}),
        "neg.json": json.dumps({**doc, "image_tokens": {**doc["image_tokens"], "mean": -1}}),
        "other.json": json.dumps({**doc, "geometry": {**doc["geometry"], "image_size": 32}}),
    }
    wants = {
        "missing.json": "no such statistics file",
        "notjson.json": "not JSON",
        "old.json": "format 1",
        "neg.json": "'image_tokens.mean' is -1",
        "other.json": "image_size 32 (the study's: 16)",
    }
    for name, text in cases.items():
        if text is not None:
            (tmp_path / name).write_text(text)
        with pytest.raises(StudyError) as e:
            load_study(_study(tmp_path, blend, stats=name))
        msg = str(e.value)
        assert "trainer.data" in msg and wants[name] in msg, (name, msg)
    # the tiling is part of the geometry: stats of untiled images do not price a tiled study
    shutil.copy(measured, tmp_path / "m.json")
    with pytest.raises(StudyError, match="max_tiles 1 \\(the study's: 4\\)"):
        load_study(_study(tmp_path, blend, stats="m.json", max_tiles=4))

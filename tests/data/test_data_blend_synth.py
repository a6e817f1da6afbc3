"""Synthetic datasets (content, determinism, CLI) and the blend's observed image share."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
import tarfile

import pytest
import yaml

from mimo_jobs.data.errors import DataError
from mimo_jobs.data.images import ImageGeometry
from mimo_jobs.data.synth import COLORS, SHAPES, SynthConfig, parse_size, synth


def _members(tar_path):
    with tarfile.open(tar_path) as t:
        return {m.name: t.extractfile(m).read() for m in t.getmembers()}


def test_synth_writes_what_it_says_and_is_deterministic(tmp_path):
    from PIL import Image

    cfg = SynthConfig(
        samples=40, text_only_fraction=0.25, image_sizes=((8, 8), (16, 8)), samples_per_shard=16, seed=3
    )
    with contextlib.redirect_stdout(io.StringIO()):
        a = synth(tmp_path / "a", cfg)
        b = synth(tmp_path / "b", cfg)
    assert (a.n_caps, a.n_text) == (30, 10)
    assert a.caps_shards == ["caps-000000.tar", "caps-000001.tar"] and a.text_shards == ["text-000000.tar"]
    caps = {}
    for s in a.caps_shards:
        caps.update(_members(a.caps / s))
        assert (a.caps / s).read_bytes() == (b.caps / s).read_bytes()  # same arguments -> same bytes
    keys = sorted({n.rsplit(".", 1)[0] for n in caps})
    assert keys == [f"cap-{i:07d}" for i in range(30)]
    seen_sizes = set()
    for k in keys:
        img = Image.open(io.BytesIO(caps[f"{k}.png"]))
        caption = caps[f"{k}.txt"].decode()
        h, w = img.height, img.width
        seen_sizes.add((h, w))
        color, shape = caption.split()
        assert shape in SHAPES and len(caption) <= 13
        assert img.convert("RGB").getpixel((w - 1, 0)) in (
            COLORS[color],
            tuple(c // 2 for c in COLORS[color]),
        )
    assert seen_sizes == {(8, 8), (16, 8)}
    for cat in ("caps", "text"):
        meta = yaml.safe_load((tmp_path / "a" / cat / ".nv-meta" / "dataset.yaml").read_text())
        assert meta["sample_type"]["__class__"] == {"caps": "CaptioningSample", "text": "TextSample"}[cat]
    blend = yaml.safe_load(a.blend.read_text())
    weights = {e["path"]: e["weight"] for e in blend["splits"]["train"]["blend"]}
    assert weights == {"./caps": 0.75, "./text": 0.25}
    assert json.loads((tmp_path / "a" / "synth.json").read_text())["n_caps"] == 30


def test_synth_rejects_bad_settings(tmp_path):
    with pytest.raises(DataError, match="text_only_fraction=1.5"):
        synth(tmp_path, SynthConfig(text_only_fraction=1.5))
    with pytest.raises(DataError, match="HxW"):
        parse_size("8x")
    assert parse_size("16x8") == (16, 8) and parse_size("12") == (12, 12)
    assert not any(tmp_path.iterdir())  # nothing half-written


def test_geometry_token_counts():
    g = ImageGeometry(patch_size=4, image_size=16)
    assert [g.tokens(8, 8), g.tokens(12, 12), g.tokens(16, 8), g.tokens(10, 6)] == [4, 9, 8, 2]
    assert g.target_hw(32, 16) == (16, 8)  # scaled down to the max side, aspect kept
    assert g.target_hw(2, 3) == (4, 4)  # at least one patch
    assert g.max_tokens == 16


def test_cli_synth_and_bad_input(tmp_path):
    out = tmp_path / "ds"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "mimo_jobs.cli",
            "data",
            "synth",
            str(out),
            "--samples",
            "20",
            "--text-only-fraction",
            "0.5",
            "--image-sizes",
            "8,16x8",
        ],
        check=False,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    assert "10 image-caption samples" in r.stdout and "blend.yaml" in r.stdout
    assert (out / "caps" / ".nv-meta" / "split.yaml").exists() and (out / "text" / ".nv-meta").exists()
    assert not list(out.glob(".synth-staging*"))
    again = subprocess.run(
        [sys.executable, "-m", "mimo_jobs.cli", "data", "synth", str(out)],
        check=False,
        capture_output=True,
        text=True,
    )
    assert again.returncode == 2 and "already holds" in again.stderr
    bad = subprocess.run(
        [sys.executable, "-m", "mimo_jobs.cli", "data", "synth", str(tmp_path / "x"), "--image-sizes", "0"],
        check=False,
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "image size '0'" in bad.stderr and not (tmp_path / "x").exists()


def test_blend_image_share_matches_its_weight(tmp_path):
    """90% text / 10% image-caption: over 1600 drawn samples the image share is 0.10 +- 0.03 (3 sigma of a
    binomial is 0.0225), and the provider's own count agrees with the keys."""
    from mimo_jobs.data.energon_provider import EnergonProvider, LoaderConfig

    with contextlib.redirect_stdout(io.StringIO()):
        res = synth(tmp_path, SynthConfig(samples=400, text_only_fraction=0.9, samples_per_shard=50))
    cfg = LoaderConfig(
        path=str(res.blend),
        llm_dp=1,
        mbs=16,
        num_microbatches=1,
        seq_length=64,
        geometry=ImageGeometry(4, 16),
        vocab_size=128,
    )
    p = EnergonProvider(cfg, [0], need_images=False)
    keys = [k for _ in range(100) for k in p.next(0).sample_keys]
    tot = p.totals()
    p.close()
    share = sum(k.startswith("cap-") for k in keys) / len(keys)
    assert abs(share - 0.10) <= 0.03, share
    assert tot.image_samples == sum(k.startswith("cap-") for k in keys) and tot.samples == 1600


def test_check_data_path_before_any_loader(synth_blend):
    from mimo_jobs.data.check import check_data_path

    res, _ = synth_blend
    check_data_path(str(res.blend))  # fine
    with pytest.raises(DataError, match=r"use .*blend\.yaml"):
        check_data_path(str(res.root))
    broken = res.root / "broken-blend.yaml"  # next to caps/ and text/, one entry pointing nowhere
    broken.write_text(res.blend.read_text().replace("./text", "./nowhere"))
    with pytest.raises(DataError, match=r"splits\.train path './nowhere'.*does not exist"):
        check_data_path(str(broken))


def _data(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mimo_jobs.cli", "data", *map(str, args)],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _one_error(p: subprocess.CompletedProcess, code: int) -> str:
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == code and len(lines) == 1 and lines[0].startswith("error: "), p.stderr
    return lines[0]


def test_synth_and_stats_refuse_hostile_arguments_in_one_line(tmp_path, synth_blend):
    # counts without a bound, a file as the target, a staging folder a killed run left behind
    assert "at most 1,000,000" in _one_error(_data("synth", tmp_path / "a", "--samples", "5000000"), 2)
    assert "give 0 to 1,000,000" in _one_error(
        _data("synth", tmp_path / "a", "--vqa", "0", "--interleaved", "-1"), 2
    )
    (tmp_path / "file").write_text("x")
    assert "a file, not a directory" in _one_error(_data("synth", tmp_path / "file"), 2)
    left = tmp_path / "b" / ".synth-staging-7" / "caps"
    left.mkdir(parents=True)
    ok = _data("synth", tmp_path / "b", "--samples", "4", "--seed", "3")
    assert ok.returncode == 0, ok.stderr
    assert not list((tmp_path / "b").glob(".synth-staging*"))
    # stats: a tokenizer that is a file, an output that is a directory
    res, _ = synth_blend
    common = ("stats", res.blend, "--seq-length", "64")
    line = _one_error(_data(*common, "--tokenizer", tmp_path / "file"), 2)
    assert "--tokenizer" in line and "not a directory" in line
    line = _one_error(_data(*common, "--out", tmp_path), 2)
    assert "--out" in line and "a directory" in line

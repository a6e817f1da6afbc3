"""Tiling: token counts against hand computations, the grid against InternVL's own rule, the pixels against
PIL crops made here, and a real energon dataset of large images through the provider and the trainer."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
from pathlib import Path

import pytest
import yaml

from helpers.launch import trainer, worker_env
from mimo_jobs.data.batch import flatten
from mimo_jobs.data.images import ImageGeometry, decode
from mimo_jobs.model.presets import PRESETS
from mimo_jobs.model.tiling import closest_grid

# tiny preset: patch 4, image size 16 -> a full tile is 4 x 4 = 16 tokens
TINY = dict(patch_size=4, image_size=16)

# (h, w, max_tiles, thumbnail) -> tokens, each by hand (tiles x 16, or the one-piece size's (H/4)(W/4))
HAND = [
    # 1:1, 64x64. One piece: 16x16 = 16. max 4/6: ratios 1x1 and 2x2 tie at distance 0, the area 4096 >
    # 0.5*16^2*4 = 512 takes 2x2 (no 6-tile grid is square); max 12: 3x3 ties too (4096 > 0.5*256*9)
    (64, 64, 1, False, 16),
    (64, 64, 4, False, 4 * 16),
    (64, 64, 4, True, 5 * 16),
    (64, 64, 6, True, 5 * 16),
    (64, 64, 12, False, 9 * 16),
    (64, 64, 12, True, 10 * 16),
    # 2:1 (w = 2h), 32x64. One piece: scaled to 8x16 = 2 x 4 = 8. max 4/6: 2x1 exactly; max 12: 4x2 ties
    # and 2048 > 0.5*256*8 takes it
    (32, 64, 1, False, 8),
    (32, 64, 4, False, 2 * 16),
    (32, 64, 4, True, 3 * 16),
    (32, 64, 6, True, 3 * 16),
    (32, 64, 12, False, 8 * 16),
    (32, 64, 12, True, 9 * 16),
    # 1:3 (h = 3w), 48x16. One piece: scaled to 16 x 5.33 -> 16x5 -> 16x4 = 4 x 1 = 4. max 4/6/12: 1x3
    # exactly (2x6 ties at max 12 but 768 < 0.5*256*12 keeps 1x3)
    (48, 16, 1, False, 4),
    (48, 16, 4, False, 3 * 16),
    (48, 16, 4, True, 4 * 16),
    (48, 16, 6, False, 3 * 16),
    (48, 16, 12, True, 4 * 16),
    # a tiny image (not larger than the image size) is never tiled: 5x3 -> one 4x4 piece = 1 token
    (5, 3, 1, False, 1),
    (5, 3, 12, True, 1),
    # a little over the image size, square: 2x2 ties but 20*20 = 400 < 512 keeps one piece (16x16)
    (20, 20, 4, True, 16),
]


@pytest.mark.parametrize("h,w,max_tiles,thumb,tokens", HAND)
def test_tokens_by_hand(h, w, max_tiles, thumb, tokens):
    g = ImageGeometry(**TINY, max_tiles=max_tiles, thumbnail=thumb)
    assert g.tokens(h, w) == tokens


def test_downsample_divides_every_tile():
    # tiny-swiglu: patch 4, pixel shuffle 2 -> a 16 px tile is (16/4)^2 / 2^2 = 4 tokens
    enc = PRESETS["tiny-swiglu"].encoder
    g = ImageGeometry.of(enc, max_tiles=4, thumbnail=True)
    assert g.tokens(64, 64) == 5 * 4 and g.tokens(32, 64) == 3 * 4 and g.max_tokens == 5 * 4
    assert g.tile_tokens == enc.tokens_per_image == 4


def _internvl_grid(w: int, h: int, image_size: int, max_num: int) -> tuple[int, int]:
    """InternVL's dynamic_preprocess grid choice as its repository writes it (floats, a set sorted by tile
    count): https://github.com/OpenGVLab/InternVL internvl_chat/internvl/train/dataset.py."""
    aspect_ratio = w / h
    target_ratios = {
        (i, j)
        for n in range(1, max_num + 1)
        for i in range(1, n + 1)
        for j in range(1, n + 1)
        if 1 <= i * j <= max_num
    }
    best_ratio_diff, best_ratio, area = float("inf"), (1, 1), w * h
    for ratio in sorted(target_ratios, key=lambda x: x[0] * x[1]):
        ratio_diff = abs(aspect_ratio - ratio[0] / ratio[1])
        if ratio_diff < best_ratio_diff:
            best_ratio_diff, best_ratio = ratio_diff, ratio
        elif ratio_diff == best_ratio_diff and area > 0.5 * image_size * image_size * ratio[0] * ratio[1]:
            best_ratio = ratio
    return best_ratio


def test_grid_is_internvls_choice():
    sizes = range(17, 300, 13)
    checked = 0
    for m in (2, 4, 6, 9, 12):
        for h in sizes:
            for w in sizes:
                assert closest_grid(h, w, 16, m) == _internvl_grid(w, h, 16, m), (h, w, m)
                checked += 1
    assert checked > 2000


def _png(h: int, w: int) -> bytes:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(h * 1000 + w)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def _standardized(im):
    import numpy as np
    import torch

    from mimo_jobs.model.families import vision

    px = vision("clip").pixels  # TINY's geometry is a CLIP encoder's
    x = torch.from_numpy(np.asarray(im, dtype=np.float32) / 255.0).permute(2, 0, 1)
    return (x - torch.tensor(px.mean).view(3, 1, 1)) / torch.tensor(px.std).view(3, 1, 1)


def test_tiles_are_crops_of_the_resized_image_then_the_thumbnail():
    import torch
    from PIL import Image

    data = _png(24, 40)  # aspect 5:3 -> 2x1 at max 4 (distance 1/3 against 1x1's 2/3)
    g = ImageGeometry(**TINY, max_tiles=4, thumbnail=True)
    x = decode(data, g)
    assert tuple(x.shape) == (3, 3, 16, 16) and g.tokens_of_decoded(tuple(x.shape)) == g.tokens(24, 40) == 48
    with Image.open(io.BytesIO(data)) as im:
        im = im.convert("RGB")
        whole = im.resize((32, 16), Image.BILINEAR)
        want = [whole.crop((0, 0, 16, 16)), whole.crop((16, 0, 32, 16)), im.resize((16, 16), Image.BILINEAR)]
    for k, ref in enumerate(want):
        assert torch.allclose(x[k], _standardized(ref), atol=1e-6), k
    # no thumbnail: the crops only; an untiled image stays [C, H, W] (its one-piece size)
    assert tuple(decode(data, ImageGeometry(**TINY, max_tiles=4)).shape) == (2, 3, 16, 16)
    assert tuple(decode(data, ImageGeometry(**TINY)).shape) == (3, 8, 16)
    # the encoder's samples: tiles in order, text-only entries dropped, several images in turn
    one = torch.zeros(3, 8, 8)
    flat = flatten([None, x, one, [one, x]])
    assert len(flat) == 3 + 1 + 1 + 3 and flat[1] is not None and torch.equal(flat[2], x[2])


# ---------------------------------------------------------------- a real dataset of large images

# tiny preset, max_tiles 4 + thumbnail: (h, w) -> tokens by hand (the HAND rules above)
SIZES = {(16, 32): 3 * 16, (48, 16): 4 * 16, (8, 8): 4, (24, 24): 5 * 16}


@pytest.fixture(scope="module")
def large_images(tmp_path_factory):
    from mimo_jobs.data.synth import SynthConfig, synth

    cfg = SynthConfig(
        samples=48, text_only_fraction=0.25, image_sizes=tuple(SIZES), samples_per_shard=16, seed=3
    )
    root = tmp_path_factory.mktemp("tiles")
    with contextlib.redirect_stdout(io.StringIO()):
        res = synth(root / "ds", cfg)
    recorded = json.loads((res.root / "synth.json").read_text())["image_sizes_by_key"]
    return res, recorded


def _expected_tokens(recorded: dict, key: str) -> int:
    return sum(SIZES[tuple(hw)] for hw in recorded[key])


def test_provider_cuts_tiles_and_counts_their_tokens(large_images):
    from mimo_jobs.data.energon_provider import EnergonProvider, LoaderConfig

    res, recorded = large_images
    cfg = LoaderConfig(
        path=str(res.blend),
        llm_dp=1,
        mbs=8,
        num_microbatches=1,
        seq_length=128,
        geometry=ImageGeometry(**TINY, max_tiles=4, thumbnail=True),
        vocab_size=128,
    )
    p = EnergonProvider(cfg, [0], need_images=True)
    try:
        batches = [p.next(0) for _ in range(3)]
    finally:
        p.close()
    seen_tiled = 0
    for b in batches:
        for i, key in enumerate(b.sample_keys):
            n = _expected_tokens(recorded, key)
            assert b.counts("vision")[i] == n == int((b.tokens[i] == p.image_token_id).sum()), key
            im = b.inputs["vision"].items[i]
            if n == 0:
                assert im is None
                continue
            pieces = flatten([im])
            assert sum(t.shape[-2] * t.shape[-1] // 16 for t in pieces) == n, key
            seen_tiled += len(pieces) > 1
    assert seen_tiled, "the batches held tiled images"


def test_data_stats_counts_tiles_as_the_generator_recorded(large_images):
    from mimo_jobs.data.scan import scan
    from mimo_jobs.data.stats import summarize

    res, recorded = large_images
    tiles = {(16, 32): 3, (48, 16): 4, (8, 8): 1, (24, 24): 5}  # by hand, as SIZES
    g = ImageGeometry(**TINY, max_tiles=4, thumbnail=True)
    for part in (res.caps, res.text):
        stats, skipped = scan(str(part), g, 128, None)
        assert skipped == 0 and {s.key for s in stats} == {
            k for k in recorded if k[:3] == {"caps": "cap", "text": "txt"}[part.name]
        }
        for s in stats:
            sizes = [tuple(hw) for hw in recorded[s.key]]
            assert (s.images, s.image_tokens) == (len(sizes), sum(SIZES[hw] for hw in sizes)), s.key
            assert s.tiles == sum(tiles[hw] for hw in sizes), s.key
    caps = scan(str(res.caps), g, 128, None)[0]
    doc = summarize(caps, seq_length=128)
    n = sum(s.image_tokens for s in caps)
    # E[n^2]/E[n] over encoder samples: a tiled image's tiles are 16 tokens each, an 8x8 image is one of 4
    sq = sum(
        16 * SIZES[hw] if tiles[hw] > 1 else SIZES[hw] ** 2
        for s in caps
        for hw in map(tuple, recorded[s.key])
    )
    assert doc["tokens_per_tile"] == pytest.approx(sq / n)
    assert doc["image_tokens"]["max"] == 80 and doc["tiles"]["max"] == 5


# ---------------------------------------------------------------- the trainer on tiles

ITERS = 2


def _run(root: Path, blend: Path, enc_dp: int, llm_dp: int):
    from mimo_jobs.contract.rundir import RunDir
    from mimo_jobs.study.expand import runs_of
    from mimo_jobs.study.load import parse_study
    from mimo_jobs.study.runspec import run_yaml_doc

    world = enc_dp + llm_dp
    study = parse_study(
        {
            "name": "tiling",
            "cluster": {"executor": "local", "accelerator": "cpu", "gpus_per_node": world},
            "trainer": {
                "model": "tiny",
                "seq_length": 128,
                "train_iters": ITERS,
                "seed": 11,
                "lr": {"schedule": "constant", "max": 1e-3},
                "data": {"provider": "energon", "path": str(blend), "max_tiles": 4, "thumbnail": True},
            },
            "matrix": {"points": [{"nodes": 1, "encoder": {"dp": enc_dp}, "llm": {"dp": llm_dp}, "gbs": 4}]},
        },
        env={},
    )
    (spec,) = runs_of(study)
    rd = RunDir.of(root / "runs", spec.study, spec.name, spec.run_id)
    rd.root.mkdir(parents=True, exist_ok=True)
    rd.run_yaml.write_text(yaml.safe_dump(run_yaml_doc(spec, rd.root, provenance={}), sort_keys=False))
    return spec, rd


def _trainer(args: list[str], nproc: int = 0) -> None:
    env = worker_env()
    cmd = trainer(args[0], *args[1:], "--quiet", nproc=nproc)
    r = subprocess.run(cmd, check=False, env=env, capture_output=True, text=True, timeout=500)
    assert r.returncode == 0, r.stderr[-4000:]


def _iterations(path: Path) -> dict[int, dict]:
    return {
        r["iteration"]: r for r in map(json.loads, path.read_text().splitlines()) if r["kind"] == "iteration"
    }


def _drawn_image_tokens(spec, recorded) -> dict[int, int]:
    """Per iteration, the image tokens of the samples the lanes draw, counted by hand from their sizes."""
    from mimo_jobs.data.energon_provider import make_energon_provider

    plan = spec.rank_layout()
    lanes = list(range(plan.layout.llm_dp))
    p = make_energon_provider(spec, plan, lanes, False, True)
    try:
        return {
            it: sum(
                _expected_tokens(recorded, k)
                for _ in range(plan.num_microbatches)
                for lane in lanes
                for k in p.next(lane).sample_keys
            )
            for it in range(1, ITERS + 1)
        }
    finally:
        p.close()


def test_one_process_training_step_on_tiles(large_images, tmp_path):
    res, recorded = large_images
    spec, rd = _run(tmp_path, res.blend, 1, 2)
    _trainer([str(rd.run_yaml), "--reference"])
    r = _iterations(rd.root / "metrics.reference.jsonl")
    want = _drawn_image_tokens(spec, recorded)
    assert {it: r[it]["extras"]["image_tokens"] for it in r} == want
    assert all(rec["loss"] > 0 for rec in r.values()) and any(want.values())


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_tiles_across_the_bridge_match_the_one_process_reference(large_images, tmp_path):
    res, _ = large_images
    _, rd = _run(tmp_path, res.blend, 1, 2)
    _trainer([str(rd.run_yaml)], nproc=3)
    _trainer([str(rd.run_yaml), "--reference"])
    h, r = _iterations(rd.metrics), _iterations(rd.root / "metrics.reference.jsonl")
    assert sorted(h) == sorted(r) == list(range(1, ITERS + 1))
    for it in h:
        assert h[it]["loss"] == pytest.approx(r[it]["loss"], rel=1e-5, abs=1e-6)
        assert h[it]["grad_norm"] == pytest.approx(r[it]["grad_norm"], rel=1e-4, abs=1e-6)
        assert h[it]["extras"]["image_tokens"] == r[it]["extras"]["image_tokens"] > 0

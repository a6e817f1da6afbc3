"""Sequence packing: the packer's choices (pure), packed rows from the real loader against the same samples
unpacked (token by token), and the trainer's models computing on packed rows exactly what they compute on
the samples one per row (summed loss and every gradient, fp32, one process) while a mask that lets
attention cross the samples does not."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from helpers.launch import worker_env
from mimo_jobs.data.batch import IGNORE_INDEX
from mimo_jobs.data.energon_provider import EnergonProvider, LoaderConfig
from mimo_jobs.data.images import ImageGeometry
from mimo_jobs.data.packing import PAD_SEGMENT, efficiency, row_layout, select_packs

SEQ = 64
GEOM = ImageGeometry(patch_size=4, image_size=16)


# ------------------------------------------------------------------ the packer (pure)


def test_first_fit_in_stream_order():
    assert select_packs([30, 40, 20, 30, 10, 64], 64) == [[0, 2, 4], [1], [3], [5]]
    # every index once, no pack over capacity, stream order within packs
    lengths = [(7 * i) % 23 + 1 for i in range(50)]
    packs = select_packs(lengths, 32)
    assert sorted(i for p in packs for i in p) == list(range(50))
    assert all(sum(lengths[i] for i in p) <= 32 and p == sorted(p) for p in packs)
    assert efficiency(lengths, packs, 32) == sum(lengths) / (32 * len(packs))


def test_a_sample_longer_than_the_row_is_refused():
    with pytest.raises(ValueError, match="sample 1 has 65 tokens; a packed row holds 1..64"):
        select_packs([3, 65], 64)


def test_row_layout_restarts_positions_per_sample():
    lay = row_layout([3, 2], 8)
    assert lay.segments == [0, 0, 0, 1, 1, PAD_SEGMENT, PAD_SEGMENT, PAD_SEGMENT]
    assert lay.positions == [0, 1, 2, 0, 1, 0, 1, 2]
    with pytest.raises(ValueError, match="do not fit a row of 4"):
        row_layout([3, 2], 4)


def test_packed_mask_is_block_diagonal_causal():
    from mimo_jobs.trainer.model.packed import packed_mask

    seg = torch.tensor([[0, 0, 1, 1, 1, -1]])
    allowed = ~packed_mask(seg)[0, 0]
    want = torch.zeros(6, 6, dtype=torch.bool)
    for q in range(6):
        for k in range(q + 1):
            want[q, k] = seg[0, q] == seg[0, k]
    assert torch.equal(allowed, want)


# ------------------------------------------------------------------ packed rows from the real loader


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    from mimo_jobs.data.synth import SynthConfig, synth

    root = tmp_path_factory.mktemp("packing")
    with contextlib.redirect_stdout(io.StringIO()):
        res = synth(
            root / "ds",
            SynthConfig(
                samples=64,
                text_only_fraction=0.25,
                image_sizes=((8, 8), (12, 12), (16, 8)),
                samples_per_shard=16,
                seed=11,
            ),
        )
    return root, res.blend


def _cfg(blend, **kw) -> LoaderConfig:
    base = dict(
        path=str(blend), llm_dp=1, mbs=1, num_microbatches=1, seq_length=SEQ, geometry=GEOM, vocab_size=128
    )
    return LoaderConfig(**{**base, **kw})


def test_packed_rows_hold_the_unpacked_samples_token_by_token(dataset):
    _, blend = dataset
    k = 12
    unpacked = EnergonProvider(_cfg(blend, mbs=k), [0], need_images=True)
    packed = EnergonProvider(_cfg(blend, mbs=2, packing=True, packing_buffer_size=k), [0], need_images=True)
    try:
        one = unpacked.next(0)
        pad = unpacked.tokenizer.pad_id
        by_key = {key: i for i, key in enumerate(one.sample_keys)}
        seen: list[str] = []
        while len(seen) < k:
            b = packed.next(0)
            assert b.segment_ids is not None and b.segment_ids.shape == b.tokens.shape
            for r, joined in enumerate(b.sample_keys):
                a = 0
                images = (
                    b.inputs["vision"].items[r]
                    if isinstance(b.inputs["vision"].items[r], list)
                    else [b.inputs["vision"].items[r]]
                )
                images = [im for im in images if im is not None]
                n_images = 0
                for s, key in enumerate(joined.split("+")):
                    i = by_key[key]
                    n = int((b.segment_ids[r] == s).sum())
                    assert one.tokens[i, n - 1] != pad and (one.tokens[i, n:] == pad).all(), key
                    sl = slice(a, a + n)
                    assert torch.equal(b.tokens[r, sl], one.tokens[i, :n]), key
                    assert torch.equal(b.labels[r, sl], one.labels[i, :n]), key
                    assert torch.equal(b.loss_mask[r, sl], one.loss_mask[i, :n]), key
                    assert b.position_ids[r, sl].tolist() == list(range(n)), key
                    assert b.segment_ids[r, sl].tolist() == [s] * n, key
                    if one.counts("vision")[i]:  # this sample's image, in the row's order
                        assert torch.equal(images[n_images], one.inputs["vision"].items[i]), key
                        n_images += 1
                    a += n
                    seen.append(key)
                assert n_images == len(images)
                assert (b.segment_ids[r, a:] == PAD_SEGMENT).all() and (b.tokens[r, a:] == pad).all()
                assert (b.labels[r, a:] == IGNORE_INDEX).all()
                assert a <= SEQ
                assert b.counts("vision")[r] == int((b.tokens[r] == packed.image_token_id).sum())
        assert seen == one.sample_keys  # every sample of the buffer exactly once, in stream order
    finally:
        unpacked.close()
        packed.close()


# ------------------------------------------------------------------ the trainer on packed rows: exact


def _run_yaml(root: Path, blend: Path) -> Path:
    from mimo_jobs.contract.rundir import RunDir
    from mimo_jobs.study.expand import runs_of
    from mimo_jobs.study.load import parse_study
    from mimo_jobs.study.runspec import run_yaml_doc

    study = parse_study(
        {
            "name": "packing-exact",
            "cluster": {"executor": "local", "accelerator": "cpu", "gpus_per_node": 2},
            "trainer": {
                "model": "tiny",
                "seq_length": SEQ,
                "train_iters": 1,
                "seed": 1234,
                "data": {"provider": "energon", "path": str(blend), "packing": True},
            },
            "matrix": {"points": [{"nodes": 1, "encoder": {"dp": 1}, "llm": {"dp": 1}, "gbs": 1, "mbs": 1}]},
        },
        env={},
    )
    (spec,) = runs_of(study)
    rd = RunDir.of(root / "runs", spec.study, spec.name, spec.run_id)
    rd.root.mkdir(parents=True, exist_ok=True)
    rd.run_yaml.write_text(yaml.safe_dump(run_yaml_doc(spec, rd.root, provenance={}), sort_keys=False))
    return rd.run_yaml


# fp32 sums over differently shaped matmuls and softmaxes round differently (seen: loss 2e-8, gradients
# 7e-7 relative); attention across the samples moves them by 1e-3 and 0.6
LOSS_TOL, GRAD_TOL = 1e-6, 1e-5


@pytest.mark.slow  # importing megatron-core in a fresh process dominates its time
def test_packed_and_unpacked_give_the_same_loss_and_gradients(dataset, tmp_path):
    root, blend = dataset
    out = tmp_path / "packing.json"
    env = worker_env()
    worker = Path(__file__).with_name("packing_worker.py")
    proc = subprocess.run(
        [sys.executable, str(worker), str(_run_yaml(tmp_path, blend)), str(out), "12"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    r = json.loads(out.read_text())
    assert r["rows"] < r["samples"] and r["image_tokens"] > 0  # several samples per row, images among them
    assert r["packed_loss_tokens"] == r["loss_tokens"]
    ref = r["unpacked"]["loss"]
    assert r["packed"]["loss"] == pytest.approx(ref, rel=LOSS_TOL)
    worst = r["packed"]["worst"]
    assert r["packed"]["grad_rel"][worst] < GRAD_TOL, (worst, r["packed"]["grad_rel"][worst])
    assert len(r["packed"]["grad_rel"]) > 10 and not r["packed"]["grad_zero"]
    # attention (and RoPE positions) crossing the samples: loss and gradients move far beyond rounding
    for leak in ("leaky", "mask_leak"):
        assert abs(r[leak]["loss"] - ref) > 100 * LOSS_TOL * abs(ref), leak
        assert r[leak]["grad_rel"][r[leak]["worst"]] > 100 * GRAD_TOL, leak


def test_packing_is_refused_where_the_attention_ignores_the_mask():
    from mimo_jobs.trainer.model.kernels import Installed, kernels_for
    from mimo_jobs.trainer.model.packed import packing_problem

    assert packing_problem(kernels_for(False, Installed())) is None
    te = packing_problem(kernels_for(True, Installed(te=True)))
    assert "Transformer Engine" in te and "PackedSeqParams" in te
    fused = packing_problem(kernels_for(True, Installed(softmax_ext=True), "unfused"))
    assert "fused causal softmax" in fused and "trainer.attention: sdpa" in fused
    assert packing_problem(kernels_for(True, Installed(), "unfused")) is None  # local layers, unfused softmax
    # torch's SDPA takes the mask whatever softmax kernels are installed
    assert packing_problem(kernels_for(True, Installed(softmax_ext=True))) is None


def test_packing_is_refused_before_the_job_trains():
    """The trainer's preflight (no collective yet) names the kernels that would ignore the mask."""
    from types import SimpleNamespace

    from mimo_jobs.trainer.main import kernel_problem
    from mimo_jobs.trainer.model.kernels import Installed, kernels_for

    def run(packing: bool):
        return SimpleNamespace(trainer=SimpleNamespace(data=SimpleNamespace(packing=packing)))

    te = kernels_for(True, Installed(te=True))
    assert "PackedSeqParams" in kernel_problem(run(True), te)
    assert kernel_problem(run(False), te) is None
    assert kernel_problem(run(True), kernels_for(False, Installed())) is None


def test_packing_needs_energon():
    from mimo_jobs.study.spec import DataSpec

    with pytest.raises(ValueError, match="data.packing needs provider 'energon'"):
        DataSpec(provider="mock", packing=True)
    assert dataclasses.is_dataclass(LoaderConfig)


def test_packed_rows_resume_exactly(dataset):
    """The packing buffer is part of the loader state: a provider restored mid-stream continues with the
    same rows (keys, tokens, positions) as one that never stopped."""
    _, blend = dataset
    cfg = _cfg(blend, mbs=2, packing=True, packing_buffer_size=10)
    a = EnergonProvider(cfg, [0], need_images=False)
    b = EnergonProvider(cfg, [0], need_images=False)
    try:
        for _ in range(3):
            a.next(0)
        state = a.state_dict()
        want = [a.next(0) for _ in range(4)]
        b.load_state_dict(state)
        got = [b.next(0) for _ in range(4)]
        for w, g in zip(want, got):
            assert g.sample_keys == w.sample_keys
            assert torch.equal(g.tokens, w.tokens) and torch.equal(g.position_ids, w.position_ids)
            assert torch.equal(g.segment_ids, w.segment_ids) and torch.equal(g.labels, w.labels)
        assert any("+" in k for w in want for k in w.sample_keys)
    finally:
        a.close()
        b.close()

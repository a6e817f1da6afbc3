"""Checkpoints that move between layouts (trainer/checkpoint/reshard.py), through the real trainer under
torchrun: a source run trains 4 iterations; runs of other layouts start from its iteration-2 checkpoint
(trainer.init.checkpoint) and must log the source's iterations 3 and 4 (losses within 1e-5): the weights, the
Adam moments, the step count, the LR schedule position and the data position all carried over.

One source run (heterogeneous, MoE with EP=2, encoder DP=2, distributed optimizer) feeds every target, so
the number of processes stays small:
  colocated DP=2 EP=1, non-distributed optimizer      (EP2->EP1, heterogeneous->colocated)
  heterogeneous LLM PP=2 EP=1, encoder TP=2 DP=1      (PP1->PP2, TP1->TP2, encoder DP2->DP1, split changed)
  colocated LLM TP=2 EP=1 (experts whole on each TP rank, reduced over the expert-DP group)  (LLM TP1->TP2)
A dense LLM with a gated MLP has its own one-process source and moves to TP=2 (2 processes).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch
import yaml

from helpers import checkpoint as H
from helpers.launch import trainer
from mimo_jobs.contract.manifest import CheckpointError, resolve_source
from mimo_jobs.trainer.checkpoint.reshard import Cut

SOURCE = {
    "enc_dp": 2,
    "llm_dp": 2,
    "llm_ep": 2,
    "model": "tiny-moe",
    "gbs": 4,
    "iters": 4,
    "save_interval": 2,
    "keep": 5,
    "distopt": True,
}
TOL = 1e-5


def with_init(run_yaml: Path, source: Path, weights_only: bool = False) -> Path:
    """The rendered run.yaml with trainer.init.checkpoint set (the field the study file would carry)."""
    doc = yaml.safe_load(run_yaml.read_text())
    doc["run"]["trainer"]["init"] = {"checkpoint": str(source), "weights_only": weights_only}
    run_yaml.write_text(yaml.safe_dump(doc, sort_keys=False))
    return run_yaml


def run_ok(run_yaml: Path) -> subprocess.CompletedProcess:
    r = H.launch(run_yaml, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    return r


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    y = H.make_run(tmp_path_factory.mktemp("source"), name="src", **SOURCE)
    run_ok(y)
    assert sorted(H.curve(y)) == [1, 2, 3, 4]
    return y


def assert_continues(target: Path, source: Path) -> None:
    want, got = H.curve(source), H.curve(target)
    assert sorted(got) == [3, 4], got
    for it in (3, 4):
        loss, gnorm, lr, consumed = got[it]
        w_loss, w_gnorm, w_lr, w_consumed = want[it]
        assert abs(loss - w_loss) <= TOL, (it, loss, w_loss)
        assert abs(gnorm - w_gnorm) <= TOL * max(1.0, w_gnorm), (it, gnorm, w_gnorm)
        assert (lr, consumed) == (w_lr, w_consumed)


@pytest.mark.slow
def test_colocated_ep1_continues_the_source(source, tmp_path):
    y = H.make_run(
        tmp_path, name="colo", llm_dp=2, enc_dp=0, model="tiny-moe", gbs=4, iters=4, colocated=True
    )
    r = run_ok(with_init(y, H.ckpt_dir(source) / "iter_0000002"))
    assert "started from checkpoint" in r.stdout and "iteration 2, 8 samples" in r.stdout
    assert_continues(y, source)


@pytest.mark.slow
def test_pp2_encoder_tp2_dp1_continues_the_source(source, tmp_path):
    y = H.make_run(
        tmp_path,
        name="pp",
        llm_pp=2,
        llm_dp=1,
        enc_tp=2,
        enc_dp=1,
        model="tiny-moe",
        gbs=4,
        iters=4,
        distopt=True,
    )
    run_ok(with_init(y, H.ckpt_dir(source) / "iter_0000002"))
    assert_continues(y, source)


@pytest.mark.slow
def test_llm_tp2_continues_the_source(source, tmp_path):
    # LLM TP=2 with EP=1 and expert TP 1: the dense tensors (QKV, projections, embeddings, output layer)
    # split over TP, the experts whole on both TP ranks and reduced over the expert-DP group, so the expert
    # optimizer's DP shards move from the source's EP ranks onto the TP ranks (colocated: 2 processes)
    y = H.make_run(
        tmp_path,
        name="tp",
        llm_tp=2,
        llm_dp=1,
        enc_dp=0,
        model="tiny-moe",
        gbs=4,
        iters=4,
        distopt=True,
        colocated=True,
    )
    run_ok(with_init(y, H.ckpt_dir(source) / "iter_0000002"))
    assert_continues(y, source)


@pytest.mark.slow
def test_dense_gated_llm_tp1_to_tp2(tmp_path):
    # a dense LLM with a gated MLP (its [gate; up] halves cut in strided blocks), GQA and QK-norm: its own
    # one-process source, then colocated TP=2 from the source's iteration-2 checkpoint
    common = dict(
        enc_dp=0,
        llm_dp=1,
        model="tiny-swiglu",
        gbs=2,
        iters=4,
        colocated=True,
        data={"provider": "mock", "image_sizes": [8, 16]},
    )
    src = H.make_run(tmp_path / "s", name="dsrc", keep=5, **common)
    run_ok(src)
    y = H.make_run(tmp_path / "t", name="dtp", llm_tp=2, **common)
    run_ok(with_init(y, H.ckpt_dir(src) / "iter_0000002"))
    assert_continues(y, src)


@pytest.mark.slow
def test_weights_only_restarts_iterations_and_optimizer(source, tmp_path):
    y = H.make_run(tmp_path, name="wo", llm_dp=1, enc_dp=1, model="tiny-moe", gbs=4, iters=2, colocated=True)
    r = run_ok(with_init(y, H.ckpt_dir(source), weights_only=True))  # the directory: its latest (iteration 4)
    assert "weights only" in r.stdout
    got, src = H.curve(y), H.curve(source)
    assert sorted(got) == [1, 2]
    assert got[1][2] == 0.0 and got[1][3] == 4  # the LR warmup starts again; the data from its first sample
    assert got[1][0] != src[1][0]  # the same first batch, the source's trained weights
    part = torch.load(H.ckpt_dir(y) / "iter_0000002" / "language" / "optim-00000.pt", weights_only=False)
    assert part["step"] == 2.0  # a fresh optimizer stepped twice (the source's had 4 steps)


@pytest.mark.slow  # ~25 s on a busy 2-core machine: the trainer's imports
def test_unfinished_save_is_refused_before_any_collective(tmp_path):
    y = H.make_run(tmp_path / "t", llm_dp=1, enc_dp=1, gbs=2, iters=2, colocated=True)
    unfinished = tmp_path / "src" / "checkpoints" / "iter_0000002.tmp"
    unfinished.mkdir(parents=True)
    with_init(y, unfinished)
    env = H.trainer_env({"WORLD_SIZE": "1"})
    r = subprocess.run(
        trainer(y, "--quiet"),
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr[-2000:]
    assert f"trainer.init.checkpoint: {unfinished}: an unfinished save" in r.stderr
    assert not H.ckpt_dir(y).exists()  # nothing written


def _checkpoint(d: Path, files: dict[str, bytes]) -> Path:
    import json

    d.mkdir(parents=True)
    for rel, data in files.items():
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_bytes(data)
    prov = {"run_id": "r", "study": "s", "run_name": "n", "layout": {}, "world": 1}
    manifest = {
        "format": 1,
        "iteration": 2,
        "consumed_samples": 4,
        "provenance": prov,
        "files": {k: len(v) for k, v in files.items()},
    }
    (d / "manifest.json").write_text(json.dumps(manifest))
    return d


def test_resolve_source_names_what_is_wrong(tmp_path):
    root = tmp_path / "checkpoints"
    root.mkdir()
    with pytest.raises(CheckpointError, match="no complete checkpoint"):
        resolve_source(root)
    (root / "iter_0000004").mkdir()  # a save that never wrote its manifest
    with pytest.raises(CheckpointError, match=r"iter_0000004: unfinished saves, without manifest.json"):
        resolve_source(root)
    with pytest.raises(CheckpointError, match="no manifest.json"):
        resolve_source(root / "iter_0000004")
    good = _checkpoint(
        root / "iter_0000002", {"rank/rank-00000.pt": b"abcd", "language/model-00000.pt": b"xy"}
    )
    assert resolve_source(root).path == good and resolve_source(good).iteration == 2
    (good / "language" / "model-00000.pt").write_bytes(b"x")
    with pytest.raises(CheckpointError, match=r"model-00000.pt: 1 bytes, .*manifest.json says 2 \(truncated"):
        resolve_source(root)
    (good / "language" / "model-00000.pt").write_bytes(b"xy")
    os.remove(good / "rank" / "rank-00000.pt")
    with pytest.raises(CheckpointError, match=r"rank-00000.pt: missing"):
        resolve_source(good)


@pytest.mark.parametrize("dim,size,parts", [(0, 2, 1), (1, 4, 1), (0, 2, 2), (0, 1, 1), (None, 1, 1)])
def test_cut_take_put_round_trip(dim, size, parts):
    full = torch.arange(8 * 8, dtype=torch.float32).reshape(8, 8)
    rebuilt = torch.full_like(full, -1.0)
    for r in range(size):
        c = Cut((8, 8), dim, r, size, parts)
        local = c.take(full)
        assert tuple(local.shape) == c.local_shape()
        c.put(rebuilt, local)
    assert torch.equal(rebuilt, full)
    if dim == 0 and parts == 2:  # a gated MLP's [gate; up]: rank 1 holds the 2nd quarter of each half
        assert torch.equal(Cut((8, 8), 0, 1, 2, 2).take(full), torch.cat([full[2:4], full[6:8]]))

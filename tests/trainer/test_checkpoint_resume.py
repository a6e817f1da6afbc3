"""Exact resume of the real trainer (torchrun, gloo, real megatron-core modules) after kill -9, a crash in
the middle of a save, and a SIGUSR2 preemption; refusal of another layout's checkpoint.

The yardstick is always an independent straight run of the same run.yaml: every logged iteration of every
attempt (loss, grad norm, lr, consumed samples) must equal the straight run's, bit for bit (JSON floats
round-trip exactly).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import signal
import time
from pathlib import Path

import pytest

from helpers import checkpoint as H
from mimo_jobs.contract.manifest import latest_checkpoint
from mimo_jobs.contract.requeue import REQUEUE_MARKER
from mimo_jobs.trainer.signals import read_requeue_marker

pytestmark = pytest.mark.slow

# fan-out: 1 encoder rank serves 2 LLM lanes (world 3); MoE LLM with its 4 experts split over EP=2 (each LLM
# rank holds different experts); mock provider; non-distributed optimizer
FAN_OUT = {
    "enc_dp": 1,
    "llm_dp": 2,
    "llm_ep": 2,
    "model": "tiny-moe",
    "gbs": 4,
    "iters": 8,
    "save_interval": 2,
    "keep": 2,
}


def all_records(run_yaml: Path) -> dict[int, list[tuple]]:
    out: dict[int, list[tuple]] = {}
    for r in H.metrics(run_yaml):
        if r.get("kind") == "iteration":
            out.setdefault(r["iteration"], []).append(
                (r["loss"], r["grad_norm"], r["lr"], r["consumed_samples"])
            )
    return out


def assert_same_as_straight(run_yaml: Path, straight: Path) -> None:
    want = H.curve(straight)
    got = all_records(run_yaml)
    assert sorted(got) == sorted(want)
    for it, recs in got.items():
        for rec in recs:  # every attempt that ran this iteration got the straight run's figures
            assert rec == want[it], f"iteration {it}: {rec} != straight {want[it]}"


def run_ok(run_yaml: Path, **kw):
    r = H.launch(run_yaml, **kw)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    return r


@pytest.fixture(scope="module")
def straight_fanout(tmp_path_factory):
    y = H.make_run(tmp_path_factory.mktemp("straight"), **FAN_OUT)
    run_ok(y)
    assert sorted(H.curve(y)) == list(range(1, 9))
    return y


def test_straight_run_keeps_k_sharded_checkpoints(straight_fanout):
    d = H.ckpt_dir(straight_fanout)
    assert sorted(p.name for p in d.iterdir()) == ["iter_0000006", "iter_0000008", "latest"]
    info = latest_checkpoint(d)
    assert (info.iteration, info.consumed_samples, info.world) == (8, 32, 3)
    assert info.git_sha == "0" * 40 and info.layout["llm_dp"] == 2
    # every rank wrote its own state; replicated dense weights only by DP rank 0 (encoder rank 0, LLM rank 1);
    # expert weights by each expert-DP rank 0 (EP=2 over 2 LLM ranks: both hold different experts)
    assert sorted(info.files) == [
        "encoder/model-00000.pt",
        "encoder/optim-00000.pt",
        "language/experts-00001.pt",
        "language/experts-00002.pt",
        "language/model-00001.pt",
        "language/optim-00001.pt",
        "language/optim-00002.pt",
        "rank/rank-00000.pt",
        "rank/rank-00001.pt",
        "rank/rank-00002.pt",
    ]
    assert (info.path / "run.yaml").read_text() == straight_fanout.read_text()


def test_crash_mid_save_then_kill9_then_resume_is_exact(straight_fanout, tmp_path):
    y = H.make_run(tmp_path, **FAN_OUT)
    d = H.ckpt_dir(y)
    # 1. the whole job is SIGKILLed while rank 0 finishes the save of iteration 4 (all parts written)
    r = H.launch(y, env={"MIMO_CKPT_CRASH": "before_rename:0:4"})
    assert r.returncode != 0
    assert latest_checkpoint(d).iteration == 2
    assert (d / "iter_0000004.tmp" / "manifest.json").is_file() and not (d / "iter_0000004").exists()
    # 2. resumes from 2; every rank is SIGKILLed right after iteration 5 (checkpoint 4 written meanwhile)
    r = H.launch(y, env={"MIMO_CKPT_KILL_AFTER_ITER": "5"})
    assert r.returncode != 0 and "exitcode  : -9" in r.stderr
    assert f"resumed from checkpoint {d / 'iter_0000002'} (iteration 2, 8 samples)" in r.stdout
    assert latest_checkpoint(d).iteration == 4 and not (d / "iter_0000004.tmp").exists()
    # 3. resumes from 4 and completes
    r = run_ok(y)
    assert f"resumed from checkpoint {d / 'iter_0000004'} (iteration 4, 16 samples)" in r.stdout
    assert f"saved checkpoint {d / 'iter_0000008'} (iteration 8, 32 samples" in r.stdout
    assert_same_as_straight(y, straight_fanout)
    assert [len(v) for _, v in sorted(all_records(y).items())] == [1, 1, 2, 2, 2, 1, 1, 1]
    assert H.ends(y) == ["completed"]


def test_sigusr2_on_one_rank_checkpoints_and_requeues(straight_fanout, tmp_path):
    y = H.make_run(tmp_path, **{**FAN_OUT, "save_interval": None})
    d = H.ckpt_dir(y)
    proc = H.start(y, env={"MIMO_CKPT_TEST_STEP_DELAY_S": "1.0"}, log=tmp_path / "out.log")
    try:
        deadline = time.time() + 240
        while not any(r.get("kind") == "iteration" for r in H.metrics(y)):
            assert proc.poll() is None and time.time() < deadline, (tmp_path / "out.log").read_text()[-3000:]
            time.sleep(0.2)
        # deliver SIGUSR2 to the worker of rank 1 only: the world must still stop together
        os.kill(H.ranks_of(proc)[1], signal.SIGUSR2)
        proc.wait(timeout=240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    out = (tmp_path / "out.log").read_text()
    # ranks exit with the requeue code; torchrun SIGTERMs the ones still tearing down when the first exits
    # (after the final barrier, so the checkpoint and the marker are complete by then)
    codes = re.findall(r"exitcode\s*:\s*(-?\d+)", out)
    assert "75" in codes and set(codes) <= {"75", "-15"}, out[-3000:]
    marker = read_requeue_marker(d)
    assert marker is not None and marker["reason"] == "signal:SIGUSR2"
    k = marker["iteration"]
    assert 1 <= k < 8
    info = latest_checkpoint(d)
    assert info.iteration == k and sorted(p.name for p in d.iterdir()) == sorted(
        [f"iter_{k:07d}", "latest", REQUEUE_MARKER]
    )
    assert H.ends(y) == ["requeue: signal:SIGUSR2"]
    assert max(H.curve(y)) == k
    # the requeued attempt resumes and finishes exactly like the straight run
    (d / REQUEUE_MARKER).unlink()  # what the launch script does before requeueing
    run_ok(y)
    assert_same_as_straight(y, straight_fanout)


def test_refuses_checkpoint_of_another_layout(straight_fanout, tmp_path):
    d = H.ckpt_dir(straight_fanout)
    before = {p.name: p.stat().st_mtime_ns for p in d.rglob("*")}
    y = H.make_run(
        tmp_path, enc_dp=2, llm_dp=1, mbs=2, gbs=4, iters=8, model="tiny-moe", checkpoint_dir=str(d)
    )
    r = H.launch(y)
    assert r.returncode != 0
    assert "refusing checkpoint" in r.stderr and f"{d / 'iter_0000008'}" in r.stderr
    assert (
        "enc_dp=1 vs now 2" in r.stderr and "llm_dp=2 vs now 1" in r.stderr and "belongs to run" in r.stderr
    )
    assert {p.name: p.stat().st_mtime_ns for p in d.rglob("*")} == before  # nothing written
    assert not any(r.get("kind") == "iteration" for r in H.metrics(y))


@pytest.fixture(scope="module")
def energon_blend(tmp_path_factory):
    from mimo_jobs.data.synth import SynthConfig, synth

    root = tmp_path_factory.mktemp("blend")
    cfg = SynthConfig(
        samples=256,
        text_only_fraction=0.25,
        image_sizes=((8, 8), (12, 12), (16, 8)),
        samples_per_shard=32,
        seed=3,
    )
    with contextlib.redirect_stdout(io.StringIO()):
        synth(root, cfg)
    return root / "blend.yaml"


def test_fan_in_energon_distributed_optimizer_kill9_resume_is_exact(energon_blend, tmp_path):
    # fan-in: 2 encoder replicas feed 1 LLM lane (world 3); energon provider; distributed optimizer
    # (the encoder's optimizer state is sharded over its 2 DP ranks)
    cfg = {
        "enc_dp": 2,
        "llm_dp": 1,
        "mbs": 2,
        "gbs": 4,
        "iters": 6,
        "save_interval": 2,
        "distopt": True,
        "data": {"provider": "energon", "path": str(energon_blend), "truncate_text": True},
    }
    straight = H.make_run(tmp_path / "a", **cfg)
    run_ok(straight)
    y = H.make_run(tmp_path / "b", **cfg)
    r = H.launch(y, env={"MIMO_CKPT_KILL_AFTER_ITER": "3"})
    assert r.returncode != 0
    info = latest_checkpoint(H.ckpt_dir(y))
    assert info.iteration == 2
    # the encoder's optimizer shard is per DP rank; its replicated weights were written once
    assert {"encoder/optim-00000.pt", "encoder/optim-00001.pt", "encoder/model-00000.pt"} <= set(info.files)
    assert "encoder/model-00001.pt" not in info.files
    r = run_ok(y)
    assert "resumed from" in r.stdout
    assert_same_as_straight(y, straight)


def test_near_time_limit_stops_saves_and_requeues(tmp_path):
    # the job's end is 5 s away, less than the 30 s safety margin: stop after the first step, save, requeue
    y = H.make_run(tmp_path, **{**FAN_OUT, "save_interval": None})
    d = H.ckpt_dir(y)
    r = H.launch(y, env={"MIMO_JOB_DEADLINE": f"{time.time() + 5:.0f}"})
    assert r.returncode != 0
    codes = re.findall(r"exitcode\s*:\s*(-?\d+)", r.stderr)
    assert "75" in codes and set(codes) <= {"75", "-15"}, r.stderr[-3000:]
    assert read_requeue_marker(d)["reason"] == "time_limit"
    assert latest_checkpoint(d).iteration == 1 and max(H.curve(y)) == 1
    assert H.ends(y) == ["requeue: time_limit"]

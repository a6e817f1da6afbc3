"""Several trainer ranks sharing one GPU go through benchmarks/gpu/one_gpu_rank.sh (a per-rank NCCL host id,
LOCAL_RANK 0 on every rank). NCCL cannot run here: the wrapper is checked under gloo, launched as the device
script launches it (torchrun --no-python), against the one-process reference."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from helpers import REPO
from helpers.launch import torchrun, worker_env
from helpers.trainer import iterations, make_run_yaml

WRAPPER = REPO / "benchmarks" / "gpu" / "one_gpu_rank.sh"


@pytest.mark.slow
def test_ranks_launched_through_the_one_gpu_wrapper_train_as_the_reference(shared_runs, tmp_path):
    ry = make_run_yaml(tmp_path / "run", gpn=2, gbs=4, enc={"dp": 1}, llm={"dp": 1})
    ref = shared_runs.reference(ry).ok("reference").iterations()
    # the wrapper's python3 is this interpreter; each rank prints the identity the wrapper gave it
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "python3").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (shim / "python3").chmod(0o755)
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import os, sys\n"
        "print('rank', os.environ['RANK'], 'host', os.environ['NCCL_HOSTID'], 'local', os.environ['LOCAL_RANK'],"
        " flush=True)\n"
    )
    env = worker_env(zygote=False)
    env["PATH"] = os.pathsep.join([str(shim), env["PATH"]])
    metrics = tmp_path / "metrics.jsonl"
    cmd = torchrun(2, "--no-python", "bash", WRAPPER, ry, "--metrics", metrics)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-6000:]
    got = iterations(metrics)
    assert [r["iteration"] for r in got] == [1, 2, 3]
    for a, b in zip(ref, got):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5)
    # what the wrapper sets, seen by each rank (the same environment the trainer got)
    ids = subprocess.run(
        torchrun(2, "--no-python", "bash", "-c", f"source <(grep '^export ' {WRAPPER}); python3 {probe}"),
        capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert ids.returncode == 0, ids.stderr[-3000:]
    seen = sorted(line for line in ids.stdout.splitlines() if line.startswith("rank"))
    assert seen == ["rank 0 host mimo-rank-0 local 0", "rank 1 host mimo-rank-1 local 0"]

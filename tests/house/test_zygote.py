"""The tests' preloaded interpreter (helpers/zygote.py) runs the trainer exactly as a fresh interpreter does:
the same metrics bit for bit, the same exit code, the same death by a signal, the caller's working directory
and environment; a process started as anything else than `python -m mimo_jobs.trainer` is not handed over."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from helpers import launch
from helpers.launch import trainer, worker_env
from helpers.trainer import make_run_yaml
from helpers.zygote import trainer_args

pytestmark = pytest.mark.slow  # trainer processes: CI runs it, the fast local default does not


def _run(cmd, zygote: bool, extra=None, cwd=None):
    env = worker_env(extra, zygote=zygote)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=cwd)


def test_the_zygote_is_up_for_slow_tests():
    assert launch.ZYGOTE["socket"], "the session fixture (tests/conftest.py) did not start the zygote"


def test_a_trainer_in_the_zygote_trains_what_a_fresh_interpreter_trains(tmp_path):
    ry = make_run_yaml(tmp_path / "run", gpn=2, gbs=2, colocated=True)
    out = {}
    for name, zygote in (("fresh", False), ("zygote", True)):
        m = tmp_path / f"{name}.jsonl"
        p = _run(trainer(ry, "--reference", "--metrics", str(m)), zygote, cwd=tmp_path)
        assert p.returncode == 0, p.stderr[-3000:]
        assert "iteration        3/" in p.stdout  # its stdout is the caller's
        out[name] = [
            {k: r[k] for k in ("iteration", "loss", "grad_norm", "lr", "tokens")}
            for r in map(json.loads, m.read_text().splitlines())
            if r["kind"] == "iteration"
        ]
    assert out["zygote"] == out["fresh"] and len(out["fresh"]) == 3


def test_exit_codes_and_signals_pass_through(tmp_path):
    missing = tmp_path / "nope.yaml"
    p = _run(trainer(missing, "--reference"), True)
    assert p.returncode == 2 and f"{missing}: no such run.yaml" in p.stderr  # preflight's exit code and line
    ry = make_run_yaml(tmp_path / "run", gpn=2, gbs=2, iters=4, colocated=True, trainer={"save_interval": 2})
    # the checkpoint test hook SIGKILLs every rank after iteration 3: torchrun sees its ranks die by SIGKILL
    p = _run(trainer(ry, nproc=2), True, {"MIMO_CKPT_KILL_AFTER_ITER": "3"})
    assert p.returncode != 0 and "Signal 9 (SIGKILL) received by PID" in p.stderr, p.stderr[-3000:]


def test_only_the_trainer_module_is_handed_over():
    alone = trainer(Path("r.yaml"), "--reference")  # [python, -m, the trainer, r.yaml, --reference]
    assert trainer_args(alone) == ["r.yaml", "--reference"]
    assert trainer_args([alone[0], "-u", *alone[1:]]) == ["r.yaml", "--reference"]  # as torchrun starts it
    assert trainer_args(trainer(Path("r.yaml"), nproc=2)) is None  # torchrun itself
    assert trainer_args([alone[0], "script.py", *alone[1:]]) is None
    assert trainer_args([alone[0], "-c", "print(1)"]) is None

"""The tests' preloaded interpreter (helpers/zygote.py) runs the trainer exactly as a fresh interpreter does:
the same metrics bit for bit, the same exit code, the same death by a signal, the caller's working directory
and environment; torchrun is handed over too, and a process started as anything else is not."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from helpers import launch
from helpers.launch import trainer, worker_env
from helpers.trainer import make_run_yaml
from helpers.zygote import served

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


def test_only_the_trainer_and_torchrun_are_handed_over():
    alone = trainer(Path("r.yaml"), "--reference")  # [python, -m, the trainer, r.yaml, --reference]
    assert served(alone) == ("mimo_jobs.trainer", ["r.yaml", "--reference"])
    # as torchrun starts each rank
    assert served([alone[0], "-u", *alone[1:]]) == ("mimo_jobs.trainer", ["r.yaml", "--reference"])
    under = trainer(Path("r.yaml"), nproc=2)  # torchrun itself, with its own arguments
    assert served(under) == ("torch.distributed.run", under[3:])
    assert served([alone[0], "script.py", *alone[1:]]) is None
    assert served([alone[0], "-c", "print(1)"]) is None
    assert served([alone[0], "-m", "mimo_jobs.cli", "report"]) is None
    assert served([alone[0], "-m"]) is None


def test_a_torchrun_started_ignoring_usr2_ignores_it_in_the_zygote_too(tmp_path):
    """launch.sh starts torchrun with USR1 and USR2 ignored (the warning signal is for the trainer): handed
    over, torchrun still ignores them, and a USR2 sent to it does not kill it, as it does not a fresh one."""
    import signal
    import time

    script = tmp_path / "wait.py"
    script.write_text("import time\ntime.sleep(4)\nprint('rank slept')\n")
    ended = {}
    for name, zygote in (("fresh", False), ("zygote", True)):
        cmd = launch.torchrun(1, str(script))
        ignoring = f"trap '' USR2; exec {' '.join(cmd)}"
        p = subprocess.Popen(
            ["bash", "-c", ignoring], env=worker_env(zygote=zygote), stdout=subprocess.PIPE, text=True
        )
        time.sleep(2)  # torchrun has started (a USR2 before that hits bash, which ignores it too)
        p.send_signal(signal.SIGUSR2)
        out, _ = p.communicate(timeout=300)
        ended[name] = (p.returncode, "rank slept" in out)
    assert ended["zygote"] == ended["fresh"] == (0, True), ended

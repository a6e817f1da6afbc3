"""Requeue on the real local SLURM cluster with the REAL trainer: a job whose time limit is too short stops
before it (MIMO_JOB_DEADLINE exported by the rendered sbatch.sh), saves a checkpoint and writes the marker;
sbatch.sh runs `scontrol requeue` (cluster.requeue: true), SLURM starts the same job id again
(SLURM_RESTART_COUNT=1), it resumes from `latest` and completes. The store then holds ONE curve equal to an
independent straight run of the same launch.sh outside SLURM (no deadline), and `report` shows it."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from helpers.submit import all_ended, cli, job_rows, query, wait_until, write_study

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

ITERS = 16


def straight_curve(run_dir: Path) -> dict[int, float]:
    out = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        d = json.loads(line)
        if d.get("kind", "iteration") == "iteration":
            out[d["iteration"]] = d["loss"]
    return out


def test_time_limited_job_is_requeued_by_slurm_and_resumes_to_one_curve(slurm_cluster, tmp_path):
    db, runs = tmp_path / "store.duckdb", tmp_path / "runs"
    study = write_study(
        tmp_path / "sl_requeue.yaml",
        "sl_requeue",
        [{"nodes": 1}],
        executor="slurm",
        time_limit="00:01:00",
        signal="USR2@5",
        train_iters=ITERS,
        env={"OMP_NUM_THREADS": 1},
    )
    doc = yaml.safe_load(study.read_text())
    doc["cluster"]["requeue"] = True
    doc["trainer"].update(
        {"seq_length": 32, "save_interval": 4, "log_interval": 1, "seed": 1234, "precision": "fp32"}
    )
    study.write_text(yaml.safe_dump(doc, sort_keys=False))

    # Only the SLURM job (sbatch exports the submitter's environment) sleeps 4 s after each step (test hook)
    # and keeps 10 s before its deadline: 16 iterations (64 s of sleep alone) cannot fit in 1 minute however
    # fast the start-up (6-25 s here), so the first attempt stops part way (by the deadline, or by USR2 which
    # SLURM may send early); each attempt that reaches its first step advances at least one iteration.
    out = cli(
        "submit",
        study,
        "--db",
        db,
        "--runs-dir",
        runs,
        check=True,
        env={"MIMO_CKPT_TEST_STEP_DELAY_S": "4", "MIMO_JOB_DEADLINE_MARGIN_S": "10"},
    ).stdout
    assert out.count("as slurm job") == 1

    # The yardstick, meanwhile: the same rendered launch.sh run alone (local mode: no SLURM, no deadline).
    cli("render", study, "-o", tmp_path / "straight", check=True)
    (srd,) = (tmp_path / "straight" / "sl_requeue").iterdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "MIMO_JOB"))}
    p = subprocess.run(
        ["bash", str(srd / "launch.sh")],
        cwd=srd,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=400,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    want = straight_curve(srd)
    assert sorted(want) == list(range(1, ITERS + 1))

    rows = wait_until(
        db, "sl_requeue", lambda rs: all_ended(rs) and rs[-1]["action"] in ("done", "final"), 600, every=3
    )
    *earlier, r = rows
    assert (r["state"], r["exit_code"], r["action"]) == ("COMPLETED", 0, "done"), rows
    # The accounting database, independently: the first job ran more than once, its first run ended REQUEUED
    # (sbatch.sh's `scontrol requeue`: same job id, SLURM_RESTART_COUNT + 1).
    first = rows[0]["job_id"]
    states = subprocess.run(
        ["sacct", "-X", "-D", "-n", "-P", "-o", "State", "-j", first],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    assert states[0] == "REQUEUED" and len(states) >= 2, states
    # Usually that is all (one job row). On a slow host an attempt that resumed may start so late that SLURM's
    # limit ends it while it exits after its stop; mimo-jobs then resubmits it (the trainer's stop line).
    for e in earlier:
        assert e["action"] == "requeue", rows
    if len(rows) == 1:
        assert states[-1] == "COMPLETED", states
    rd = Path(r["run_dir"])
    logs = "".join(f.read_text() for f in (rd / "logs").rglob("*.log"))
    assert "stopping for requeue at iteration" in logs
    assert "resumed from checkpoint" in logs
    assert not (rd / "checkpoints" / "requeue.json").exists()

    got = query(
        db,
        """SELECT iteration, loss FROM iterations i JOIN runs USING (run_id)
                       WHERE study = 'sl_requeue' AND NOT coalesce(superseded, false) ORDER BY iteration""",
    )
    assert [i for i, _ in got] == list(range(1, ITERS + 1))
    assert dict(got) == want
    rep = json.loads(cli("report", "sl_requeue", "--db", db, "--format", "json", check=True).stdout)
    (run,) = rep["runs"]
    assert (run["iterations"], run["state"], run["final_loss"]) == (ITERS, "COMPLETED", want[ITERS])
    st = cli("status", "sl_requeue", "--db", db, check=True).stdout
    assert f"{ITERS}/{ITERS}" in st and "COMPLETED" in st
    assert len(job_rows(db, "sl_requeue")) == len(rows)

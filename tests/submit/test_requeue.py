"""Requeue end to end with the local executor and the REAL trainer (torchrun, gloo, megatron-core on CPU):
the executor forwards SIGUSR2 to the running job (like `scancel --signal=USR2`, a preemption warning); the
trainer finishes the step, saves a checkpoint, writes the requeue marker and exits 75 through launch.sh;
`status` applies the policy (requeue), the next attempt resumes from `latest`, and after the run completes
the store holds ONE curve whose every iteration equals an independent straight run of the same study, bit
for bit. (The time-limit path, MIMO_JOB_DEADLINE, is exercised on the SLURM cluster: tests/slurm.)"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
import yaml

from helpers.submit import all_ended, cli, query, wait_until, write_study

pytestmark = pytest.mark.slow

ITERS = 16


def study_file(path: Path, time_limit: str, env: dict) -> Path:
    """1 node, 2 CPU ranks (encoder DP1, LLM DP1), tiny model, checkpoints every 4 iterations."""
    write_study(
        path,
        "rq_local",
        [{"nodes": 1}],
        time_limit=time_limit,
        train_iters=ITERS,
        signal="USR2@0",
        env={"OMP_NUM_THREADS": 1, **env},
    )
    doc = yaml.safe_load(path.read_text())
    doc["trainer"].update(
        {"seq_length": 32, "save_interval": 4, "log_interval": 1, "seed": 1234, "precision": "fp32"}
    )
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def ws(root: Path) -> dict:
    """Own store and runs root; ONE machine slot shared by both workspaces: the runs take turns (2 cores)."""
    root.mkdir()
    return {
        "db": root / "store.duckdb",
        "runs": root / "runs",
        "env": {"MIMO_JOBS_LOCAL_SLOTS_DIR": str(root.parent / "slots"), "MIMO_JOBS_LOCAL_SLOTS": "1"},
    }


def curve(db: Path) -> list[tuple[int, float]]:
    """The stitched curve as the report reads it (superseded rows are older attempts)."""
    return query(
        db, "SELECT iteration, loss FROM iterations WHERE NOT coalesce(superseded, false) ORDER BY iteration"
    )


def metrics_iteration(run_dir: Path) -> int:
    try:
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return 0
    its = [json.loads(ln).get("iteration", 0) for ln in lines if ln.strip()]
    return max(its, default=0)


def test_signalled_local_run_is_requeued_and_resumes_to_one_curve(tmp_path):
    from mimo_jobs.contract.rundir import RunDir
    from mimo_jobs.submit.executors.local.executor import LocalExecutor

    straight, short = ws(tmp_path / "straight"), ws(tmp_path / "short")
    s_study = study_file(tmp_path / "straight.yaml", "00:10:00", {})
    # The signalled run sleeps 0.5 s after each step (test hook) so the signal lands mid-run.
    q_study = study_file(tmp_path / "short.yaml", "00:10:00", {"MIMO_CKPT_TEST_STEP_DELAY_S": 0.5})
    for w, st in ((straight, s_study), (short, q_study)):
        cli("submit", st, "--db", w["db"], "--runs-dir", w["runs"], env=w["env"], check=True)

    want = dict(
        wait_until(straight["db"], "rq_local", all_ended, 400, straight["env"], every=2)
        and curve(straight["db"])
    )
    assert sorted(want) == list(range(1, ITERS + 1))

    (first,) = wait_until(short["db"], "rq_local", lambda rs: rs[0]["state"] == "RUNNING", 120, short["env"])
    rd = RunDir(Path(first["run_dir"]))
    deadline = time.monotonic() + 300
    while metrics_iteration(rd.root) < 3:
        assert time.monotonic() < deadline, "the signalled run did not reach iteration 3"
        time.sleep(0.3)
    assert LocalExecutor().signal(first["job_id"], rd)
    sent_at = metrics_iteration(rd.root)

    rows = wait_until(
        short["db"],
        "rq_local",
        lambda rs: all_ended(rs) and rs[-1]["action"] in ("done", "final"),
        400,
        short["env"],
        every=2,
    )
    assert len(rows) == 2, rows
    stopped, last = rows
    # launch.sh turned the trainer's marker into exit 75 (torchrun alone reports 1); the policy requeued the
    # run as attempt 1, which completed.
    assert (stopped["attempt"], stopped["state"], stopped["exit_code"], stopped["action"]) == (
        0,
        "FAILED",
        75,
        "requeue",
    ), stopped
    assert stopped["next_job_id"] == last["job_id"]
    assert (last["attempt"], last["state"], last["exit_code"], last["action"]) == (
        1,
        "COMPLETED",
        0,
        "done",
    ), last
    log0 = Path(stopped["log_path"]).read_text()
    m = re.search(r'asks for a requeue: \{"iteration": (\d+), "reason": "signal:SIGUSR2"', log0)
    assert m, log0[-3000:]
    stop_it = int(m[1])
    assert sent_at <= stop_it < ITERS
    log1 = Path(last["log_path"]).read_text()
    assert f"resumed from checkpoint {rd.checkpoints / f'iter_{stop_it:07d}'} (iteration {stop_it}," in log1
    assert not (rd.checkpoints / "requeue.json").exists()  # handled and removed by launch.sh

    # ONE curve: every iteration once, equal to the straight run's (exact: same layout, CPU, same seed).
    got = curve(short["db"])
    assert [i for i, _ in got] == list(range(1, ITERS + 1))
    assert dict(got) == want
    rep = json.loads(cli("report", "rq_local", "--db", short["db"], "--format", "json", check=True).stdout)
    (run,) = rep["runs"]
    assert (run["iterations"], run["state"], run["jobs"]) == (ITERS, "COMPLETED", 2)
    assert run["final_loss"] == want[ITERS]

    # status: the last checkpoint per run (save_interval 4 divides 16: the last save is iteration 16).
    st = cli("status", "rq_local", "--db", short["db"], env=short["env"], check=True).stdout
    header = next(ln for ln in st.splitlines() if "checkpoint" in ln and "iteration" in ln)
    col = [c.strip() for c in header.split("┃")].index("checkpoint")
    line = next(ln for ln in st.splitlines() if "COMPLETED" in ln)
    assert line.split("│")[col].strip() == str(ITERS), st

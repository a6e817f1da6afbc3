"""A local job whose runner process is killed (kill -9, the OOM killer) while launch.sh and its children run
on: the job stays RUNNING, no retry starts beside it, its machine slot stays taken, its time limit still
holds, and `cancel` stops the orphaned processes. Real runners, real processes, the real CLI (the FAKE
launch.sh of tests/submit/fake_templates sleeps)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from helpers.submit import all_ended, cli, job_rows, submit_fake, wait_until, write_study
from mimo_jobs.contract.rundir import RunDir

RUN = "1n-e1x1-l1x1x1-g6"
SLEPT_TO_ITS_END = "fake workload: slept to its end"


@pytest.fixture
def ws(tmp_path):
    """Own store, runs root and ONE machine slot (MIMO_JOBS_LOCAL_SLOTS=1), so slot use is visible."""
    env = {"MIMO_JOBS_LOCAL_SLOTS_DIR": str(tmp_path / "slots"), "MIMO_JOBS_LOCAL_SLOTS": "1"}
    procs: list[int] = []
    yield {
        "dir": tmp_path,
        "db": tmp_path / "store.duckdb",
        "runs": tmp_path / "runs",
        "env": env,
        "procs": procs,
    }
    for sf in (tmp_path / "runs").glob("*/*/logs/local-*.json"):  # whatever a failed test left running
        d = json.loads(sf.read_text())
        if d.get("state") in ("PENDING", "RUNNING") and running(d.get("runner_pid") or 0):
            procs.extend(tree(d["runner_pid"]))
    for pid in procs:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


submit = submit_fake


def status(ws, study: str) -> str:
    return cli("status", study, "--db", ws["db"], env=ws["env"], check=True).stdout


def running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def tree(pid: int) -> list[int]:
    """`pid` and its descendants (from /proc)."""
    kids: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                kids.setdefault(int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]), []).append(
                    int(d.name)
                )
            except (OSError, IndexError, ValueError):
                pass
    out, todo = [pid], [pid]
    while todo:
        for c in kids.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def kill_runner(ws, row: dict) -> list[int]:
    """kill -9 the job's runner; return the job's processes (launch.sh and its sleep), which live on."""
    state = json.loads((Path(row["run_dir"]) / "logs" / f"local-{row['job_id']}.json").read_text())
    job, deadline = tree(state["child_pid"]), time.monotonic() + 30
    while len(job) < 2 and time.monotonic() < deadline:  # launch.sh may not have started its sleep yet
        time.sleep(0.05)
        job = tree(state["child_pid"])
    ws["procs"].extend(job)
    os.kill(state["runner_pid"], signal.SIGKILL)
    deadline = time.monotonic() + 120  # a hang guard
    while running(state["runner_pid"]):
        assert time.monotonic() < deadline, "the runner did not die"
        time.sleep(0.05)
    assert len(job) >= 2 and all(running(p) for p in job)
    return job


def started(rows: list[dict]) -> bool:
    return rows[0]["state"] == "RUNNING"


def gone(pids: list[int], within: float) -> bool:
    deadline = time.monotonic() + within
    while any(running(p) for p in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


@pytest.mark.slow  # multi-process or real jobs: CI runs it, the fast local default does not
def test_killed_runner_job_stays_running_is_not_retried_and_cancel_stops_it(ws):
    study = write_study(ws["dir"] / "o.yaml", "orph", [{"nodes": 1}], max_retries=2, env={"FAKE_SLEEP": 120})
    submit(ws, study)
    (row,) = wait_until(ws["db"], "orph", started, 30, ws["env"], every=0.3)
    job = kill_runner(ws, row)

    for _ in range(3):  # polls after the runner's death: the job runs on, so it is RUNNING, never retried
        out = status(ws, "orph")
        rows = job_rows(ws["db"], "orph")
        assert [(r["job_id"], r["state"]) for r in rows] == [(row["job_id"], "RUNNING")], rows
        assert "orphaned" in out
        assert all(running(p) for p in job)
        time.sleep(0.5)

    out = cli("cancel", "orph", "--db", ws["db"], env=ws["env"], check=True).stdout
    assert f"cancelled {RUN}: local job {row['job_id']}" in out
    assert gone(job, 120), f"orphaned processes {[p for p in job if running(p)]} survived cancel"
    rows = wait_until(ws["db"], "orph", all_ended, 30, ws["env"], every=0.3)
    assert [(r["state"], r["action"]) for r in rows] == [("CANCELLED", "final")]
    assert (
        "no pending or running job"
        in cli("cancel", "orph", "--db", ws["db"], env=ws["env"], check=True).stdout
    )


@pytest.mark.slow  # multi-process or real jobs: CI runs it, the fast local default does not
def test_orphaned_job_keeps_its_slot(ws):
    """With one machine slot, a job queued behind an orphaned one waits until the orphan is gone."""
    study = write_study(
        ws["dir"] / "q.yaml",
        "orph_slot",
        [{"nodes": 1, "gbs": 6}, {"nodes": 1, "gbs": 12}],
        env={"FAKE_SLEEP": 120},
    )
    submit(ws, study, "--only", RUN)
    (row,) = wait_until(ws["db"], "orph_slot", started, 30, ws["env"], every=0.3)
    job = kill_runner(ws, row)
    submit(ws, study, "--only", "1n-e1x1-l1x1x1-g12")
    time.sleep(3)  # a free slot is taken within 0.2 s
    status(ws, "orph_slot")
    states = {r["run"]: r["state"] for r in job_rows(ws["db"], "orph_slot")}
    assert states == {RUN: "RUNNING", "1n-e1x1-l1x1x1-g12": "PENDING"}, states

    cli("cancel", "orph_slot", "--run", RUN, "--db", ws["db"], env=ws["env"], check=True)
    assert gone(job, 120)
    rows = wait_until(
        ws["db"],
        "orph_slot",
        lambda rs: {r["run"]: r["state"] for r in rs}.get("1n-e1x1-l1x1x1-g12") == "RUNNING",
        30,
        ws["env"],
        every=0.3,
    )
    cli("cancel", "orph_slot", "--db", ws["db"], env=ws["env"], check=True)
    rows = wait_until(ws["db"], "orph_slot", all_ended, 30, ws["env"], every=0.3)
    assert sorted(r["state"] for r in rows) == ["CANCELLED", "CANCELLED"]


@pytest.mark.slow  # multi-process or real jobs: CI runs it, the fast local default does not
def test_orphaned_job_still_ends_at_its_time_limit_before_any_retry(ws):
    study = write_study(
        ws["dir"] / "t.yaml",
        "orph_limit",
        [{"nodes": 1}],
        max_retries=1,
        # long enough that the runner is still there to be killed however slowly the job starts on a busy
        # machine (at 4 s it could reach the limit and end on its own first)
        time_limit="00:00:20",
        signal="USR2@0",
        env={"FAKE_SLEEP": 120},
    )
    submit(ws, study)
    (row,) = wait_until(ws["db"], "orph_limit", started, 30, ws["env"], every=0.3)
    job = kill_runner(ws, row)
    rows = wait_until(ws["db"], "orph_limit", all_ended, 180, ws["env"], every=0.5)
    assert not any(running(p) for p in job)
    assert [(r["state"], r["action"]) for r in rows] == [("TIMEOUT", "final")], rows
    assert "no checkpoint" in rows[0]["reason"]


@pytest.mark.slow  # multi-process or real jobs: CI runs it, the fast local default does not
def test_orphaned_job_that_ends_is_retried_only_after_its_processes_are_gone(ws):
    release = str(ws["dir"] / "release")
    study = write_study(
        ws["dir"] / "n.yaml",
        "orph_end",
        [{"nodes": 1}],
        max_retries=1,
        # the workload ends when the test says so (the release file), after its runner is killed: a fixed
        # sleep could run out first on a busy machine, and the job would end under its runner
        env={"FAKE_WAIT_FILE": release, "FAKE_MESSAGE": SLEPT_TO_ITS_END},
    )
    submit(ws, study)
    (row,) = wait_until(ws["db"], "orph_end", started, 30, ws["env"], every=0.3)
    job = kill_runner(ws, row)
    Path(release).touch()
    rows = wait_until(
        ws["db"], "orph_end", lambda rs: len(rs) == 2 and all_ended(rs), 60, ws["env"], every=0.5
    )
    first, second = rows
    assert (first["state"], first["action"], first["next_job_id"]) == ("NODE_FAIL", "retry", second["job_id"])
    assert "local runner process disappeared" in first["reason"]
    assert (second["attempt"], second["state"]) == (1, "COMPLETED")
    # the first attempt was seen ending (its processes gone) before the retry was submitted
    assert first["end_time"] <= second["submit_time"]
    # it ran orphaned, to its own end (launch.sh prints FAKE_MESSAGE after its sleep), not killed
    out = RunDir(Path(first["run_dir"])).local_out(first["job_id"]).read_text()
    assert SLEPT_TO_ITS_END in out, out
    assert not any(running(p) for p in job)

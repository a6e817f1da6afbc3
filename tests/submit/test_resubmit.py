"""The loop after a mistake, through the real CLI, the local executor and a real store: a run fails, the
study file is fixed and submitted again (a new run id under the same name). `status` says why the first
failed (the rank and the trainer's error line, not only the exit code), then shows it superseded by the
fix; `submit --wait` judges the latest attempt of each point only.

The workload is the FAKE launch.sh (tests/submit/fake_templates); the failing one prints real torchrun
output of the trainer refusing its run.yaml (tests/submit/fixtures/torchrun_bad_input.log)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from helpers.submit import all_ended, cli, job_rows, query, submit_fake, wait_until, write_study

BAD_INPUT_LOG = (Path(__file__).parent / "fixtures" / "torchrun_bad_input.log").read_text()
BAD_INPUT = "mimo-jobs trainer: error: /runs/lm/1n-e1x1-l1x1x1-g6-0f3a2c1d/run.yaml: no such run.yaml"
POINTS = [{"nodes": 1, "gbs": 6}, {"nodes": 1, "gbs": 12}]
POINTS_NAME = "1n-e1x1-l1x1x1-g6"  # the name of POINTS[0]


@pytest.fixture
def ws(tmp_path):
    env = {"MIMO_JOBS_LOCAL_SLOTS_DIR": str(tmp_path / "slots"), "MIMO_JOBS_LOCAL_SLOTS": "4"}
    return {"dir": tmp_path, "db": tmp_path / "store.duckdb", "runs": tmp_path / "runs", "env": env}


def _status_of(ws, study: str) -> str:
    # wide enough that no cell wraps: each run is one line
    return cli("status", study, "--db", ws["db"], env={**ws["env"], "COLUMNS": "400"}, check=True).stdout


def _status(ws) -> str:
    return _status_of(ws, "fix")


def test_a_failed_run_then_its_fix(ws):
    study = write_study(
        ws["dir"] / "s.yaml", "fix", POINTS, env={"FAKE_EXIT": 2, "FAKE_MESSAGE": BAD_INPUT_LOG}
    )
    first = submit_fake(ws, study, "--wait", check=False)
    assert first.returncode == 1, first.stdout + first.stderr
    rows = wait_until(ws["db"], "fix", all_ended, 60, ws["env"])
    assert [r["state"] for r in rows] == ["FAILED", "FAILED"]
    old_ids = {rid for (rid,) in query(ws["db"], "SELECT run_id FROM runs")}

    # status names the failed rank and the trainer's own line, as the report's triage does
    st = _status(ws)
    assert st.count(f"rank 0 failed: {BAD_INPUT}") == 2, st
    assert "superseded" not in st and "run id" not in st  # one attempt per point: no run id column

    # the fix: a new run id under each name; --wait judges those, not the failed attempts
    write_study(study, "fix", POINTS, env={"FAKE_ITERS": 2})
    second = submit_fake(ws, study, "--wait", check=False)
    assert second.returncode == 0, second.stdout + second.stderr
    assert query(ws["db"], "SELECT count(*) FROM runs")[0][0] == 4
    new_ids = {rid for (rid,) in query(ws["db"], "SELECT run_id FROM runs")} - old_ids

    st = _status(ws)
    assert "run id" in st  # names repeat: each row says which run it is
    lines = [ln for ln in st.splitlines() if any(rid in ln for rid in old_ids | new_ids)]
    assert len(lines) == 4, st
    for ln in lines:
        if any(rid in ln for rid in old_ids):
            assert "superseded" in ln and "FAILED; latest attempt: run " in ln
            assert any(rid in ln.split("latest attempt: run ")[1] for rid in new_ids)
        else:
            assert "COMPLETED" in ln and "superseded" not in ln
    assert [r["state"] for r in job_rows(ws["db"], "fix")].count("COMPLETED") == 2


def test_a_job_is_recorded_ended_only_after_its_iterations_are_ingested(ws, monkeypatch):
    """The refresh that sees a job end reads its run dir before it records the end: no reader (and no
    command stopped between the two writes) sees a COMPLETED run without the iterations it logged."""
    from mimo_jobs.ingest import pipeline
    from mimo_jobs.store import connection as store
    from mimo_jobs.submit import service

    study = write_study(ws["dir"] / "o.yaml", "order", [{"nodes": 1}], env={"FAKE_ITERS": 3, "FAKE_SLEEP": 1})
    submit_fake(ws, study)
    seen = []

    def ingest(con, rds) -> None:
        seen.append(con.execute("SELECT state FROM jobs").fetchone()[0])  # what a reader sees meanwhile
        pipeline.ingest_paths(con, [rd.root for rd in rds])

    for k, v in ws["env"].items():  # the local executor's slots of this workspace
        monkeypatch.setenv(k, v)
    deadline = time.monotonic() + 300  # only catches a hang
    while True:
        con = store.connect(ws["db"])
        try:
            service.refresh(con, "order", service.Follow(ingest=ingest))
            state, iters = con.execute(
                "SELECT j.state, (SELECT count(*) FROM iterations) FROM jobs j"
            ).fetchone()
        finally:
            con.close()
        if state == "COMPLETED" or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert (state, iters) == ("COMPLETED", 3)
    assert seen and seen[0] in ("RUNNING", "PENDING", "SUBMITTED"), seen


def test_a_reverted_study_reports_the_completed_run_it_equals_and_is_never_run_twice(ws):
    """A completed config, then a broken change that fails, then the study reverted: the reverted point is
    the completed run again (same config, same run id), so submitting it starts nothing, makes it the
    latest attempt (in this store and in one rebuilt from the runs root) and `--wait` judges it; `--force`
    does not run it again (its measurements would be replaced) and says what to do instead."""
    from mimo_jobs.store import connection as store
    from mimo_jobs.store.attempts import superseded

    def later(db) -> dict[str, str]:
        con = store.connect(db, read_only=True)
        try:
            return superseded(con, "revert")
        finally:
            con.close()

    good = {"FAKE_ITERS": 2}
    study = write_study(ws["dir"] / "r.yaml", "revert", POINTS[:1], env=good)
    submit_fake(ws, study, "--wait")
    ((done,),) = query(ws["db"], "SELECT run_id FROM runs")
    write_study(study, "revert", POINTS[:1], env={"FAKE_EXIT": 2, "FAKE_MESSAGE": BAD_INPUT_LOG})
    assert submit_fake(ws, study, "--wait", check=False).returncode == 1
    ((broken,),) = query(ws["db"], "SELECT run_id FROM runs WHERE run_id != ?", [done])
    assert later(ws["db"]) == {done: broken}

    write_study(study, "revert", POINTS[:1], env=good)  # reverted
    again = submit_fake(ws, study, "--wait", check=False)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "submitted " not in again.stdout and f"skip {POINTS_NAME}: job" in again.stdout, again.stdout
    assert later(ws["db"]) == {broken: done}
    st = _status_of(ws, "revert")
    assert "superseded" in next(ln for ln in st.splitlines() if broken in ln)
    assert "COMPLETED" in next(ln for ln in st.splitlines() if done in ln and broken not in ln)
    fresh = ws["dir"] / "fresh.duckdb"
    cli("ingest", ws["runs"], "--db", fresh, env=ws["env"], check=True)
    assert later(fresh) == {broken: done}

    jobs = job_rows(ws["db"], "revert")
    forced = submit_fake(ws, study, "--force", check=False)
    assert forced.returncode == 2, forced.stdout + forced.stderr
    msg = " ".join(forced.stderr.split())
    assert f"({done}) completed" in msg and "is not run again" in msg and "repeats" in msg, forced.stderr
    assert job_rows(ws["db"], "revert") == jobs  # nothing submitted, nothing rewritten

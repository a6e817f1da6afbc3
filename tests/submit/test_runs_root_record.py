"""The runs root is the record and a store its cache: the order of a point's attempts and whether a run has a
live job are read from the run directories (their submissions.jsonl), so a store rebuilt by `ingest` reports
what the store that submitted did, and two stores sharing one runs root never start two live jobs of a run.

Real CLI, real local executor, real DuckDB files; the workload is the FAKE launch.sh
(tests/submit/fake_templates), which prints FAKE_ITERS Megatron-format iteration lines or sleeps."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.submit import all_ended, cli, job_rows, query, submit_fake, wait_until, write_study

STUDY = "order"
POINT = [{"nodes": 1, "gbs": 6}]


@pytest.fixture
def ws(tmp_path):
    env = {"MIMO_JOBS_LOCAL_SLOTS_DIR": str(tmp_path / "slots"), "MIMO_JOBS_LOCAL_SLOTS": "4"}
    return {"dir": tmp_path, "db": tmp_path / "a.duckdb", "runs": tmp_path / "runs", "env": env}


def _run_id(study: Path) -> str:
    from mimo_jobs.study.diagnose import diagnose

    (run,) = diagnose(study).runs
    return run.run_id


def _later_sorts_first(path: Path) -> tuple[float, float]:
    """Learning rates for a first run (2 iterations) and a second (3), same name and layout, whose run ids
    are in the reverse of their submission order: the second run's directory sorts first, so an order
    taken from an ingest's walk of the runs root (or from when a store first saw each run) is wrong."""
    lrs = (1e-4, 2e-4, 3e-4, 4e-4, 5e-4)
    ids = {
        (lr, n): _run_id(write_study(path, STUDY, POINT, env={"FAKE_ITERS": n}, lr=lr))
        for lr in lrs
        for n in (2, 3)
    }
    return next((a, b) for a in lrs for b in lrs if ids[(b, 3)] < ids[(a, 2)])


def _report(db: Path) -> tuple[list[tuple], dict[str, str]]:
    """What a report of the study says of each run it reports (state aside: a rebuilt store has no
    scheduler jobs), and which runs it left out for which."""
    from mimo_jobs.report import build
    from mimo_jobs.store import connection as store
    from mimo_jobs.store.attempts import superseded

    con = store.connect(db, read_only=True)
    try:
        rep = build(con, STUDY)
        rows = [(r.run_id, r.name, r.iterations, r.final_loss, r.t_median_ms) for r in rep.runs]
        return rows, superseded(con, STUDY)
    finally:
        con.close()


def test_a_store_rebuilt_from_the_runs_root_orders_the_attempts_as_the_original(ws):
    first, second = _later_sorts_first(ws["dir"] / "s.yaml")
    study = write_study(ws["dir"] / "s.yaml", STUDY, POINT, env={"FAKE_ITERS": 2}, lr=first)
    submit_fake(ws, study, "--wait")
    old = _run_id(study)
    study = write_study(study, STUDY, POINT, env={"FAKE_ITERS": 3}, lr=second)  # same name, new run id
    submit_fake(ws, study, "--wait")
    new = _run_id(study)
    assert new < old  # the later run's directory sorts first

    rows, later = _report(ws["db"])
    assert later == {old: new} and [r[0] for r in rows] == [new] and rows[0][2] == 3, (rows, later)
    fresh = ws["dir"] / "fresh.duckdb"
    cli("ingest", ws["runs"], "--db", fresh, env=ws["env"], check=True)
    assert _report(fresh) == (rows, later)


def test_two_stores_on_one_runs_root_never_start_two_live_jobs_of_a_run(ws):
    study = write_study(ws["dir"] / "s.yaml", STUDY, POINT, env={"FAKE_SLEEP": 600})
    submit_fake(ws, study)
    other = {**ws, "db": ws["dir"] / "b.duckdb"}  # another store, the same runs root
    try:
        refused = submit_fake(other, study, check=False)
        out = refused.stdout + refused.stderr
        assert refused.returncode == 1, out
        assert "of this run is" in out and "not submitted beside it" in out, out
        (rd,) = (ws["runs"] / STUDY).iterdir()
        assert len(list((rd / "logs").glob("local-*.json"))) == 1  # one job ever started
        assert query(other["db"], "SELECT count(*) FROM jobs")[0][0] == 0
    finally:
        cli("cancel", STUDY, "--db", ws["db"], env=ws["env"], check=True)
        cli("cancel", STUDY, "--db", other["db"], env=ws["env"])  # whatever it started, if it could
    wait_until(ws["db"], STUDY, all_ended, 60, ws["env"])
    # its job ended: the other store may run it now
    again = submit_fake(other, study, check=False)
    try:
        assert again.returncode == 0 and "submitted " in again.stdout, again.stdout + again.stderr
    finally:
        cli("cancel", STUDY, "--db", other["db"], env=ws["env"], check=True)
    rows = wait_until(other["db"], STUDY, all_ended, 60, ws["env"])
    assert [r["state"] for r in rows] == ["CANCELLED"] and len(job_rows(ws["db"], STUDY)) == 1


def test_the_record_reads_what_submit_wrote_and_skips_what_it_did_not(tmp_path):
    """A line cut short by a crash or edited by hand names no submission; the others still count. A retry or
    requeue continues an attempt: it starts a job (the live-job check reads it) but names nothing."""
    from mimo_jobs.contract import submissions as sub

    sub.append(tmp_path, sub.Entry(100.0, "submitted", "local", "local-1", 0))
    sub.append(tmp_path, sub.Entry(150.0, "kept", "local", "local-1", 0))
    with open(sub.path_of(tmp_path), "a") as f:  # the last one cut short by a crash
        f.write('{"event": "submitted", "time": "yesterday"}\n[1, 2]\nnot json\n{"event": "kept", "ti')
    sub.append(tmp_path, sub.Entry(200.0, "retry", "local", "local-2", 1))
    entries = sub.read(tmp_path)
    assert [e.event for e in entries] == ["submitted", "kept", "retry"]
    assert sub.named_at(entries) == sub.as_utc(150.0)
    assert sub.last_job(entries).job_id == "local-2"
    with pytest.raises(ValueError):
        sub.append(tmp_path, sub.Entry(300.0, "resubmitted"))


def test_a_held_submission_lock_is_waited_for_within_a_bound(tmp_path):
    from mimo_jobs.contract import submissions as sub

    with sub.locked(tmp_path):
        with pytest.raises(sub.SubmissionBusy, match="another process has been submitting this run"):
            with sub.locked(tmp_path, wait_s=0.2):
                pass
    with sub.locked(tmp_path, wait_s=0.2):  # released: taken at once
        pass

"""Which run of a point is its latest attempt (store/attempts.py), on a real store: the failed first attempts
of a study and the runs that replaced them, each with its scheduler jobs."""

from __future__ import annotations

from datetime import datetime

from helpers.pair_store import DP2, HET, TP2, build_report, with_failed_first_attempts
from mimo_jobs.store import connection as store
from mimo_jobs.store.attempts import superseded
from mimo_jobs.submit import jobs_table

TIMES = {HET: 100.0, TP2: 150.0, DP2: 120.0}


def test_the_run_submitted_last_is_the_latest_attempt(tmp_path):
    prepare, first = with_failed_first_attempts(tmp_path)
    build_report(tmp_path, TIMES, prepare=prepare)
    con = store.connect(tmp_path / "s.duckdb")
    try:
        names = dict(con.execute("SELECT run_id, name FROM runs").fetchall())
        later = superseded(con, "pairs")
        assert sorted(later) == sorted(first.values())  # each failed first attempt, by the run that followed
        assert all(names[by] == names[old] and by not in first.values() for old, by in later.items())
        assert superseded(con, "another study") == {}

        # the first attempt of HET is submitted again (--force) after its replacement: it is the latest now
        jobs_table.insert_job(
            con, first[HET], "8", "slurm", 1, None, None, submit_time=datetime(2026, 1, 1, 11)
        )
        again = superseded(con)
        assert (
            first[HET] not in again
            and again[next(r for r, n in names.items() if n == HET and r != first[HET])] == first[HET]
        )
    finally:
        con.close()

"""A run directory belongs to one run for ever: submitting, changing (a new run id under the same run name),
resubmitting and ingesting in any order never lets one run write into another's directory, so ingesting the
runs root into a fresh store gives back exactly the runs, iterations and latest attempts the first store
holds; `--force` never runs a completed run again.

Real CLI, real local executor, real stores; the workload is the FAKE launch.sh (tests/submit/fake_templates),
which prints FAKE_ITERS Megatron-format iteration lines. Changing FAKE_ITERS (or train_iters) keeps the run
name and changes the run id, as raising train_iters does for a real study.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers.submit import all_ended, cli, query, submit_fake, wait_until, write_study

pytestmark = pytest.mark.slow

STEP = st.sampled_from(["resubmit", "change", "force", "ingest"])


def _study(path: Path, iters: int) -> Path:
    return write_study(path, "rd_prop", [{"nodes": 1}], env={"FAKE_ITERS": iters}, train_iters=iters)


def _runs(db: Path) -> set[tuple]:
    return set(query(db, "SELECT run_id, study, name FROM runs"))


def _superseded(db: Path) -> dict[str, str]:
    from mimo_jobs.store import connection as store
    from mimo_jobs.store.attempts import superseded

    con = store.connect(db, read_only=True)
    try:
        return superseded(con)
    finally:
        con.close()


def _iterations(db: Path) -> set[tuple]:
    return set(query(db, "SELECT run_id, job_id, iteration, loss FROM iterations"))


@settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck))
@given(steps=st.lists(STEP, min_size=1, max_size=3), at=st.integers(0, 3))
def test_reingesting_the_runs_root_reproduces_the_store(tmp_path_factory, steps, at):
    steps.insert(at % (len(steps) + 1), "change")  # every sequence changes the run at least once
    tmp = tmp_path_factory.mktemp("rd")
    ws = {"dir": tmp, "db": tmp / "a.duckdb", "runs": tmp / "runs", "env": {}}
    ws["env"] = {"MIMO_JOBS_LOCAL_SLOTS_DIR": str(tmp / "slots"), "MIMO_JOBS_LOCAL_SLOTS": "4"}
    iters, study = 4, _study(tmp / "s.yaml", 4)
    submitted = {}  # run id -> iterations its jobs print

    def submit(*extra: str) -> None:
        out = submit_fake(ws, study, *extra).stdout
        for line in out.splitlines():
            if line.startswith("submitted "):
                submitted[line.split("(")[1].split(")")[0]] = iters
        wait_until(ws["db"], "rd_prop", all_ended, 60, ws["env"], every=0.5)

    submit()
    for step in steps:
        if step == "change":  # same run name, new run id: the finished run must survive
            iters += 1
            _study(study, iters)
            submit()
        elif step == "force":  # the latest config completed: refused, nothing started
            forced = submit_fake(ws, study, "--force", check=False)
            assert forced.returncode == 2 and "is not run again" in forced.stderr, forced.stderr
        elif step == "resubmit":
            submit()  # nothing new unless the latest config has no job yet
        else:
            cli("ingest", ws["runs"], "--db", ws["db"], env=ws["env"], check=True)
    cli("ingest", ws["runs"], "--db", ws["db"], env=ws["env"], check=True)

    # one directory per run id, and every run of the store is there
    dirs = sorted(p.name for p in (ws["runs"] / "rd_prop").iterdir())
    assert len(dirs) == len(submitted) == len(_runs(ws["db"]))
    assert {d.rsplit("-", 1)[1] for d in dirs} == set(submitted)
    # every job's iterations are its own run's, and complete
    jobs = set(query(ws["db"], "SELECT run_id, job_id FROM jobs"))
    per_job: dict[tuple, int] = {}
    for rid, job, _it, _loss in _iterations(ws["db"]):
        per_job[(rid, job)] = per_job.get((rid, job), 0) + 1
    assert per_job == {j: submitted[j[0]] for j in jobs}

    fresh = tmp / "fresh.duckdb"
    cli("ingest", ws["runs"], "--db", fresh, env=ws["env"], check=True)
    assert _runs(fresh) == _runs(ws["db"])
    assert _iterations(fresh) == _iterations(ws["db"])
    assert set(query(fresh, "SELECT DISTINCT run_id, job_id FROM iterations")) == jobs
    # and the same latest attempt, read from the run directories' own record of their submissions
    assert _superseded(fresh) == _superseded(ws["db"]) and len(_superseded(fresh)) == len(submitted) - 1
    # status shows every run, the changed ones beside the runs they replaced
    st_out = cli("status", "rd_prop", "--db", ws["db"], env=ws["env"], check=True).stdout
    assert st_out.count("1n-e1x1-l1x1x1-g6") == len(submitted)

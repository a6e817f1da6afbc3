"""Hostile input to `submit`, `status` and `cancel`: unknown names, study "files" that are directories or
FIFOs, nonsense intervals, repeated cancels, local jobs whose state file vanished. One line per case (see
tests/helpers/hostile.py); each runs the real CLI and must end cleanly with the right exit code."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from helpers.hostile import Case, run_case
from helpers.submit import write_study

STUDY = "hs"
RUN = "1n-e1x1-l1x1x1-g6"
DB = "{tmp}/s.duckdb"


def study_file(tmp: Path) -> Path:
    return write_study(tmp / "s.yaml", STUDY, [{"nodes": 1}], env={"FAKE_SLEEP": 1})


def store(job_state: str | None = None, state_file: bytes | None = None):
    """setup: a store knowing study `hs` (one run, its run dir) and, with `job_state`, one local job of it;
    `state_file` is written as that job's state file (None: there is none), dated a minute ago."""

    def setup(tmp: Path) -> None:
        from mimo_jobs.contract.rundir import RunDir
        from mimo_jobs.store import catalog
        from mimo_jobs.store.connection import connect
        from mimo_jobs.study.expand import runs_of
        from mimo_jobs.study.load import load_study
        from mimo_jobs.submit import jobs_table

        spec = load_study(study_file(tmp))
        (run,) = runs_of(spec)
        rd = RunDir.of(tmp / "runs", STUDY, run.name, run.run_id)
        rd.logs.mkdir(parents=True)
        con = connect(tmp / "s.duckdb")
        try:
            catalog.record_study(con, catalog.StudyRecord(**spec.catalog_fields()), str(tmp / "s.yaml"))
            catalog.record_run(con, catalog.RunRecord(**run.catalog_fields()), str(rd.root), None)
            if job_state is not None:
                jobs_table.insert_job(
                    con,
                    run.run_id,
                    "local-1",
                    "local",
                    0,
                    None,
                    str(rd.local_out("local-1")),
                    state=job_state,
                )
        finally:
            con.close()
        if state_file is not None:
            sf = rd.logs / "local-local-1.json"
            sf.write_bytes(state_file)
            old = time.time() - 60
            os.utime(sf, (old, old))

    return setup


def fifo(name: str):
    def setup(tmp: Path) -> None:
        os.mkfifo(tmp / name)

    return setup


def directory(name: str):
    def setup(tmp: Path) -> None:
        (tmp / name).mkdir()

    return setup


def both(*setups):
    def setup(tmp: Path) -> None:
        for s in setups:
            s(tmp)

    return setup


def no_store(tmp: Path, out: str) -> None:
    assert not (tmp / "s.duckdb").exists() and not (tmp / "runs").exists()


CASES = [
    Case(
        "status-unknown-study", ["status", "nosuch", "--db", DB], 2, ("'nosuch'", "known: hs"), setup=store()
    ),
    Case(
        "cancel-unknown-study", ["cancel", "nosuch", "--db", DB], 2, ("'nosuch'", "known: hs"), setup=store()
    ),
    Case(
        "cancel-unknown-run",
        ["cancel", STUDY, "--run", "nosuch", "--db", DB],
        2,
        ("no run 'nosuch'", RUN),
        setup=store(),
    ),
    Case("status-no-store", ["status", STUDY, "--db", "{tmp}/none.duckdb"], 2, ("no store",)),
    Case("cancel-no-store", ["cancel", STUDY, "--db", "{tmp}/none.duckdb"], 2, ("no store",)),
    Case(
        "status-missing-study-file",
        ["status", "gone.yaml", "--db", DB],
        2,
        ("no study file or study 'gone.yaml'",),
        setup=store(),
    ),
    Case(
        "status-study-file-is-dir",
        ["status", "d.yaml", "--db", DB],
        2,
        ("d.yaml: not a study file (a directory)",),
        setup=both(store(), directory("d.yaml")),
    ),
    Case(
        "cancel-study-file-is-dir",
        ["cancel", "d.yaml", "--db", DB],
        2,
        ("not a study file (a directory)",),
        setup=both(store(), directory("d.yaml")),
    ),
    Case(
        "submit-study-file-is-dir",
        ["submit", "d.yaml", "--db", DB],
        2,
        ("d.yaml",),
        setup=directory("d.yaml"),
        check=no_store,
    ),
    Case(
        "submit-study-file-is-fifo",
        ["submit", "f.yaml", "--db", DB],
        2,
        ("not a study file (not a regular file)",),
        setup=fifo("f.yaml"),
        check=no_store,
        timeout_s=20,
    ),
    Case(
        "status-study-file-is-fifo",
        ["status", "f.yaml", "--db", DB],
        2,
        ("not a regular file",),
        setup=both(store(), fifo("f.yaml")),
        timeout_s=20,
    ),
    Case(
        "demo-study-file-is-fifo",
        ["demo", "--study", "f.yaml", "--db", DB],
        2,
        ("not a regular file",),
        setup=fifo("f.yaml"),
        check=no_store,
        timeout_s=20,
    ),
    Case(
        "submit-only-unknown-run",
        ["submit", "s.yaml", "--only", "nosuch", "--db", DB, "--runs-dir", "{tmp}/runs"],
        2,
        ("no run named 'nosuch'", RUN),
        setup=lambda tmp: study_file(tmp),
        check=no_store,
    ),
    Case(
        "submit-only-empty-name",
        ["submit", "s.yaml", "--only", "", "--db", DB, "--runs-dir", "{tmp}/runs"],
        2,
        ("no run named ''",),
        setup=lambda tmp: study_file(tmp),
        check=no_store,
    ),
    Case(
        "status-watch-zero-interval",
        ["status", "--watch", "--interval", "0", "--db", DB],
        2,
        ("--interval",),
        setup=store("RUNNING"),
    ),
    Case(
        "status-watch-negative-interval",
        ["status", "--watch", "--interval", "-1", "--db", DB],
        2,
        ("--interval",),
        setup=store("RUNNING"),
    ),
    Case(
        "status-watch-nan-interval",
        ["status", "--watch", "--interval", "nan", "--db", DB],
        2,
        ("--interval",),
        setup=store("RUNNING"),
    ),
    Case(
        "cancel-nothing-to-cancel",
        ["cancel", STUDY, "--db", DB],
        0,
        ("no pending or running job",),
        setup=store("CANCELLED"),
    ),
    Case(
        "cancel-again-after-cancel",
        ["cancel", STUDY, "--db", DB],
        0,
        ("no pending or running job",),
        setup=store("RUNNING", b'{"state": "CANCELLED", "job_id": "local-1", "exit_code": 0}'),
    ),
    # a local job whose state file was deleted (or is garbage) and of which no process runs is over
    Case(
        "status-local-state-file-gone",
        ["status", STUDY, "--db", DB],
        0,
        ("NODE_FAIL", "state file"),
        setup=store("RUNNING"),
    ),
    Case(
        "status-local-state-file-garbage",
        ["status", STUDY, "--db", DB],
        0,
        ("NODE_FAIL",),
        setup=store("RUNNING", b"\x00{not json"),
    ),
    Case(
        "cancel-local-state-file-gone",
        ["cancel", STUDY, "--db", DB],
        0,
        ("no pending or running job",),
        setup=store("RUNNING"),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_jobs(case: Case, tmp_path: Path) -> None:
    run_case(case, tmp_path)

"""The README's main job, as a user runs it: `mimo-jobs demo` submits the packaged CPU study with the local
executor (the real trainer: torchrun, megatron-core on gloo), follows it, ingests it and prints the report."""

from __future__ import annotations

import re
import shutil

import pytest
import yaml

from helpers import REPO
from helpers.demo_runs import demo_output, demo_store
from helpers.submit import cli, job_rows, query

pytestmark = pytest.mark.slow


def test_demo_runs_the_packaged_study_to_a_report(tmp_path_factory, tmp_path):
    # the pytest run's one demo (shared with the other tests that read real trainer output)
    db, runs = demo_store(tmp_path_factory)
    out = demo_output(tmp_path_factory)
    env = {"MIMO_JOBS_LOCAL_SLOTS_DIR": str(tmp_path / "slots")}
    spec = yaml.safe_load((REPO / "studies/cpu_local.yaml").read_text())
    iters, n = spec["trainer"]["train_iters"], len(spec["matrix"]["points"])

    rows = job_rows(db, "cpu_local")
    assert len(rows) == n
    assert all(
        (r["executor"], r["state"], r["exit_code"], r["attempt"]) == ("local", "COMPLETED", 0, 0)
        for r in rows
    )
    # The report came from the ingested store: every run's iterations are there, and the table names them.
    counts = dict(
        query(db, "SELECT r.name, count(*) FROM iterations i JOIN runs r USING (run_id) GROUP BY 1")
    )
    assert counts == {r["run"]: iters for r in rows}
    for r in rows:
        assert re.search(rf"{re.escape(r['run'])}\s*│[^\n]*COMPLETED[^\n]*{iters}/{iters}", out), r["run"]
    assert "E(N)" in out

    # Running it again submits nothing new: the completed runs are kept (on a copy of the store: other tests
    # read the shared one meanwhile)
    again = shutil.copy(db, tmp_path / "again.duckdb")
    p = cli("demo", "--db", again, "--runs-dir", runs, env=env, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert len(job_rows(again, "cpu_local")) == n

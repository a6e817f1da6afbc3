"""Calibration against real runs: the packaged CPU study's four layouts, shortened to 10 iterations, run
by `mimo-jobs demo` (the real trainer on gloo), ingested, then `predict --db` and `report` on that store.
The uncalibrated `cpu` figures are far off (a nominal peak, no per-call overheads); what is checked is
that efficiencies fitted on the other runs predict each held-out run better than the defaults do."""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from helpers import REPO
from helpers.submit import cli
from mimo_jobs.cli.app import app
from mimo_jobs.report import build
from mimo_jobs.store.connection import connect

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("calcpu")
    doc = yaml.safe_load((REPO / "studies/cpu_local.yaml").read_text())
    doc["name"], doc["trainer"]["train_iters"] = "cal_cpu", 10
    study, db = tmp / "cal_cpu.yaml", tmp / "cal.duckdb"
    study.write_text(yaml.safe_dump(doc, sort_keys=False))
    env = {"MIMO_JOBS_LOCAL_SLOTS_DIR": str(tmp / "slots")}
    p = cli("demo", "--study", study, "--db", db, "--runs-dir", tmp / "runs", env=env, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    return study, db


def test_predict_db_calibrates_and_holds_out(measured):
    study, db = measured
    r = CliRunner().invoke(app, ["predict", str(study), "--db", str(db), "--gpu", "cpu", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    con = connect(db, read_only=True)
    try:
        rep = build(con, "cal_cpu")
    finally:
        con.close()
    median_s = {x.run_id: x.t_median_ms / 1000 for x in rep.runs}
    assert len(doc["runs"]) == len(median_s) == 4
    for run in doc["runs"]:
        m = run["measured_s"]
        assert m == pytest.approx(median_s[run["run_id"]])
        for k in ("uncalibrated", "calibrated", "holdout"):
            assert run[f"{k}_error"] == pytest.approx((run[f"{k}_s"] - m) / m)
        assert run["iteration_s"] == pytest.approx(run["calibrated_s"])  # the tables are calibrated too
    cal = doc["calibration"]
    assert cal["holdout_by"] == "run"  # one node count: each run is held out in turn
    assert cal["error_before"] > 0.5  # the nominal cpu entry is far off, as documented
    assert cal["error_after"] < cal["error_before"]
    assert cal["holdout_error_after"] < cal["holdout_error_before"]
    # printed: per run, and the hold-out figure
    t = CliRunner().invoke(app, ["predict", str(study), "--db", str(db)], env={"COLUMNS": "200"})
    assert t.exit_code == 0, t.output
    assert "predicted vs measured" in t.output and "held out (one run at a time" in t.output
    print(t.output)  # the figures, for `pytest -s`


def test_report_compares_with_the_planner(measured):
    _, db = measured
    con = connect(db, read_only=True)
    try:
        rep = build(con, "cal_cpu")
    finally:
        con.close()
    assert len(rep.predicted) == 4 and all(p.gpu == "cpu" and p.measured_s for p in rep.predicted)
    # every rank class of every run has the trainer's facts; the LLM's are exact for this model
    assert {m.run_id for m in rep.predicted_memory} == {p.run_id for p in rep.predicted}
    assert all(m.measured_ranks >= 1 and abs(m.error) < 0.5 for m in rep.predicted_memory)
    assert all(abs(m.error) < 0.02 for m in rep.predicted_memory if m.rank_class == "llm")

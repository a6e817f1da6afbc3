"""Calibration against real runs: the packaged CPU study's four layouts as the session's `mimo-jobs demo` ran
them (the real trainer on gloo) and a second study of four other layouts shortened to 10 iterations, each
ingested, then `predict --db` and `report` on that store.
The uncalibrated `cpu` figures are far off (a nominal peak, no per-call overheads); what is checked is
that efficiencies fitted on the other runs predict each held-out run better than the defaults do."""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from helpers import REPO
from helpers.demo_runs import demo_store
from helpers.submit import cli
from mimo_jobs.cli.app import app
from mimo_jobs.report import build
from mimo_jobs.store.connection import connect

pytestmark = pytest.mark.slow


def _demo(tmp, doc: dict):
    study, db = tmp / f"{doc['name']}.yaml", tmp / "cal.duckdb"
    study.write_text(yaml.safe_dump(doc, sort_keys=False))
    env = {"MIMO_JOBS_LOCAL_SLOTS_DIR": str(tmp / "slots")}
    p = cli("demo", "--study", study, "--db", db, "--runs-dir", tmp / "runs", env=env, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    return study, db


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """The packaged study as the session's one `mimo-jobs demo` ran it (read only here)."""
    db, _ = demo_store(tmp_path_factory)
    return REPO / "studies/cpu_local.yaml", db


@pytest.fixture(scope="module")
def second(tmp_path_factory):
    """Four other layouts of the same model: a larger batch, microbatches of 2, encoder TP2 beside LLM TP1,
    LLM TP2 beside two encoder replicas, a colocated DP4."""
    doc = yaml.safe_load((REPO / "studies/cpu_local.yaml").read_text())
    doc["name"], doc["trainer"]["train_iters"] = "cal_cpu_b", 10
    doc["matrix"] = {
        "defaults": {"nodes": 1, "gbs": 12, "mbs": 1},
        "points": [
            {"encoder": {"tp": 1, "dp": 1}, "llm": {"tp": 1, "dp": 3}},
            {"encoder": {"tp": 2, "dp": 1}, "llm": {"tp": 1, "dp": 2}, "mbs": 2},
            {"encoder": {"tp": 1, "dp": 2}, "llm": {"tp": 2, "dp": 1}, "mbs": 2},
            {"colocated": True, "llm": {"tp": 1}},
        ],
    }
    return _demo(tmp_path_factory.mktemp("calcpub"), doc)


def _calibration(study, db) -> dict:
    r = CliRunner().invoke(app, ["predict", str(study), "--db", str(db), "--gpu", "cpu", "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def test_predict_db_calibrates_and_holds_out(measured):
    study, db = measured
    r = CliRunner().invoke(app, ["predict", str(study), "--db", str(db), "--gpu", "cpu", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    con = connect(db, read_only=True)
    try:
        rep = build(con, "cpu_local")
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
        rep = build(con, "cpu_local")
    finally:
        con.close()
    assert len(rep.predicted) == 4 and all(p.gpu == "cpu" and p.measured_s for p in rep.predicted)
    # every rank class of every run has the trainer's facts; the LLM's are exact for this model
    assert {m.run_id for m in rep.predicted_memory} == {p.run_id for p in rep.predicted}
    assert all(m.measured_ranks >= 1 and abs(m.error) < 0.5 for m in rep.predicted_memory)
    assert all(abs(m.error) < 0.02 for m in rep.predicted_memory if m.rank_class == "llm")


def test_calibration_figures_on_two_studies(measured, second):
    """Uncalibrated, calibrated and held-out errors on both CPU studies, and each study predicted with the
    efficiencies fitted on the other only (layouts the fit never saw)."""
    from mimo_jobs.predict.estimate import predict_run
    from mimo_jobs.predict.hardware import get_gpu
    from mimo_jobs.predict.steptime import Efficiency
    from mimo_jobs.study.diagnose import diagnose

    docs = {name: _calibration(*pair) for name, pair in (("demo", measured), ("second", second))}
    lines = []
    for name, doc in docs.items():
        c = doc["calibration"]
        lines.append(
            f"{name}: uncalibrated {c['error_before']:.1%}, calibrated {c['error_after']:.1%}, held out "
            f"{c['holdout_error_after']:.1%} (uncalibrated {c['holdout_error_before']:.1%}), {c['unknowns']} scales"
        )
        assert c["error_after"] < c["error_before"] and c["holdout_error_after"] < c["holdout_error_before"]
    cpu = get_gpu("cpu")
    for fit_on, other in (("demo", "second"), ("second", "demo")):
        e = docs[fit_on]["calibration"]["efficiency"]
        eff = Efficiency(e["encoder"], e["llm"], e["network"], e["latency"])
        study = (measured if other == "demo" else second)[0]
        measured_s = {r["run_id"]: r["measured_s"] for r in docs[other]["runs"]}
        errs = [
            abs(predict_run(r, cpu, eff).time.iteration_s / measured_s[r.run_id] - 1)
            for r in diagnose(study).runs
        ]
        lines.append(
            f"{other} predicted with {fit_on}'s efficiencies: {sum(errs) / len(errs):.1%} mean |error|"
        )
    print("\n".join(lines))


def test_plan_db_ranks_with_calibrated_efficiencies(measured):
    study, db = measured
    doc = _calibration(study, db)
    r = CliRunner().invoke(
        app, ["plan", "--nodes", "1", "--from", str(study), "--db", str(db), "--top", "50", "--json"]
    )
    assert r.exit_code == 0, r.output
    plan = json.loads(r.output)
    assert plan["calibrated"] is True
    # the study's own colocated point, priced by plan, is predict --db's calibrated figure for that run
    colo = next(x for x in doc["runs"] if "colo" in x["name"])
    same = [
        x
        for x in plan["plans"][0]["layouts"]
        if x["point"] == {"nodes": 1, "colocated": True, "llm": {"tp": 2, "dp": 2}, "gbs": 6}
    ]
    assert same and same[0]["iteration_s"] == pytest.approx(colo["calibrated_s"])
    plain = CliRunner().invoke(app, ["plan", "--nodes", "1", "--from", str(study), "--json"])
    assert json.loads(plain.output)["calibrated"] is False

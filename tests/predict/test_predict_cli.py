"""`predict`, `plan` and validate's memory line through typer's CliRunner; bad input exits non-zero with
one line."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from typer.testing import CliRunner

from mimo_jobs.cli.app import app

STUDIES = Path(__file__).resolve().parents[2] / "studies"
PROD, CPU = STUDIES / "scale_33n_68n_100n.yaml", STUDIES / "cpu_local.yaml"
runner = CliRunner()
RANK_KEYS = {
    "module",
    "stage",
    "ranks",
    "params",
    "weight_bytes",
    "grad_bytes",
    "optimizer_bytes",
    "activation_bytes",
    "total_bytes",
}


def test_predict_json_shape():
    r = runner.invoke(app, ["predict", str(PROD), "--gpu", "H100", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["study"] == "scale_33n_68n_100n" and doc["gpu"] == "H100"
    assert [x["nodes"] for x in doc["runs"]] == [33, 68, 100]
    for run in doc["runs"]:
        assert {
            "name",
            "run_id",
            "nodes",
            "fits",
            "iteration_s",
            "tokens_per_s_per_gpu",
            "mfu",
            "bottleneck",
            "ranks",
            "flops_per_iteration",
        } <= set(run)
        assert run["bottleneck"] in ("encoder", "llm") and run["fits"] is True
        assert set(run["flops_per_iteration"]) == {"encoder", "llm"}
        for rk in run["ranks"]:
            assert set(rk) == RANK_KEYS and rk["module"] in ("encoder", "llm") and len(rk["ranks"]) == 2
            parts = rk["weight_bytes"] + rk["grad_bytes"] + rk["optimizer_bytes"] + rk["activation_bytes"]
            assert rk["total_bytes"] == parts


def test_predict_table_and_colocated_cpu_study():
    r = runner.invoke(app, ["predict", str(PROD), "--gpu", "H100"], env={"COLUMNS": "250"})
    assert r.exit_code == 0, r.output
    assert "fits," in r.output and "all GPUs of the job" in r.output
    rj = json.loads(runner.invoke(app, ["predict", str(CPU), "--json"]).output)
    assert rj["gpu"] == "cpu"
    colo = [x for x in rj["runs"] if "colo" in x["name"]][0]
    assert {rk["module"] for rk in colo["ranks"]} == {"encoder", "llm"}
    assert colo["ranks"][0]["ranks"] == colo["ranks"][1]["ranks"] == [0, 3]  # both modules on every rank


def test_plan_prints_pasteable_points():
    r = runner.invoke(app, ["plan", "--nodes", "33", "--gpu", "H100", "--from", str(PROD), "--top", "3"])
    assert r.exit_code == 0, r.output
    body = "\n".join(line.split("  #")[0] for line in r.output.splitlines() if not line.startswith("#"))
    points = yaml.safe_load(body)["points"]
    assert len(points) == 3 and all(p["nodes"] == 33 and p["gbs"] == 768 for p in points)
    rj = json.loads(runner.invoke(app, ["plan", "--nodes", "33", "--from", str(PROD), "--json"]).output)
    assert rj["nodes"] == 33 and len(rj["layouts"]) == 5


def test_validate_prints_a_memory_line_per_run():
    r = runner.invoke(app, ["validate", str(PROD)], env={"COLUMNS": "250"})
    assert r.exit_code == 0, r.output
    assert r.output.count("memory on H100: fits") == 3


def test_bad_input_is_one_line_and_nonzero(tmp_path):
    for args in (
        ["predict", str(PROD), "--gpu", "X100"],
        ["plan", "--nodes", "0", "--from", str(PROD)],
        ["plan", "--nodes", "-3", "--from", str(PROD)],
        ["predict", str(tmp_path / "missing.yaml")],
    ):
        r = runner.invoke(app, args)
        assert r.exit_code == 2, (args, r.output)
        assert "error:" in r.output
    r = runner.invoke(app, ["predict", str(PROD), "--db", str(tmp_path / "none.duckdb")])
    assert r.exit_code == 2 and "no store at" in r.output

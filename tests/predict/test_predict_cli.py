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
        assert run["bottleneck"] in ("vision", "llm") and run["fits"] is True
        assert set(run["flops_per_iteration"]) == {"encoder", "llm"}
        for rk in run["ranks"]:
            assert set(rk) == RANK_KEYS and rk["module"] in ("vision", "llm") and len(rk["ranks"]) == 2
            parts = rk["weight_bytes"] + rk["grad_bytes"] + rk["optimizer_bytes"] + rk["activation_bytes"]
            assert rk["total_bytes"] == parts


def test_predict_table_and_colocated_cpu_study():
    r = runner.invoke(app, ["predict", str(PROD), "--gpu", "H100"], env={"COLUMNS": "250"})
    assert r.exit_code == 0, r.output
    assert "fits," in r.output and "all GPUs of the job" in r.output
    rj = json.loads(runner.invoke(app, ["predict", str(CPU), "--json"]).output)
    assert rj["gpu"] == "cpu"
    colo = [x for x in rj["runs"] if "colo" in x["name"]][0]
    assert {rk["module"] for rk in colo["ranks"]} == {"vision", "llm"}
    assert colo["ranks"][0]["ranks"] == colo["ranks"][1]["ranks"] == [0, 3]  # both modules on every rank


def test_plan_prints_pasteable_points():
    r = runner.invoke(app, ["plan", "--nodes", "33", "--gpu", "H100", "--from", str(PROD), "--top", "3"])
    assert r.exit_code == 0, r.output
    body = "\n".join(line.split("  #")[0] for line in r.output.splitlines() if not line.startswith("#"))
    points = yaml.safe_load(body)["points"]
    assert len(points) == 3 and all(p["nodes"] == 33 and p["gbs"] == 768 for p in points)
    rj = json.loads(runner.invoke(app, ["plan", "--nodes", "33", "--from", str(PROD), "--json"]).output)
    (one,) = rj["plans"]
    assert one["nodes"] == 33 and len(one["layouts"]) == 5
    assert one["layouts"][0]["point"] == points[0]  # the JSON point is the text's point, as a mapping


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


def _with_hardware(tmp_path: Path, hardware: dict) -> Path:
    doc = yaml.safe_load(PROD.read_text())
    doc["cluster"]["hardware"] = hardware
    p = tmp_path / "hw.yaml"
    p.write_text(yaml.safe_dump(doc))
    return p


def test_cluster_hardware_picks_the_gpu_and_overrides_its_figures(tmp_path):
    base = json.loads(runner.invoke(app, ["predict", str(PROD), "--json"]).output)
    # a 16 GiB part of the same model: the same runs, the same time, no room for the 33-node encoder
    small = _with_hardware(tmp_path, {"gpu": "H100", "memory_gib": 16})
    doc = json.loads(runner.invoke(app, ["predict", str(small), "--json"]).output)
    assert [r["run_id"] for r in doc["runs"]] == [r["run_id"] for r in base["runs"]]  # planning only
    assert [r["iteration_s"] for r in doc["runs"]] == [r["iteration_s"] for r in base["runs"]]
    assert "memory on H100: over by" in runner.invoke(app, ["validate", str(small)]).output
    # half the compute peak: every run is slower; the model named by the study is used without --gpu
    slow = _with_hardware(tmp_path, {"gpu": "B200", "peak_tflops": 500})
    doc = json.loads(runner.invoke(app, ["predict", str(slow), "--json"]).output)
    b200 = json.loads(runner.invoke(app, ["predict", str(PROD), "--gpu", "B200", "--json"]).output)
    assert doc["gpu"] == "B200"
    assert all(a["iteration_s"] > b["iteration_s"] for a, b in zip(doc["runs"], b200["runs"], strict=True))


def test_cluster_hardware_is_checked(tmp_path):
    bad = _with_hardware(tmp_path, {"gpu": "V100"})
    r = runner.invoke(app, ["validate", str(bad)])
    assert r.exit_code == 2 and "cluster.hardware.gpu" in r.output
    bad = _with_hardware(tmp_path, {"memory_gib": -1})
    assert runner.invoke(app, ["predict", str(bad)]).exit_code == 2


def _module_labels(run: dict) -> set[str]:
    """Every module label of one run of `predict --json`: its rank rows, bottleneck and modules."""
    return {rk["module"] for rk in run["ranks"]} | {run["bottleneck"]} | {m["module"] for m in run["modules"]}


def test_a_one_encoder_study_names_its_module_as_the_study_does(tmp_path):
    """`predict` and `plan` label a one-encoder model's module by the study's name for it: `vision` for the
    `encoder:` form, its own name for a one-module `encoders:` map; never `encoder`."""
    doc = yaml.safe_load(CPU.read_text())
    doc["trainer"]["model"] = {"encoders": {"eye": "tiny"}, "llm": "tiny"}
    doc["matrix"]["points"] = [
        {"encoders": {"eye": {"tp": 1, "dp": 1}}, "llm": {"tp": 1, "dp": 3}},
        {"colocated": True, "llm": {"tp": 2}},
    ]
    eye = tmp_path / "eye.yaml"
    eye.write_text(yaml.safe_dump(doc, sort_keys=False))
    for study, name in ((CPU, "vision"), (eye, "eye")):
        r = runner.invoke(app, ["predict", str(study), "--json"])
        assert r.exit_code == 0, r.output
        runs = json.loads(r.output)["runs"]
        for run in runs:
            labels = _module_labels(run)
            assert name in {rk["module"] for rk in run["ranks"]} and labels <= {name, "llm"}, labels
            assert [m["module"] for m in run["modules"]] == [name, "llm"]
        table = runner.invoke(app, ["predict", str(study)], env={"COLUMNS": "250"}).output
        cells = {c.strip() for line in table.splitlines() for c in line.split("│")}
        assert name in cells and "encoder" not in cells
        p = runner.invoke(app, ["plan", "--from", str(study), "--nodes", "1", "--top", "2", "--json"])
        assert p.exit_code == 0, p.output
        layouts = [c for plan in json.loads(p.output)["plans"] for c in plan["layouts"]]
        assert layouts and all(name in c["split"] and "encoder" not in c["split"] for c in layouts)
        classes = {m for c in layouts for rc in c["rank_classes"] for m in rc["modules"]}
        assert classes == {name, "llm"} and {c["bottleneck"] for c in layouts} <= {name, "llm"}

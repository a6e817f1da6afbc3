"""`--layers` on `predict` and `plan`, `cluster.hardware.layers` in a study, and what `predict`'s table and
`validate`'s memory lines say of the layers they priced; a bad value is one line and exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mimo_jobs.cli.app import app

REPO = Path(__file__).resolve().parents[2]
DENSE, MOE = REPO / "benchmarks" / "gpu" / "dense_1b.yaml", REPO / "benchmarks" / "gpu" / "moe_4l.yaml"
CPU = REPO / "studies" / "cpu_local.yaml"
runner = CliRunner()


def _json(*args: str) -> dict:
    r = runner.invoke(app, ["predict", *args, "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def test_predict_prices_the_layers_asked_for():
    te, local = _json(str(DENSE)), _json(str(DENSE), "--layers", "local")
    assert te["layers"] == "te" and local["layers"] == "local"
    t_te, t_local = te["runs"][0]["iteration_s"], local["runs"][0]["iteration_s"]
    assert t_local > 3 * t_te  # the H200 measured 1.253 s against 0.324 priced for Transformer Engine
    assert local["runs"][0]["iteration_s"] == pytest.approx(1.253, rel=0.02)
    assert _json(str(DENSE), "--layers", "TE")["runs"][0]["iteration_s"] == t_te


def test_the_study_says_local_and_layers_overrides_it(tmp_path):
    study = tmp_path / "local.yaml"
    study.write_text(
        DENSE.read_text().replace("hardware: {gpu: H200}", "hardware: {gpu: H200, layers: local}")
    )
    assert _json(str(study))["layers"] == "local"
    assert _json(str(study), "--layers", "te")["layers"] == "te"
    r = runner.invoke(app, ["validate", str(study)])
    assert r.exit_code == 0, r.output
    assert (
        "memory and time on H200 priced for megatron-core's local layers (cluster.hardware.layers)"
        in r.output
    )


def test_the_table_and_validate_say_which_layers():
    r = runner.invoke(app, ["predict", str(MOE)], env={"COLUMNS": "250"})
    assert r.exit_code == 0, r.output
    assert "iteration time and cost (priced for Transformer Engine layers)" in r.output
    r = runner.invoke(app, ["predict", str(MOE), "--layers", "local"], env={"COLUMNS": "250"})
    assert "iteration time and cost (priced for megatron-core's local layers)" in r.output
    r = runner.invoke(app, ["validate", str(DENSE)])
    assert (
        "memory and time on H200 priced for Transformer Engine layers (cluster.hardware.layers)" in r.output
    )
    r = runner.invoke(app, ["validate", str(CPU)])
    assert "memory and time on cpu priced for megatron-core's local layers\n" in r.output


@pytest.mark.parametrize(
    "args",
    [
        ["predict", str(DENSE), "--layers", "flash"],
        ["plan", "--model", "dense-1b", "--gbs", "8", "--nodes", "1", "--layers", "flash"],
    ],
)
def test_a_bad_layers_value_is_one_line_and_exit_2(args):
    r = runner.invoke(app, args)
    assert r.exit_code == 2
    lines = [x for x in r.output.splitlines() if x.strip()]
    assert lines == ["error: --layers: unknown layer backend 'flash'; known: te, local"]


def test_plan_says_it_priced_local_layers():
    args = ["plan", "--model", "dense-1b", "--gbs", "8", "--nodes", "1", "--gpus-per-node", "1"]
    args += ["--seq-length", "2048", "--gpu", "H200"]
    te, local = runner.invoke(app, args), runner.invoke(app, [*args, "--layers", "local"])
    assert te.exit_code == 0 and local.exit_code == 0, local.output
    assert "priced for megatron-core's local layers" in local.output.splitlines()[0]
    assert "layers" not in te.output.splitlines()[0]  # Transformer Engine: what the efficiencies describe
    doc = json.loads(runner.invoke(app, [*args, "--layers", "local", "--json"]).output)
    assert doc["layers"] == "local"

"""The trainer section's DDP and precision settings reach the planner (predict/run.py study_settings): an
overlapped DP exposes less communication than the same run without overlap, a bf16 reduce holds half the
gradient buffer, and predict names the settings each run was priced with. Priced on the production study
(SigLIP-so400m + a 7B-class LLM on H100 nodes), where the DP transfers are large enough to matter."""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from helpers import REPO
from mimo_jobs.cli.app import app
from mimo_jobs.predict.estimate import predict_shape
from mimo_jobs.predict.hardware import get_gpu
from mimo_jobs.predict.run import shape_of
from mimo_jobs.predict.steptime import efficiency_for
from mimo_jobs.study.expand import runs_of
from mimo_jobs.study.load import load_study

PROD = REPO / "studies/scale_33n_68n_100n.yaml"
runner = CliRunner()


@pytest.fixture(scope="module")
def run():
    return runs_of(load_study(PROD, env={}))[0]


def _priced(run, **settings):
    t = run.trainer.model_copy(update=settings)
    g = get_gpu("H100")
    return predict_shape(shape_of(run.layout, t), g, efficiency_for(g))


def test_overlapped_dp_exposes_less_communication(run):
    assert run.trainer.use_distributed_optimizer  # the study's: a reduce-scatter and a parameter gather
    exposed = _priced(run)
    both = _priced(run, overlap_grad_reduce=True, overlap_param_gather=True)
    assert exposed.time.parts["dp"] > 0
    assert both.time.parts["dp"] < exposed.time.parts["dp"]
    assert both.time.iteration_s < exposed.time.iteration_s
    # the gather still runs after the step: the transfers are not all covered
    reduce_only = _priced(run, overlap_grad_reduce=True)
    assert reduce_only.time.parts["dp"] == exposed.time.parts["dp"]


def test_a_bf16_reduce_halves_the_gradient_buffer(run):
    fp32, bf16 = _priced(run), _priced(run, grad_reduce_dtype="bf16")
    pairs = [(a, b) for ca, cb in zip(fp32.memory.classes, bf16.memory.classes) for a, b in zip(ca.modules, cb.modules)]  # fmt: skip
    assert pairs and any(a.grad_bytes for a, _ in pairs)
    for a, b in pairs:
        assert 2 * b.grad_bytes == a.grad_bytes
        assert b.total_bytes == a.total_bytes - a.grad_bytes / 2


def test_predict_names_the_settings_it_priced(tmp_path):
    doc = yaml.safe_load(PROD.read_text())
    doc["trainer"].update(overlap_grad_reduce=True, overlap_param_gather=True, grad_reduce_dtype="bf16")
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(doc, sort_keys=False))
    r = runner.invoke(app, ["predict", str(p), "--json"], env={})
    assert r.exit_code == 0, r.output
    for one in json.loads(r.output)["runs"]:
        s = one["settings"]
        assert (s["precision"], s["grad_reduce_bytes"], s["overlap_dp"]) == ("bf16", 2, True)
        assert s["distributed_optimizer"] and s["not_priced"] == []
    r = runner.invoke(app, ["predict", str(p)], env={"COLUMNS": "250"})
    assert "settings priced: precision bf16, gradients reduced in bf16, distributed optimizer, DP transfers " \
        "overlapped" in r.output, r.output  # fmt: skip


TEXT_ONLY = REPO / "studies/megatron_gpt_mock.yaml"  # a text-only GPT: the operator model prices it on TE


def _predict_json(tmp_path, precision: str, time_model: str | None = None) -> dict:
    doc = yaml.safe_load(TEXT_ONLY.read_text())
    doc["cluster"]["hardware"] = {"gpu": "H100"} | ({"time_model": time_model} if time_model else {})
    doc["trainer"]["precision"] = precision
    p = tmp_path / f"{precision}-{time_model}.yaml"
    p.write_text(yaml.safe_dump(doc, sort_keys=False))
    r = runner.invoke(app, ["predict", str(p), "--json"], env={})
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def test_fp8_is_priced_by_the_operator_model_and_named_unpriced_by_the_flops_model(tmp_path):
    bf16, fp8 = _predict_json(tmp_path, "bf16"), _predict_json(tmp_path, "fp8")
    assert fp8["band"]["model"] == bf16["band"]["model"] == "operators"
    for a, b in zip(bf16["runs"], fp8["runs"], strict=True):
        # Transformer Engine's FP8 GEMMs run at the FP8 peak (opdata.OP_GPUS): the step is shorter
        assert b["iteration_s"] < a["iteration_s"], (a["name"], a["iteration_s"], b["iteration_s"])
        assert b["settings"]["precision"] == "fp8" and b["settings"]["not_priced"] == []
    flops = _predict_json(tmp_path, "fp8", time_model="flops")
    assert flops["band"]["model"] == "flops"
    for one in flops["runs"]:
        assert one["settings"]["not_priced"] == ["fp8 GEMM rate (priced as bf16)"]


def test_tp_comm_overlap_is_priced_by_the_operator_model_and_named_unpriced_by_the_flops_model(tmp_path):
    def predicted(overlap: bool, time_model: str | None = None) -> dict:
        doc = yaml.safe_load(TEXT_ONLY.read_text())
        doc["cluster"]["hardware"] = {"gpu": "H100"} | ({"time_model": time_model} if time_model else {})
        doc["trainer"]["tp_comm_overlap"] = (
            overlap  # the study's own command runs Megatron's --tp-comm-overlap
        )
        p = tmp_path / f"{overlap}-{time_model}.yaml"
        p.write_text(yaml.safe_dump(doc, sort_keys=False))
        r = runner.invoke(app, ["predict", str(p), "--json"], env={})
        assert r.exit_code == 0, r.output
        return json.loads(r.output)

    plain, over = predicted(False), predicted(True)
    assert over["band"]["model"] == "operators"
    tp2 = 0
    for a, b in zip(plain["runs"], over["runs"], strict=True):
        assert b["settings"]["not_priced"] == []
        if a["parts_s"]["tp"] == 0:  # TP 1: nothing to overlap
            assert b["iteration_s"] == a["iteration_s"], a["name"]
            continue
        tp2 += 1
        # TE's userbuffers hide the TP collectives under their GEMMs (with the sequence parallelism they need)
        assert b["parts_s"]["tp"] < a["parts_s"]["tp"], (a["name"], a["parts_s"], b["parts_s"])
        assert b["iteration_s"] < a["iteration_s"]
    assert tp2 == 2
    for one in predicted(True, time_model="flops")["runs"]:
        assert one["settings"]["not_priced"] == [
            "tp_comm_overlap (the FLOPs model prices TP communication exposed)"
        ]

"""The trainer section's DDP and precision settings (spec.TrainerSpec: overlap_grad_reduce,
overlap_param_gather, grad_reduce_dtype, tp_comm_overlap, precision fp8): their defaults are what the packaged
trainer ran before they existed, so a study that leaves them out keeps its run ids; what megatron-core or the
packaged trainer cannot run is refused by the study or by `validate`, naming the field and what would fit."""

from __future__ import annotations

import copy
import json

import pytest
import yaml
from test_study import minimal, problems_of
from typer.testing import CliRunner

from helpers import REPO
from mimo_jobs.cli.app import app
from mimo_jobs.study.expand import id_payload, runs_of
from mimo_jobs.study.load import parse_study
from mimo_jobs.study.runtime_rules import device_problems
from mimo_jobs.study.spec import TrainerSpec

SETTINGS = {
    "overlap_grad_reduce": True,
    "overlap_param_gather": True,
    "grad_reduce_dtype": "bf16",
    "tp_comm_overlap": True,
}
runner = CliRunner()


def _ids(doc: dict) -> list[str]:
    return [r.run_id for r in runs_of(parse_study(doc))]


def test_the_defaults_are_not_hashed_and_each_setting_changes_the_ids():
    assert not set(SETTINGS) & set(id_payload(TrainerSpec(train_iters=3)))
    base = _ids(minimal())
    for name, value in SETTINGS.items():
        doc = minimal()
        doc["cluster"]["accelerator"] = "gpu"
        doc["trainer"].update({name: value, "precision": "bf16", "use_distributed_optimizer": True})
        other = minimal()
        other["cluster"]["accelerator"] = "gpu"
        other["trainer"].update({"precision": "bf16", "use_distributed_optimizer": True})
        assert _ids(doc) != _ids(other), name
    assert _ids(minimal()) == base


def test_the_defaults_are_what_the_packaged_trainer_ran():
    t = TrainerSpec(train_iters=3)
    assert (t.overlap_grad_reduce, t.overlap_param_gather, t.grad_reduce_dtype, t.tp_comm_overlap) == (
        False,
        False,
        "fp32",
        False,
    )
    assert t.precision == "fp32"


def test_a_param_gather_overlap_needs_the_distributed_optimizer():
    doc = minimal()
    doc["trainer"]["overlap_param_gather"] = True
    (where, msg), *_ = problems_of(doc)
    assert where == "trainer" and "use_distributed_optimizer: true" in msg
    doc["trainer"]["use_distributed_optimizer"] = True
    assert _ids(doc)


def test_a_bf16_reduce_needs_bf16_parameters():
    doc = minimal()
    doc["trainer"]["grad_reduce_dtype"] = "bf16"
    (where, msg), *_ = problems_of(doc)
    assert "precision fp32 keeps fp32 parameters" in msg and "grad_reduce_dtype: fp32" in msg
    doc["trainer"]["precision"] = "bf16"
    doc["cluster"]["accelerator"] = "gpu"
    assert _ids(doc)


@pytest.mark.parametrize(
    ("accelerator", "packaged", "setting", "words"),
    [
        ("cpu", True, {"precision": "fp8"}, "need a GPU (accelerator=gpu) and Transformer Engine"),
        ("cpu", False, {"precision": "fp8"}, "need a GPU (accelerator=gpu) and Transformer Engine"),
        ("gpu", True, {"precision": "fp8"}, "the packaged trainer runs fp32 or bf16"),
        ("cpu", False, {"tp_comm_overlap": True}, "only false runs without Transformer Engine and a GPU"),
        ("gpu", True, {"tp_comm_overlap": True}, "builds no Transformer Engine userbuffers"),
    ],
)
def test_what_no_trainer_or_not_the_packaged_one_runs_is_refused(accelerator, packaged, setting, words):
    t = TrainerSpec(train_iters=3, **setting)
    (p,) = device_problems(t, accelerator, packaged)
    assert words in p.message and p.path == f"trainer.{next(iter(setting))}"


def test_a_command_of_its_own_may_state_them_on_a_gpu():
    t = TrainerSpec(train_iters=3, precision="fp8", tp_comm_overlap=True, grad_reduce_dtype="bf16")
    assert device_problems(t, "gpu", packaged=False) == []


def test_validate_refuses_fp8_on_a_cpu_study_and_predict_prices_a_command_of_its_own_on_a_gpu(tmp_path):
    doc = yaml.safe_load((REPO / "studies/cpu_local.yaml").read_text())
    doc["trainer"]["precision"] = "fp8"
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(doc, sort_keys=False))
    r = runner.invoke(app, ["validate", str(p)], env={"COLUMNS": "250"})
    assert r.exit_code == 2 and "trainer.precision" in r.output and "Transformer Engine" in r.output, r.output
    # on GPUs, a command of the study's own that runs fp8 is priced
    gpu = copy.deepcopy(doc)
    gpu["cluster"]["accelerator"] = "gpu"
    gpu["trainer"]["command"] = "pretrain_vlm.py --fp8-format hybrid"
    p.write_text(yaml.safe_dump(gpu, sort_keys=False))
    r = runner.invoke(app, ["predict", str(p), "--json"])
    assert r.exit_code == 0, r.output
    for run in json.loads(r.output)["runs"]:
        # the operator model (the default time model) prices the FP8 GEMM rate, encoder modules too
        assert run["settings"]["precision"] == "fp8" and run["settings"]["not_priced"] == []
    gpu["cluster"]["hardware"] = {"time_model": "flops"}
    p.write_text(yaml.safe_dump(gpu, sort_keys=False))
    r = runner.invoke(app, ["predict", str(p), "--json"])
    assert r.exit_code == 0, r.output
    for run in json.loads(r.output)["runs"]:
        assert run["settings"]["precision"] == "fp8"
        assert run["settings"]["not_priced"] == ["fp8 GEMM rate (priced as bf16)"]

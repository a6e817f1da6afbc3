"""The trainer's GPU path, proved on the CPU: the layer backend and fused kernels by device and installed
packages (model/kernels.py), CPU runs that never touch CUDA (device.py), and a model built with a GPU run's
precision settings."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.launch import trainer, worker_env
from mimo_jobs.trainer.device import cpu_environ, prepare, runs_on_cpu
from mimo_jobs.trainer.model.kernels import (
    LOCAL,
    SOFTMAX_KERNELS,
    TE,
    Installed,
    bias_activation_fusion,
    fusions,
    installed,
    kernels_for,
    layer_backend,
)

HERE = Path(__file__).parent
EVERYTHING = Installed(te=True, grad_accum_ext=True, softmax_ext=True)


def test_layers_are_te_only_on_a_gpu_with_te() -> None:
    assert layer_backend(True, EVERYTHING) == TE
    assert layer_backend(True, Installed()) == LOCAL
    assert layer_backend(False, EVERYTHING) == LOCAL  # TE installed on a CPU run: still local layers


def test_te_is_not_installed_here_so_the_selector_says_local() -> None:
    # megatron-core's own flag decides (its TE spec builder raises NameError: TESpecProvider without TE)
    have = installed()
    assert have.te is False
    assert kernels_for(True, have).backend == LOCAL
    assert kernels_for(True, have).grouped_gemm is False


def test_every_fused_kernel_is_off_on_cpu() -> None:
    on = fusions(False, EVERYTHING)
    assert {k for k, v in on.items() if v} == {"cross_entropy_loss_fusion"}  # the native one runs anywhere


def test_fused_kernels_on_a_gpu_follow_what_is_installed() -> None:
    bare = fusions(True, Installed())
    assert bare["bias_activation_fusion"] and bare["bias_dropout_fusion"]
    assert not bare["apply_rope_fusion"] and not bare["gradient_accumulation_fusion"]
    assert not bare["masked_softmax_fusion"]
    full = fusions(True, EVERYTHING)
    assert all(full.values())


def test_bias_activation_fusion_only_where_megatron_fuses_exactly() -> None:
    # megatron-core's GELU kernels (bias-GELU, GeGLU) are the tanh approximation: exact GELU stays unfused
    assert bias_activation_fusion(True, gated_linear_unit=True, activation="silu")  # SwiGLU
    assert not bias_activation_fusion(True, gated_linear_unit=False, activation="silu")
    assert not bias_activation_fusion(True, gated_linear_unit=False, activation="gelu")
    assert not bias_activation_fusion(True, gated_linear_unit=True, activation="gelu")
    assert not bias_activation_fusion(False, gated_linear_unit=True, activation="silu")


def test_grouped_experts_fuse_only_the_activations_te_fuses() -> None:
    # TEGroupedMLP fuses SwiGLU and gated quick-GELU and raises on any other fused activation
    assert bias_activation_fusion(True, True, "silu", grouped_experts=True)
    assert bias_activation_fusion(True, True, "quick_gelu", grouped_experts=True)
    assert not bias_activation_fusion(True, True, "gelu", grouped_experts=True)
    assert not bias_activation_fusion(True, True, "quick_gelu")  # megatron's MLP has no quick-GELU kernel


def test_the_softmax_fusion_needs_every_kernel_megatron_imports(monkeypatch) -> None:
    """FusedScaleMaskSoftmax imports the causal, masked or unmasked kernel by the mask type and shape: one of
    the three missing would fail at the first forward."""
    import importlib.util

    real = importlib.util.find_spec
    for missing in SOFTMAX_KERNELS:
        monkeypatch.setattr(
            importlib.util,
            "find_spec",
            lambda name, *a, m=missing: object() if name in SOFTMAX_KERNELS and name != m else real(name, *a),
        )
        assert installed().softmax_ext is False, missing
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: object() if name in SOFTMAX_KERNELS else real(name, *a)
    )
    assert installed().softmax_ext is True


def test_the_vit_attends_both_ways_whatever_the_softmax() -> None:
    """The ViT's attention is built unmasked (no_mask): a causal type would let megatron-core's fused softmax
    take its upper-triangular kernel, which never reads the all-False mask the encoder passes."""
    from megatron.core.transformer.enums import AttnMaskType

    from mimo_jobs.trainer.model.models import Precision, encoder_layer_specs

    spec, _, _ = encoder_layer_specs(Precision(use_gpu=False, bf16=False))
    assert spec.submodules.self_attention.params["attn_mask_type"] == AttnMaskType.no_mask


def test_the_kernels_line_names_backend_and_fusions() -> None:
    assert kernels_for(False, Installed()).describe() == (
        "layers local | attention sdpa | fused cross_entropy_loss_fusion"
    )
    assert (
        kernels_for(False, Installed(), "unfused").describe().startswith("layers local | attention unfused |")
    )
    assert kernels_for(True, EVERYTHING).describe().startswith("layers te | fused bias_activation_fusion,")


# ------------------------------------------------------------------------------------------- CPU runs


def test_a_cpu_run_is_cpu_whether_or_not_cuda_is_visible() -> None:
    assert runs_on_cpu("cpu", cuda_available=True)
    assert runs_on_cpu("cpu", cuda_available=False)
    assert runs_on_cpu("gpu", cuda_available=False)
    assert not runs_on_cpu("gpu", cuda_available=True)


def test_a_cpu_run_hides_cuda_and_a_gpu_run_does_not() -> None:
    assert cpu_environ("cpu", {}) == {"CUDA_VISIBLE_DEVICES": "", "TORCHDYNAMO_DISABLE": "1"}
    assert cpu_environ("cpu", {"TORCHDYNAMO_DISABLE": "0"})["TORCHDYNAMO_DISABLE"] == "0"
    assert cpu_environ("gpu", {}) == {}


def _run_yaml(tmp_path: Path, accelerator: str) -> Path:
    from helpers.trainer import make_run_yaml

    ry = make_run_yaml(tmp_path / "run", gpn=3, gbs=4, enc={"dp": 1}, llm={"dp": 2})
    if accelerator != "cpu":
        import yaml

        doc = yaml.safe_load(ry.read_text())
        doc["run"]["cluster"]["accelerator"] = accelerator
        ry.write_text(yaml.safe_dump(doc))
    return ry


def test_prepare_reads_the_accelerator_from_run_yaml(tmp_path) -> None:
    env: dict[str, str] = {"CUDA_VISIBLE_DEVICES": "0"}
    assert prepare([str(_run_yaml(tmp_path, "cpu")), "--reference"], env)["CUDA_VISIBLE_DEVICES"] == ""
    assert env["CUDA_VISIBLE_DEVICES"] == ""
    gpu: dict[str, str] = {"CUDA_VISIBLE_DEVICES": "0"}
    assert prepare([str(_run_yaml(tmp_path / "g", "gpu"))], gpu) == {} and gpu["CUDA_VISIBLE_DEVICES"] == "0"
    assert prepare([str(tmp_path / "missing.yaml")], {}) == {}  # preflight reports it


def test_python_m_trainer_hides_cuda_before_torch_is_imported(tmp_path) -> None:
    """The entry point, run for real: CUDA_VISIBLE_DEVICES is empty at the moment torch is first imported."""
    probe = tmp_path / "probe"
    probe.mkdir()
    # a sitecustomize hook that records the environment when `torch` is first imported
    (probe / "sitecustomize.py").write_text(
        "import builtins, os\n"
        "_imp = builtins.__import__\n"
        "def _hook(name, *a, **k):\n"
        "    if name == 'torch' and 'torch' not in __import__('sys').modules:\n"
        "        open(os.environ['PROBE_OUT'], 'w').write(repr(os.environ.get('CUDA_VISIBLE_DEVICES')))\n"
        "    return _imp(name, *a, **k)\n"
        "builtins.__import__ = _hook\n"
    )
    out = tmp_path / "seen"
    ry = _run_yaml(tmp_path, "cpu")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(probe), os.environ.get("PYTHONPATH", "")]))
    env.update(PROBE_OUT=str(out), CUDA_VISIBLE_DEVICES="0", WORLD_SIZE="7")  # a launch preflight refuses
    p = subprocess.run(
        trainer(ry),
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 2, p.stderr  # the world-size check ran after torch was imported
    assert out.read_text() == "''"


# -------------------------------------------------------------------------------- GPU precision on CPU


@pytest.mark.parametrize("model", ["tiny", "tiny-moe"])
def test_the_local_backend_builds_with_a_gpu_runs_precision(model) -> None:
    p = subprocess.run(
        [sys.executable, str(HERE / "gpu_precision_worker.py"), model],
        capture_output=True,
        text=True,
        timeout=300,
        env=worker_env(),
    )
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["backend"] == "local" and not got["te_installed"]
    assert got["llm_dtypes"] == ["torch.bfloat16"] and got["enc_dtypes"] == ["torch.bfloat16"]
    assert got["vit_fused"]["bias_dropout_fusion"]
    # exact GELU (the ViT's and the projector's) is not fused into megatron's tanh-approximating kernel: the
    # built MLPs, in fp32 with a GPU run's settings, equal fc2(F.gelu(fc1(x) + b1)) exactly
    assert set(got["gelu_gap"]) >= {"projector", "vit"}, got["gelu_gap"]
    assert max(got["gelu_gap"].values()) == 0.0, got["gelu_gap"]
    assert not got["vit_fused"]["bias_activation_fusion"]
    assert not got["vit_fused"]["apply_rope_fusion"]  # RoPE fusion comes from TE
    assert not any("TE" in c for c in got["layer_classes"]), got["layer_classes"]
    if model == "tiny-moe":
        assert not got["llm_fused"]["bias_activation_fusion"]  # no linear biases in the MoE LLM
        assert not got["grouped_gemm"] and got["expert_modules"] == ["SequentialMLP"]

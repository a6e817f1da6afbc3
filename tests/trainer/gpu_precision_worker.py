"""Builds both modules on the CPU with the settings a GPU run without Transformer Engine gets (bf16 params,
the local layer backend, the GPU's fused kernels); prints one JSON line of what was built.

A separate process: the CPU shims patch torch process-wide. Usage: python gpu_precision_worker.py MODEL"""

from __future__ import annotations

import datetime
import json
import os
import sys

import torch.distributed as dist

import mimo_jobs.trainer.model.models as M
import mimo_jobs.trainer.parallel.grids as G
from mimo_jobs.model.presets import get_preset
from mimo_jobs.trainer import cuda_shims
from mimo_jobs.trainer.model.kernels import installed, kernels_for


def gelu_gap(preset, pgc, kernels) -> dict[str, float]:
    """The encoder built in fp32 with a GPU run's kernels: for every megatron MLP (the ViT's, the projector),
    the largest |MLP(x) - fc2(F.gelu(fc1(x) + b1))| by top-level module, at inputs spread over GELU's range.
    megatron's fused bias-GELU (the tanh approximation) is up to ~5e-4 off exact GELU."""
    import torch
    import torch.nn.functional as F
    from megatron.core.transformer.mlp import MLP

    prec = M.Precision(use_gpu=True, bf16=False, kernels=kernels)
    vit_cfg, proj_cfg = M.encoder_configs(preset, 1, prec)
    vit_cfg.use_cpu_initialization = proj_cfg.use_cpu_initialization = True
    enc = M.build_encoder(preset, vit_cfg, proj_cfg, pgc, prec)
    gaps: dict[str, float] = {}
    torch.manual_seed(0)
    with torch.no_grad():
        for name, m in enc.named_modules():
            if not isinstance(m, MLP) or m.config.activation_func is not F.gelu:
                continue
            x = 3 * torch.randn(16, 2, m.linear_fc1.input_size)
            got, _ = m(x)
            h, b1 = m.linear_fc1(x)
            ref, _ = m.linear_fc2(F.gelu(h if b1 is None else h + b1))
            key = name.split(".")[0] or "mlp"
            gaps[key] = max(gaps.get(key, 0.0), float((got - ref).abs().max()))
    return gaps


def main(model: str) -> dict:
    cuda_shims.install()
    os.environ.update(WORLD_SIZE="1", RANK="0")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    from megatron.core import parallel_state

    parallel_state._set_global_memory_buffer()
    enc_s, llm_s = G.ModuleShape(G.ENCODER, 0, 1, 1, 1), G.ModuleShape(G.LANGUAGE, 0, 1, 1, 1)
    grids = G.build_grids({"vision": enc_s}, llm_s, "gloo", datetime.timedelta(seconds=60))
    have = installed()
    prec = M.Precision(use_gpu=True, bf16=True, kernels=kernels_for(True, have))
    preset = get_preset(model)
    cfg = M.llm_config(preset, 1, 1, 1, prec)
    cfg.use_cpu_initialization = True  # built on the CPU: everything else is the GPU run's config
    gpt = M.build_llm(preset, cfg, grids.language.pgc, prec, 32)
    vit_cfg, proj_cfg = M.encoder_configs(preset, 1, prec)
    vit_cfg.use_cpu_initialization = proj_cfg.use_cpu_initialization = True
    enc = M.build_encoder(preset, vit_cfg, proj_cfg, grids.encoders["vision"].pgc, prec)
    M.canonical_init_(gpt, 1, "language", 0, 1, 0, 1, 0, preset.llm.num_experts or 0)
    fused = ("bias_activation_fusion", "bias_dropout_fusion", "masked_softmax_fusion", "apply_rope_fusion")
    out = {
        "te_installed": have.te,
        "backend": prec.kernels.backend,
        "describe": prec.kernels.describe(),
        "llm_dtypes": sorted({str(p.dtype) for p in gpt.parameters()}),
        "enc_dtypes": sorted({str(p.dtype) for p in enc.parameters()}),
        "llm_fused": {k: getattr(cfg, k) for k in fused},
        "vit_fused": {k: getattr(vit_cfg, k) for k in fused},
        "grouped_gemm": bool(getattr(cfg, "moe_grouped_gemm", False)),
        "expert_modules": sorted(
            {type(m).__name__ for n, m in gpt.named_modules() if n.endswith("mlp.experts")}
        ),
        "layer_classes": sorted({type(m).__name__ for m in gpt.modules() if "Linear" in type(m).__name__}),
        "gelu_gap": gelu_gap(preset, grids.encoders["vision"].pgc, prec.kernels),
    }
    dist.destroy_process_group()
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])), flush=True)
    sys.stdout.flush()
    os._exit(0)

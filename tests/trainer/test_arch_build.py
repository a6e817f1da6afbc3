"""The trainer builds every feature of the model description with megatron-core (CPU, one process, fp32):
each real public preset, shrunk to CPU size with its features kept, builds, trains a step and holds the
parameters its description says; the canonical init cuts a gated MLP's fc1 per TP rank as megatron-core
stacks it; the pixel shuffle gives the token count of EncoderArch.tokens_for.

The builds run in a child process (this file is also its worker): the CPU shims patch torch process-wide.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from helpers.launch import worker_env
from mimo_jobs.model.arch import EncoderArch, LLMArch, ModelArch
from mimo_jobs.model.presets import ENCODERS, LLMS, PRESETS

SEQ, SIDE = 32, 16


def shrink_llm(p: LLMArch) -> LLMArch:
    """The same features at CPU size: 2 layers (the first dense when the real model has dense layers),
    4 heads over 2 KV groups when it uses GQA, head_dim 16 when it sets one, at most 4 experts top-2."""
    kw = dict(num_layers=2, hidden_size=64, num_attention_heads=4, ffn_hidden_size=96, vocab_size=256)
    if p.num_query_groups is not None and p.num_query_groups < p.num_attention_heads:
        kw["num_query_groups"] = 2
    if p.kv_channels is not None:
        kw["kv_channels"] = 16
    if p.num_experts:
        kw |= dict(num_experts=4, moe_router_topk=min(p.moe_router_topk, 2), moe_ffn_hidden_size=32)
        if p.moe_shared_expert_intermediate_size:
            kw["moe_shared_expert_intermediate_size"] = 48
        if p.moe_layer_pattern is not None:
            kw["moe_layer_pattern"] = (0, 1) if 0 in p.moe_layer_pattern else (1, 1)
    return replace(p, **kw)


def shrink_encoder(e: EncoderArch, downsample: int = 1) -> EncoderArch:
    return replace(
        e,
        num_layers=2,
        hidden_size=32,
        num_attention_heads=4,
        ffn_hidden_size=64,
        patch_size=4,
        image_size=SIDE,
        downsample=downsample,
    )


def _run_worker(archs: list[ModelArch], tmp_path: Path) -> list[dict]:
    spec = tmp_path / "archs.json"
    spec.write_text(json.dumps([a.to_dict() for a in archs]))
    p = subprocess.run(
        [sys.executable, __file__, str(spec)],
        capture_output=True,
        text=True,
        timeout=300,
        env=worker_env(),
    )
    assert p.returncode == 0, p.stderr[-6000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def _real_pairs() -> list[ModelArch]:
    """Every real LLM, each with a real encoder (both encoders used, one with a 2x2 pixel shuffle)."""
    encs = [shrink_encoder(ENCODERS[n], d) for n in sorted(ENCODERS) for d in (1, 2)]
    return [
        ModelArch(name=n, encoder=encs[i % len(encs)], llm=shrink_llm(LLMS[n]))
        for i, n in enumerate(sorted(LLMS))
    ]


def test_every_real_preset_shrunk_builds_and_trains_a_step(tmp_path):
    archs = _real_pairs()
    got = _run_worker(archs, tmp_path)
    for a, g in zip(archs, got):
        lp, e = a.llm, a.encoder
        assert g["loss"] > 0 and g["grad_finite"], (a.name, g)
        assert g["image_tokens"] == e.tokens_for(SIDE, SIDE), a.name
        # the built modules hold what the description says
        assert g["class_token"] == e.class_token and g["final_norm"] == e.final_norm, a.name
        assert g["pre_norm"] == e.pre_norm and g["patch_bias"] == e.patch_bias, a.name
        assert g["qk_norm"] == lp.qk_layernorm and g["qkv_bias"] == lp.add_qkv_bias, a.name
        assert g["rms_norm"] == (lp.normalization == "RMSNorm"), a.name
        if lp.moe_layers < lp.num_layers:  # a dense MLP: SwiGLU's fc1 holds gate and up
            assert g["fc1_rows"] == lp.ffn_hidden_size * (2 if lp.gated_linear_unit else 1), a.name
        assert g["qkv_rows"] == (lp.num_attention_heads + 2 * lp.query_groups) * lp.head_dim, a.name
        assert g["moe_layers"] == lp.moe_layers and g["shared_experts"] == bool(
            lp.moe_shared_expert_intermediate_size
        ), a.name
        assert g["tied"] == lp.tie_word_embeddings, a.name
        assert g["projector_in"] == e.projector_input, a.name


def test_cpu_variants_build_their_features(tmp_path):
    # the packaged CPU toys the parity tests train: SwiGLU/RMSNorm/QK-norm/GQA + pixel shuffle; MoE with a
    # dense first layer, a shared expert and an un-renormalised softmax router; and a tied, sigmoid variant
    sig = replace(
        PRESETS["tiny-moe-shared"].llm,
        tie_word_embeddings=True,
        moe_router_score_function="sigmoid",
        moe_router_pre_softmax=False,
    )
    archs = [PRESETS["tiny-swiglu"], PRESETS["tiny-moe-shared"], replace(PRESETS["tiny-moe-shared"], llm=sig)]
    got = _run_worker(archs, tmp_path)
    assert got[0]["image_tokens"] == 4 and got[0]["projector_in"] == 4 * 32
    assert got[1]["moe_layers"] == 1 and got[1]["shared_experts"] and got[1]["router"] == ["softmax", True]
    assert got[2]["tied"] and got[2]["router"] == ["sigmoid", False]
    # tied: no output layer of its own, so one vocab x hidden table fewer
    assert got[1]["params_llm"] - got[2]["params_llm"] == 128 * 32


def test_gated_fc1_is_cut_per_tp_rank_as_gate_and_up_shards():
    import torch

    from mimo_jobs.trainer.model.models import canonical_init_

    class Fc1(torch.nn.Module):
        def __init__(self, rows: int, tp: bool):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.empty(rows, 3))
            self.weight.tensor_model_parallel, self.weight.partition_dim = tp, 0
            self.weight.partition_stride = 2  # as megatron-core marks a gated fc1

    def mlp(rows: int, tp: bool):
        m = torch.nn.Module()
        m.linear_fc1 = Fc1(rows, tp)
        return m

    full = mlp(8, False)  # [gate (4); up (4)]
    canonical_init_(full, 3, "t", 0, 1)
    gate, up = full.linear_fc1.weight.detach().chunk(2)
    for r in range(2):
        shard = mlp(4, True)
        canonical_init_(shard, 3, "t", r, 2)
        want = torch.cat([gate[2 * r : 2 * r + 2], up[2 * r : 2 * r + 2]])
        assert torch.equal(shard.linear_fc1.weight.detach(), want), r


def test_pixel_shuffle_merges_each_s_by_s_block_into_one_token():
    import torch

    from mimo_jobs.trainer.model.models import pixel_shuffle

    py, px, s, h = 4, 6, 2, 3
    y = torch.arange(py * px * h, dtype=torch.float32).reshape(1, py * px, h)
    out = pixel_shuffle(y, py, px, s)
    e = replace(PRESETS["tiny-swiglu"].encoder, patch_size=1, image_size=12)
    assert out.shape == (1, e.tokens_for(py, px), s * s * h)
    grid = y.reshape(py, px, h)
    # token (1, 2) of the 2 x 3 output grid holds patches (2..3, 4..5), row-major
    want = torch.cat([grid[2, 4], grid[2, 5], grid[3, 4], grid[3, 5]])
    assert torch.equal(out[0, 1 * 3 + 2], want)


def test_the_trainer_refuses_what_it_cannot_build_by_field():
    from mimo_jobs.study.topology import Layout, ModuleShape
    from mimo_jobs.trainer.model.models import unsupported

    def lay(**kw):
        base = dict(
            nodes=1, gpus_per_node=8, encoders=(ModuleShape("vision", 1, 1, 1),), llm_tp=1, llm_pp=1, llm_dp=1
        )
        return Layout(**(base | kw))

    swiglu = PRESETS["tiny-swiglu"]
    tied = replace(swiglu, llm=replace(swiglu.llm, tie_word_embeddings=True))
    assert unsupported(tied, lay(llm_tp=2)) is None
    assert "tie_word_embeddings" in unsupported(tied, lay(llm_pp=2))
    assert "num_query_groups" in unsupported(swiglu, lay(llm_tp=4))  # 2 KV groups over 4 ranks
    top1 = replace(swiglu, llm=replace(PRESETS["tiny-moe"].llm, moe_router_topk=1))
    assert "moe_router_pre_softmax" in unsupported(top1, lay())
    assert unsupported(replace(top1, llm=replace(top1.llm, moe_router_pre_softmax=True)), lay()) is None


# ------------------------------------------------------------------------------------------------ worker


def _describe(arch: ModelArch) -> dict:
    import datetime

    import torch
    import torch.distributed as dist

    import mimo_jobs.trainer.model.models as M
    import mimo_jobs.trainer.parallel.grids as G
    from mimo_jobs.trainer.build import _seed_megatron
    from mimo_jobs.trainer.step.common import _causal_mask

    if not dist.is_initialized():
        os.environ.update(WORLD_SIZE="1", RANK="0")
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    enc_s, llm_s = G.ModuleShape(G.ENCODER, 0, 1, 1, 1), G.ModuleShape(G.LANGUAGE, 0, 1, 1, 1)
    grids = G.build_grids({"vision": enc_s}, llm_s, "gloo", datetime.timedelta(seconds=60))
    _seed_megatron(grids, 1)
    prec = M.Precision(use_gpu=False, bf16=False)
    cfg = M.llm_config(arch, 1, 1, 1, prec)
    gpt = M.build_llm(arch, cfg, grids.language.pgc, prec, SEQ)
    vit_cfg, proj_cfg = M.encoder_configs(arch, 1, prec)
    enc = M.build_encoder(arch, vit_cfg, proj_cfg, grids.encoders["vision"].pgc, prec)
    M.canonical_init_(gpt, 1, "language", 0, 1, 0, 1, 0, arch.llm.num_experts)
    M.canonical_init_(enc, 1, "encoder", 0, 1)
    g = torch.Generator().manual_seed(0)
    img = torch.randn(arch.encoder.channels, SIDE, SIDE, generator=g)
    emb = enc([img])
    tokens = torch.randint(2, arch.llm.vocab_size - 1, (1, SEQ), generator=g)
    loss = (
        gpt(
            input_ids=tokens,
            position_ids=torch.arange(SEQ)[None],
            attention_mask=_causal_mask(SEQ, "cpu"),
            labels=tokens,
        ).sum()
        / SEQ
        + emb.float().pow(2).mean()
    )
    loss.backward()
    names = dict(gpt.named_parameters())
    layer0 = gpt.decoder.layers[0]
    router = next((m for m in gpt.modules() if type(m).__name__ == "TopKRouter"), None)
    fc1 = next(
        (m.linear_fc1 for n, m in gpt.named_modules() if n.endswith("mlp") and hasattr(m, "linear_fc1")), None
    )
    return {
        "loss": float(loss),
        "grad_finite": all(torch.isfinite(p.grad).all() for p in gpt.parameters() if p.grad is not None),
        "image_tokens": emb.shape[0],
        "class_token": enc.vit.add_class_token,
        "pre_norm": enc.vit.ln_pre is not None,
        "final_norm": enc.vit.ln_post is not None,
        "patch_bias": enc.vit.embedder.bias is not None,
        "qk_norm": not isinstance(layer0.self_attention.q_layernorm, type(None))
        and type(layer0.self_attention.q_layernorm).__name__ != "IdentityOp",
        "qkv_bias": layer0.self_attention.linear_qkv.bias is not None,
        "qkv_rows": layer0.self_attention.linear_qkv.weight.shape[0],
        "rms_norm": isinstance(layer0.input_layernorm, torch.nn.RMSNorm),
        "fc1_rows": fc1.weight.shape[0] if fc1 is not None else 0,
        "moe_layers": sum(type(la.mlp).__name__ == "MoELayer" for la in gpt.decoder.layers),
        "shared_experts": any("shared_experts" in n for n in names),
        "router": [router.config.moe_router_score_function, router.config.moe_router_pre_softmax]
        if router
        else None,
        "tied": gpt.share_embeddings_and_output_weights,
        "projector_in": enc.projector.encoder.linear_fc1.weight.shape[1],
        "params_llm": sum(p.numel() for p in gpt.parameters()),
    }


def _worker(spec: str) -> None:
    from mimo_jobs.trainer import cuda_shims

    cuda_shims.install()
    out = [_describe(ModelArch.from_dict(d)) for d in json.loads(Path(spec).read_text())]
    print(json.dumps(out), flush=True)
    os._exit(0)


if __name__ == "__main__":
    _worker(sys.argv[1])

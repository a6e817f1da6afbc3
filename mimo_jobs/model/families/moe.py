"""The MoE decoders: Qwen2-MoE, Qwen3-MoE and Mixtral (transformers' configuration_qwen2_moe.py,
configuration_qwen3_moe.py, configuration_mixtral.py). Experts are read in the per-expert layout published
checkpoints and transformers' save_pretrained write (`experts.<e>.gate_proj.weight`, ...). Qwen2-MoE: dense
layers (`mlp_only_layers`), a gated shared expert, an un-renormalised router by default; Qwen3-MoE: the
per-head q/k norm, a renormalised router by default; Mixtral: its own names (`block_sparse_moe`, `w1`/`w3`/
`w2`), every layer MoE, a renormalised router, sliding window refused unless turned off."""

from __future__ import annotations

from mimo_jobs.model.arch import ArchError, LLMArch
from mimo_jobs.model.families.base import register, req
from mimo_jobs.model.families.decoder import NAMES, DecoderFamily

_QWEN_FULL_ATTENTION = {"use_sliding_window": False}


@register
class Qwen2Moe(DecoderFamily):
    name = "qwen2_moe"
    title = "Qwen2-MoE"
    features = "experts, dense layers (`mlp_only_layers`), gated shared expert, q/k/v biases"
    architecture = "Qwen2MoeForCausalLM"
    moe = True
    qkv_bias_only = True
    shared_expert = True
    bias_fields = ()
    full_attention = _QWEN_FULL_ATTENTION


@register
class Qwen3Moe(DecoderFamily):
    name = "qwen3_moe"
    title = "Qwen3-MoE"
    features = "experts, dense layers (`mlp_only_layers`, `decoder_sparse_step`), QK-norm"
    architecture = "Qwen3MoeForCausalLM"
    moe = True
    qk_norm = True
    norm_topk_default = True
    full_attention = _QWEN_FULL_ATTENTION


@register
class Mixtral(DecoderFamily):
    name = "mixtral"
    title = "Mixtral"
    features = "experts (`w1`, `w3`, `w2`)"
    architecture = "MixtralForCausalLM"
    moe = True
    sliding_default = True
    dense_layers = False
    hf = NAMES | {
        "router": "block_sparse_moe.gate",
        "experts": "block_sparse_moe.experts.{e}.",
        "expert_gate": "w1",
        "expert_up": "w3",
        "expert_down": "w2",
    }

    def moe_fields(self, cfg: dict) -> dict:
        return {
            "num_experts": int(req(cfg, "num_local_experts")),
            "moe_router_topk": int(req(cfg, "num_experts_per_tok")),
            "moe_ffn_hidden_size": int(req(cfg, "intermediate_size")),
        }

    def moe_config(self, p: LLMArch) -> dict:
        if p.moe_router_pre_softmax or p.moe_layer_pattern is not None:
            raise ArchError(
                "moe_router_pre_softmax", "Mixtral renormalises its top-k and has no dense layers"
            )
        return {
            "num_local_experts": p.num_experts,
            "intermediate_size": p.expert_ffn,
            "num_experts_per_tok": p.moe_router_topk,
            "sliding_window": None,
        }

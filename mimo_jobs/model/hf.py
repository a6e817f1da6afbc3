"""A HuggingFace transformers config.json (as a dict) -> EncoderArch / LLMArch fields.

The family comes from `architectures` (or `model_type` when that is absent). Every field the trainer cannot
build is refused by name rather than priced as something else. Field meanings follow transformers'
configuration classes (configuration_llama.py, configuration_qwen2_moe.py, configuration_clip.py, ...).
"""

from __future__ import annotations

from mimo_jobs.model.arch import ArchError

LLM_FAMILIES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen2MoeForCausalLM": "qwen2_moe",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "MixtralForCausalLM": "mixtral",
}
ENCODER_FAMILIES = {
    "CLIPVisionModel": "clip_vision_model",
    "CLIPModel": "clip",
    "SiglipVisionModel": "siglip_vision_model",
    "SiglipModel": "siglip",
}
# Families the trainer cannot build, by the feature that stops it.
REFUSED = {
    "deepseek_v2": "multi-head latent attention (MLA)",
    "deepseek_v3": "multi-head latent attention (MLA)",
    "mamba": "Mamba layers",
    "mamba2": "Mamba layers",
    "jamba": "Mamba layers",
    "nemotron_h": "Mamba layers",
    "falcon_h1": "Mamba layers",
    "zamba": "Mamba layers",
    "zamba2": "Mamba layers",
}
_REFUSED_ARCH = {
    "DeepseekV2ForCausalLM": "deepseek_v2",
    "DeepseekV3ForCausalLM": "deepseek_v3",
    "MambaForCausalLM": "mamba",
    "Mamba2ForCausalLM": "mamba2",
    "JambaForCausalLM": "jamba",
    "NemotronHForCausalLM": "nemotron_h",
    "FalconH1ForCausalLM": "falcon_h1",
}
_MOE = {"qwen2_moe", "qwen3_moe", "mixtral"}
_ENC_ACT = {"quick_gelu": "quick_gelu", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}


def family(cfg: dict, families: dict[str, str]) -> str:
    """The model_type the config describes, refusing unknown and unbuildable families by name."""
    if not isinstance(cfg, dict):
        raise ArchError("", f"a HuggingFace config is a JSON object, got {type(cfg).__name__}")
    archs = cfg.get("architectures") or []
    known = set(families.values())
    for a in archs:
        if a in families:
            return families[a]
        if a in _REFUSED_ARCH:
            mt = _REFUSED_ARCH[a]
            raise ArchError("architectures", f"{a} has {REFUSED[mt]}, which the trainer cannot build")
    mt = cfg.get("model_type")
    if mt in REFUSED:
        raise ArchError("model_type", f"{mt!r} has {REFUSED[mt]}, which the trainer cannot build")
    if not archs and mt in known:
        return mt
    what = f"architectures {archs}" if archs else f"model_type {mt!r}"
    raise ArchError(
        "architectures" if archs else "model_type",
        f"unknown architecture ({what}); supported: {', '.join(families)}",
    )


def _req(cfg: dict, key: str):
    if cfg.get(key) is None:
        raise ArchError(key, "missing from the HuggingFace config")
    return cfg[key]


def _rope_theta(cfg: dict) -> float:
    """RoPE base: top-level `rope_theta` (config.json as published) or transformers 5's `rope_parameters`."""
    rp = cfg.get("rope_parameters") or {}
    scaling = cfg.get("rope_scaling") or (rp if rp.get("rope_type", "default") != "default" else None)
    if scaling and scaling.get("rope_type", scaling.get("type", "default")) != "default":
        kind = scaling.get("rope_type", scaling.get("type"))
        raise ArchError("rope_scaling", f"RoPE scaling of type {kind!r} is not built by the trainer")
    return float(cfg.get("rope_theta", rp.get("rope_theta", 10000.0)))


def _refuse_sliding_window(cfg: dict, fam: str) -> None:
    sw = cfg.get("sliding_window")
    # Qwen2/Qwen3 carry a sliding_window size but only use it with use_sliding_window (off in released models)
    enabled = cfg.get("use_sliding_window", fam in ("mistral", "mixtral")) and sw is not None
    layer_types = cfg.get("layer_types") or []
    if enabled or "sliding_attention" in layer_types:
        raise ArchError(
            "sliding_window",
            f"sliding-window attention (sliding_window={sw}) is not built by the trainer; set "
            "use_sliding_window false (or sliding_window null) in the config to train with full attention",
        )


def _biases(cfg: dict, fam: str) -> dict:
    if fam in ("qwen2", "qwen2_moe"):
        # Qwen2's attention: biased q, k, v projections, an unbiased output projection and MLP
        return {"add_qkv_bias": True, "add_bias_linear": False}
    attn, mlp = bool(cfg.get("attention_bias", False)), bool(cfg.get("mlp_bias", False))
    if attn != mlp:
        field = "attention_bias" if attn else "mlp_bias"
        raise ArchError(
            field,
            "attention_bias and mlp_bias differ: megatron-core's add_bias_linear biases the attention output "
            "and the MLP together, so this mix cannot be built",
        )
    return {"add_qkv_bias": attn, "add_bias_linear": attn}


def _moe(cfg: dict, fam: str) -> dict:
    layers = int(_req(cfg, "num_hidden_layers"))
    if fam == "mixtral":
        n = int(_req(cfg, "num_local_experts"))
        return {
            "num_experts": n,
            "moe_router_topk": int(_req(cfg, "num_experts_per_tok")),
            "moe_ffn_hidden_size": int(_req(cfg, "intermediate_size")),
        }
    # transformers 5 writes Qwen3-MoE's num_experts as num_local_experts (its attribute map); published
    # config.json files say num_experts
    experts = cfg.get("num_experts") or cfg.get("num_local_experts")
    out = {
        "num_experts": int(experts if experts is not None else _req(cfg, "num_experts")),
        "moe_router_topk": int(_req(cfg, "num_experts_per_tok")),
        "moe_ffn_hidden_size": int(_req(cfg, "moe_intermediate_size")),
        # norm_topk_prob false: softmax over all experts, top-k kept without renormalising
        "moe_router_pre_softmax": not cfg.get("norm_topk_prob", fam == "qwen3_moe"),
    }
    step = int(cfg.get("decoder_sparse_step", 1) or 1)
    dense = set(cfg.get("mlp_only_layers") or [])
    pattern = tuple(0 if i in dense or (i + 1) % step else 1 for i in range(layers))
    if 0 in pattern:
        out["moe_layer_pattern"] = pattern
    shared = cfg.get("shared_expert_intermediate_size") or 0
    if fam == "qwen2_moe" and shared:
        out["moe_shared_expert_intermediate_size"] = int(shared)
        out["moe_shared_expert_gate"] = True
    return out


def llm_fields(cfg: dict) -> dict:
    """LLMArch fields of a causal-LM config.json."""
    fam = family(cfg, LLM_FAMILIES)
    if cfg.get("kv_lora_rank"):
        raise ArchError("kv_lora_rank", "multi-head latent attention (MLA) is not built by the trainer")
    _refuse_sliding_window(cfg, fam)
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise ArchError("hidden_act", f"{act!r}: the trainer builds these families' gated MLP with SiLU only")
    heads = int(_req(cfg, "num_attention_heads"))
    hidden = int(_req(cfg, "hidden_size"))
    head_dim = cfg.get("head_dim")
    out = {
        "num_layers": int(_req(cfg, "num_hidden_layers")),
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_query_groups": int(cfg.get("num_key_value_heads") or heads),
        "kv_channels": int(head_dim) if head_dim and int(head_dim) * heads != hidden else None,
        "ffn_hidden_size": int(_req(cfg, "intermediate_size")),
        "vocab_size": int(_req(cfg, "vocab_size")),
        "activation": "silu",
        "gated_linear_unit": True,
        "normalization": "RMSNorm",
        "norm_epsilon": float(cfg.get("rms_norm_eps", 1e-6)),
        "qk_layernorm": fam in ("qwen3", "qwen3_moe"),
        "rotary_base": _rope_theta(cfg),
        "tie_word_embeddings": bool(cfg.get("tie_word_embeddings", False)),
        **_biases(cfg, fam),
    }
    if fam in _MOE:
        out |= _moe(cfg, fam)
    return out


def encoder_fields(cfg: dict) -> dict:
    """EncoderArch fields of a CLIP/SigLIP vision config, or of a full CLIP/SigLIP config's vision_config."""
    fam = family(cfg, ENCODER_FAMILIES)
    if fam in ("clip", "siglip"):
        vc = cfg.get("vision_config")
        if not isinstance(vc, dict):
            raise ArchError("vision_config", f"missing from the {fam} config")
        cfg, fam = vc, f"{fam}_vision_model"
    act = cfg.get("hidden_act", "quick_gelu" if fam == "clip_vision_model" else "gelu_pytorch_tanh")
    if act not in _ENC_ACT:
        raise ArchError("hidden_act", f"{act!r} is not one of {', '.join(_ENC_ACT)}")
    clip = fam == "clip_vision_model"
    return {
        "kind": "clip" if clip else "siglip",
        "num_layers": int(_req(cfg, "num_hidden_layers")),
        "hidden_size": int(_req(cfg, "hidden_size")),
        "num_attention_heads": int(_req(cfg, "num_attention_heads")),
        "ffn_hidden_size": int(_req(cfg, "intermediate_size")),
        "patch_size": int(_req(cfg, "patch_size")),
        "image_size": int(_req(cfg, "image_size")),
        "channels": int(cfg.get("num_channels", 3)),
        "class_token": clip,
        "activation": _ENC_ACT[act],
        "normalization": "LayerNorm",
        "norm_epsilon": float(cfg.get("layer_norm_eps", 1e-5 if clip else 1e-6)),
        "pre_norm": clip,
        "final_norm": True,
        "patch_bias": not clip,
    }

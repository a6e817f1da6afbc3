"""Tiny random HuggingFace models written by transformers' own save_pretrained (no download): every
parameter, norms and biases included, drawn at random so a wrong mapping shows in the outputs."""

from __future__ import annotations

from pathlib import Path

SMALL = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, vocab_size=250)


def llm_config(family: str):
    import transformers as T

    small = dict(SMALL, num_key_value_heads=2)
    return {
        "llama": lambda: T.LlamaConfig(**small, attention_bias=True, mlp_bias=True),
        "llama-tied": lambda: T.LlamaConfig(**small, tie_word_embeddings=True),
        "qwen2": lambda: T.Qwen2Config(**small),
        "qwen3": lambda: T.Qwen3Config(**small, head_dim=32),
        "qwen2_moe": lambda: T.Qwen2MoeConfig(
            **small,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=40,
            shared_expert_intermediate_size=72,
            mlp_only_layers=[0],
            norm_topk_prob=False,
        ),
        "qwen3_moe": lambda: T.Qwen3MoeConfig(
            **small, head_dim=32, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=40
        ),
        "mixtral": lambda: T.MixtralConfig(**small, num_local_experts=4, num_experts_per_tok=2),
    }[family]()


def encoder_config(kind: str):
    import transformers as T

    small = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)
    if kind == "clip":
        return T.CLIPVisionConfig(**small, image_size=16, patch_size=4)
    if (
        kind == "internvit"
    ):  # InternViT-300M's switches: biased q/k/v, LayerNorm, mean pooling (no final norm)
        return T.InternVLVisionConfig(**small, image_size=16, patch_size=4, attention_bias=True)
    return T.SiglipVisionConfig(**small, image_size=16, patch_size=4)


def randomize_(model, seed: int) -> None:
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            # norms around 1 and the rest small, so every layer matters and nothing saturates
            p.copy_(1 + 0.1 * noise if "norm" in name and p.dim() == 1 else 0.05 * noise)


def save_llm(family: str, out: Path, seed: int = 0, max_shard_size: str | None = None) -> Path:
    import transformers as T

    cfg = llm_config(family)
    model = T.AutoModelForCausalLM.from_config(cfg)
    randomize_(model, seed)
    kw = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(out, **kw)
    return out


def save_encoder(kind: str, out: Path, seed: int = 0) -> Path:
    import transformers as T

    cfg = encoder_config(kind)
    cls = {"clip": T.CLIPVisionModel, "internvit": T.InternVLVisionModel}.get(kind, T.SiglipVisionModel)
    model = cls(cfg)
    randomize_(model, seed)
    model.save_pretrained(out)
    return out


def share_bytes(src, d, a: str, b: str):
    """A copy of the HF directory `src` whose safetensors header points tensor `b` at tensor `a`'s bytes."""
    import json
    import shutil

    shutil.copytree(src, d)
    raw = (d / "model.safetensors").read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    header[b]["data_offsets"] = header[a]["data_offsets"]
    text = json.dumps(header).encode()
    (d / "model.safetensors").write_bytes(len(text).to_bytes(8, "little") + text + raw[8 + n :])
    return d

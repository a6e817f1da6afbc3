"""Model presets: pure data (no torch), shared by the CLI (validation, planning, MFU in reports) and the
trainer.

A preset names the encoder (ViT + MLP projector) and the language model (dense or MoE GPT). Their FLOPs,
parameters and memory are computed from these shapes by mimo_jobs/predict.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class EncoderPreset:
    kind: str  # "clip" (megatron CLIPViTModel) or "radio"
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    ffn_hidden_size: int
    patch_size: int
    image_size: int  # max side in pixels; images are padded/cropped to multiples of patch_size
    channels: int = 3


@dataclass(frozen=True)
class LLMPreset:
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    ffn_hidden_size: int
    vocab_size: int
    num_experts: int = 0  # 0 = dense
    moe_router_topk: int = 2
    moe_ffn_hidden_size: int | None = None
    num_query_groups: int | None = None


@dataclass(frozen=True)
class ModelPreset:
    name: str
    encoder: EncoderPreset
    llm: LLMPreset
    description: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


PRESETS: dict[str, ModelPreset] = {
    "tiny": ModelPreset(
        name="tiny",
        description="CPU-sized dense model for tests and the README's main job",
        encoder=EncoderPreset(
            "clip",
            num_layers=2,
            hidden_size=32,
            num_attention_heads=4,
            ffn_hidden_size=64,
            patch_size=4,
            image_size=16,
        ),
        llm=LLMPreset(
            num_layers=2, hidden_size=32, num_attention_heads=4, ffn_hidden_size=64, vocab_size=128
        ),
    ),
    "tiny-moe": ModelPreset(
        name="tiny-moe",
        description="CPU-sized MoE model (4 experts, top-2) for expert-parallel tests",
        encoder=EncoderPreset(
            "clip",
            num_layers=2,
            hidden_size=32,
            num_attention_heads=4,
            ffn_hidden_size=64,
            patch_size=4,
            image_size=16,
        ),
        llm=LLMPreset(
            num_layers=2,
            hidden_size=32,
            num_attention_heads=4,
            ffn_hidden_size=64,
            vocab_size=128,
            num_experts=4,
            moe_router_topk=2,
            moe_ffn_hidden_size=64,
        ),
    ),
    "dense-1b": ModelPreset(
        name="dense-1b",
        description="~1B dense LLM + ViT-L/14-sized encoder (GPU)",
        encoder=EncoderPreset(
            "clip",
            num_layers=24,
            hidden_size=1024,
            num_attention_heads=16,
            ffn_hidden_size=4096,
            patch_size=14,
            image_size=336,
        ),
        llm=LLMPreset(
            num_layers=16,
            hidden_size=2048,
            num_attention_heads=16,
            ffn_hidden_size=8192,
            vocab_size=32768,
            num_query_groups=8,
        ),
    ),
    "moe-8x1b": ModelPreset(
        name="moe-8x1b",
        description="MoE LLM, 64 experts top-2 (expert-parallel up to 64) + ViT-L/14-sized encoder (GPU)",
        encoder=EncoderPreset(
            "clip",
            num_layers=24,
            hidden_size=1024,
            num_attention_heads=16,
            ffn_hidden_size=4096,
            patch_size=14,
            image_size=336,
        ),
        llm=LLMPreset(
            num_layers=16,
            hidden_size=2048,
            num_attention_heads=16,
            ffn_hidden_size=8192,
            vocab_size=32768,
            num_experts=64,
            moe_router_topk=2,
            moe_ffn_hidden_size=1024,
            num_query_groups=8,
        ),
    ),
}


def get_preset(name: str) -> ModelPreset:
    try:
        return PRESETS[name]
    except KeyError:
        raise KeyError(f"unknown model preset {name!r}; known: {', '.join(sorted(PRESETS))}") from None

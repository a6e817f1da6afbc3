"""Packaged model descriptions: the CPU toys and GPU shapes of full models (PRESETS), and the encoders and
LLMs of real public models (ENCODERS, LLMS), each with the config.json it restates in `source`.

A study names a full model (`model: tiny`) or one module per side (`model: {encoder: clip-vit-l-14-336,
llm: qwen3-8b}`); a full model's name also stands for either of its modules.
"""

from __future__ import annotations

from mimo_jobs.model import families
from mimo_jobs.model.arch import ArchError, EncoderArch, LLMArch, ModelArch
from mimo_jobs.model.audio_arch import AudioArch

_HF = "https://huggingface.co/{}/blob/main/config.json"

# The trainer's original encoder: megatron-core's RADIO ViT without a class token or outer norms.
_TINY_ENC = EncoderArch(
    "clip",
    num_layers=2,
    hidden_size=32,
    num_attention_heads=4,
    ffn_hidden_size=64,
    patch_size=4,
    image_size=16,
    class_token=False,
)
_VIT_L_ENC = EncoderArch(
    "clip",
    num_layers=24,
    hidden_size=1024,
    num_attention_heads=16,
    ffn_hidden_size=4096,
    patch_size=14,
    image_size=336,
    class_token=False,
)
_TINY_LLM = dict(num_layers=2, hidden_size=32, num_attention_heads=4, ffn_hidden_size=64, vocab_size=128)
# The features of today's open LLMs at CPU size: SwiGLU, RMSNorm, QK-norm, GQA, head_dim != hidden/heads
_TINY_MODERN = dict(
    _TINY_LLM,
    num_query_groups=2,
    kv_channels=16,
    activation="silu",
    gated_linear_unit=True,
    normalization="RMSNorm",
    norm_epsilon=1e-6,
    qk_layernorm=True,
    rotary_base=1000000.0,
    add_bias_linear=False,
    add_qkv_bias=False,
)

PRESETS: dict[str, ModelArch] = {
    "tiny": ModelArch(
        name="tiny",
        description="CPU-sized dense model for tests and the README's main job",
        encoder=_TINY_ENC,
        llm=LLMArch(**_TINY_LLM),
    ),
    "tiny-moe": ModelArch(
        name="tiny-moe",
        description="CPU-sized MoE model (4 experts, top-2) for expert-parallel tests",
        encoder=_TINY_ENC,
        llm=LLMArch(**_TINY_LLM, num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=64),
    ),
    "tiny-swiglu": ModelArch(
        name="tiny-swiglu",
        description="CPU-sized dense model with SwiGLU, RMSNorm, QK-norm, GQA and head_dim 16, and a "
        "pixel-shuffle (2x2) SigLIP-style encoder",
        encoder=EncoderArch(
            "siglip",
            num_layers=2,
            hidden_size=32,
            num_attention_heads=4,
            ffn_hidden_size=64,
            patch_size=4,
            image_size=16,
            class_token=False,
            activation="gelu_tanh",
            norm_epsilon=1e-6,
            downsample=2,
            final_norm=True,
            patch_bias=True,
        ),
        llm=LLMArch(**_TINY_MODERN),
    ),
    "tiny-moe-shared": ModelArch(
        name="tiny-moe-shared",
        description="CPU-sized Qwen2-MoE-style LLM: a dense first layer, then 4 experts top-2 with a shared "
        "expert, sigmoid-free softmax router without top-k renormalisation",
        encoder=_TINY_ENC,
        llm=LLMArch(
            **_TINY_MODERN,
            num_experts=4,
            moe_router_topk=2,
            moe_ffn_hidden_size=32,
            moe_shared_expert_intermediate_size=48,
            moe_layer_pattern=(0, 1),
            moe_router_pre_softmax=True,
        ),
    ),
    "dense-1b": ModelArch(
        name="dense-1b",
        description="~1B dense LLM + ViT-L/14-sized encoder (GPU)",
        encoder=_VIT_L_ENC,
        llm=LLMArch(
            num_layers=16,
            hidden_size=2048,
            num_attention_heads=16,
            ffn_hidden_size=8192,
            vocab_size=32768,
            num_query_groups=8,
        ),
    ),
    "moe-8x1b": ModelArch(
        name="moe-8x1b",
        description="MoE LLM, 64 experts top-2 (expert-parallel up to 64) + ViT-L/14-sized encoder (GPU)",
        encoder=_VIT_L_ENC,
        llm=LLMArch(
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


def _published(family: str, name: str, repo: str, **config) -> EncoderArch:
    """A public encoder: the values of its published config.json (its vision_config), read by its family
    (model/families), which owns what a family's tower has (class token, norms, biases, layer scale)."""
    return EncoderArch(**families.vision(family).fields(config), name=name, source=_HF.format(repo))


# Real public encoders, restated from their HuggingFace config.json (vision_config).
ENCODERS: dict[str, EncoderArch] = {
    "clip-vit-l-14-336": _published(
        "clip",
        "clip-vit-l-14-336",
        "openai/clip-vit-large-patch14-336",
        hidden_size=1024,
        intermediate_size=4096,
        num_hidden_layers=24,
        num_attention_heads=16,
        patch_size=14,
        image_size=336,
        hidden_act="quick_gelu",
        layer_norm_eps=1e-5,
    ),
    "siglip-so400m-14-384": _published(
        "siglip",
        "siglip-so400m-14-384",
        "google/siglip-so400m-patch14-384",
        hidden_size=1152,
        intermediate_size=4304,
        num_hidden_layers=27,
        num_attention_heads=16,
        patch_size=14,
        image_size=384,
        hidden_act="gelu_pytorch_tanh",
        layer_norm_eps=1e-6,
    ),
    # InternViT-300M-448px (InternVL3's vision tower), as transformers' InternVLVisionConfig writes it
    "internvit-300m-448": _published(
        "internvit",
        "internvit-300m-448",
        "OpenGVLab/InternVL3-1B-hf",
        hidden_size=1024,
        intermediate_size=4096,
        num_hidden_layers=24,
        num_attention_heads=16,
        patch_size=[14, 14],
        image_size=[448, 448],
        hidden_act="gelu",
        layer_norm_eps=1e-6,
        norm_type="layer_norm",
        attention_bias=True,
        use_mean_pooling=True,
    ),
}

_LLAMA_LIKE = dict(
    activation="silu",
    gated_linear_unit=True,
    normalization="RMSNorm",
    add_bias_linear=False,
    add_qkv_bias=False,
)

# Real public LLMs, restated from their HuggingFace config.json.
LLMS: dict[str, LLMArch] = {
    "llama3-8b": LLMArch(
        num_layers=32,
        hidden_size=4096,
        num_attention_heads=32,
        num_query_groups=8,
        ffn_hidden_size=14336,
        vocab_size=128256,
        norm_epsilon=1e-5,
        rotary_base=500000.0,
        **_LLAMA_LIKE,
        name="llama3-8b",
        source=_HF.format("meta-llama/Meta-Llama-3-8B"),
    ),
    "qwen2.5-7b": LLMArch(
        num_layers=28,
        hidden_size=3584,
        num_attention_heads=28,
        num_query_groups=4,
        ffn_hidden_size=18944,
        vocab_size=152064,
        norm_epsilon=1e-6,
        rotary_base=1000000.0,
        **(_LLAMA_LIKE | {"add_qkv_bias": True}),
        name="qwen2.5-7b",
        source=_HF.format("Qwen/Qwen2.5-7B"),
    ),
    "qwen3-8b": LLMArch(
        num_layers=36,
        hidden_size=4096,
        num_attention_heads=32,
        num_query_groups=8,
        kv_channels=128,
        ffn_hidden_size=12288,
        vocab_size=151936,
        norm_epsilon=1e-6,
        rotary_base=1000000.0,
        qk_layernorm=True,
        **_LLAMA_LIKE,
        name="qwen3-8b",
        source=_HF.format("Qwen/Qwen3-8B"),
    ),
    "qwen3-30b-a3b": LLMArch(
        num_layers=48,
        hidden_size=2048,
        num_attention_heads=32,
        num_query_groups=4,
        kv_channels=128,
        ffn_hidden_size=6144,
        vocab_size=151936,
        norm_epsilon=1e-6,
        rotary_base=1000000.0,
        qk_layernorm=True,
        num_experts=128,
        moe_router_topk=8,
        moe_ffn_hidden_size=768,
        **_LLAMA_LIKE,
        name="qwen3-30b-a3b",
        source=_HF.format("Qwen/Qwen3-30B-A3B"),
    ),
    "mixtral-8x7b": LLMArch(
        num_layers=32,
        hidden_size=4096,
        num_attention_heads=32,
        num_query_groups=8,
        ffn_hidden_size=14336,
        vocab_size=32000,
        norm_epsilon=1e-5,
        rotary_base=1000000.0,
        num_experts=8,
        moe_router_topk=2,
        **_LLAMA_LIKE,
        name="mixtral-8x7b",
        source=_HF.format("mistralai/Mixtral-8x7B-v0.1"),
    ),
}


# Packaged audio encoders. tiny-audio: a Whisper-class encoder at CPU size (2 layers, 16 mel bins, clips of
# up to 64 frames, average pool 2 as Qwen2-Audio's tower) for the several-encoder trainer's tests and
# studies: `encoders: {vision: tiny, audio: tiny-audio}`.
AUDIO_ENCODERS: dict[str, AudioArch] = {
    "tiny-audio": AudioArch(
        "whisper",
        num_layers=2,
        hidden_size=16,
        num_attention_heads=2,
        ffn_hidden_size=32,
        num_mel_bins=16,
        max_source_positions=32,
        pooling=2,
        name="tiny-audio",
    ),
}


def get_preset(name: str) -> ModelArch:
    try:
        return PRESETS[name]
    except KeyError:
        raise ArchError("", f"unknown model preset {name!r}; known: {', '.join(sorted(PRESETS))}") from None


def encoder_preset(name: str) -> EncoderArch | AudioArch:
    """A packaged encoder (image or audio), or the encoder of a packaged full model."""
    if name in ENCODERS:
        return ENCODERS[name]
    if name in AUDIO_ENCODERS:
        return AUDIO_ENCODERS[name]
    if name in PRESETS:
        return PRESETS[name].encoder
    known = sorted(ENCODERS) + sorted(AUDIO_ENCODERS) + sorted(PRESETS)
    raise ArchError("", f"unknown encoder preset {name!r}; known: {', '.join(known)}")


def llm_preset(name: str) -> LLMArch:
    """A packaged LLM, or the LLM of a packaged full model."""
    if name in LLMS:
        return LLMS[name]
    if name in PRESETS:
        return PRESETS[name].llm
    known = sorted(LLMS) + sorted(PRESETS)
    raise ArchError("", f"unknown LLM preset {name!r}; known: {', '.join(known)}")

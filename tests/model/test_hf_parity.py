"""Parameter totals against HuggingFace transformers: each family's config, written with transformers' own
config classes (no download), read by mimo_jobs.model.hf, priced by predict/params.py, and compared by
integer equality with the same config instantiated by transformers on the meta device (no weights)."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from mimo_jobs.model import hf  # noqa: E402
from mimo_jobs.model.arch import ArchError, EncoderArch, LLMArch  # noqa: E402
from mimo_jobs.model.presets import ENCODERS, LLMS  # noqa: E402
from mimo_jobs.model.resolve import arch_of  # noqa: E402
from mimo_jobs.predict.params import llm_active_params, llm_params, vit_params  # noqa: E402

SMALL = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4, vocab_size=250)


def _llm_configs():
    T = transformers
    return {
        "llama": T.LlamaConfig(**SMALL, num_key_value_heads=2),
        "llama-biased": T.LlamaConfig(**SMALL, num_key_value_heads=2, attention_bias=True, mlp_bias=True),
        "llama-tied-head_dim": T.LlamaConfig(
            **SMALL, num_key_value_heads=2, head_dim=24, tie_word_embeddings=True
        ),
        "mistral": T.MistralConfig(**SMALL, num_key_value_heads=2, sliding_window=None),
        "qwen2": T.Qwen2Config(**SMALL, num_key_value_heads=2),
        "qwen3": T.Qwen3Config(**SMALL, num_key_value_heads=2, head_dim=32),
        "qwen2_moe": T.Qwen2MoeConfig(
            **SMALL,
            num_key_value_heads=2,
            num_experts=6,
            num_experts_per_tok=2,
            moe_intermediate_size=40,
            shared_expert_intermediate_size=72,
            mlp_only_layers=[0],
            norm_topk_prob=False,
        ),
        "qwen3_moe": T.Qwen3MoeConfig(
            **SMALL,
            num_key_value_heads=2,
            head_dim=32,
            num_experts=6,
            num_experts_per_tok=2,
            moe_intermediate_size=40,
            decoder_sparse_step=2,
            norm_topk_prob=True,
        ),
        "mixtral": T.MixtralConfig(
            **SMALL, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2
        ),
    }


def _hf_count(cfg, cls=None) -> int:
    with torch.device("meta"):
        model = (cls or transformers.AutoModelForCausalLM).from_config(cfg) if cls is None else cls(cfg)
    return sum(p.numel() for p in model.parameters())


def _as_json(cfg) -> dict:
    """The config as its config.json holds it."""
    return json.loads(cfg.to_json_string(use_diff=False))


@pytest.mark.parametrize("family", list(_llm_configs()))
def test_llm_families_count_exactly_as_transformers(family):
    cfg = _llm_configs()[family]
    arch = LLMArch.from_dict(hf.llm_fields(_as_json(cfg)))
    assert llm_params(arch) == _hf_count(cfg)


def test_moe_features_read_from_the_config():
    c = _llm_configs()
    q2 = LLMArch.from_dict(hf.llm_fields(_as_json(c["qwen2_moe"])))
    assert q2.moe_layer_pattern == (0, 1, 1) and q2.moe_shared_expert_gate and q2.moe_router_pre_softmax
    assert q2.add_qkv_bias and not q2.add_bias_linear
    q3 = LLMArch.from_dict(hf.llm_fields(_as_json(c["qwen3_moe"])))
    assert q3.moe_layer_pattern == (0, 1, 0) and q3.qk_layernorm and q3.kv_channels == 32
    assert not q3.moe_router_pre_softmax  # norm_topk_prob true: renormalised top-k


@pytest.mark.parametrize("name", list(LLMS))
def test_llm_presets_count_exactly_as_transformers(name):
    """Each packaged LLM, as the HF config of its family (the published values), on the meta device."""
    p = LLMS[name]
    T = transformers
    common = dict(
        hidden_size=p.hidden_size,
        intermediate_size=p.ffn_hidden_size,
        num_hidden_layers=p.num_layers,
        num_attention_heads=p.num_attention_heads,
        num_key_value_heads=p.query_groups,
        vocab_size=p.vocab_size,
        tie_word_embeddings=p.tie_word_embeddings,
    )
    cfg = {
        "llama3-8b": lambda: T.LlamaConfig(**common),
        "qwen2.5-7b": lambda: T.Qwen2Config(**common),
        "qwen3-8b": lambda: T.Qwen3Config(**common, head_dim=p.head_dim),
        "qwen3-30b-a3b": lambda: T.Qwen3MoeConfig(
            **common,
            head_dim=p.head_dim,
            num_experts=p.num_experts,
            num_experts_per_tok=p.moe_router_topk,
            moe_intermediate_size=p.expert_ffn,
        ),
        "mixtral-8x7b": lambda: T.MixtralConfig(
            **(common | {"intermediate_size": p.expert_ffn}),
            num_local_experts=p.num_experts,
            num_experts_per_tok=p.moe_router_topk,
        ),
    }[name]()
    assert llm_params(p) == _hf_count(cfg)
    # and the preset is what its family's reader makes of that config
    read = LLMArch.from_dict(hf.llm_fields(_as_json(cfg)) | {"name": p.name, "source": p.source})
    assert llm_params(read) == llm_params(p)


def test_qwen3_30b_a3b_total_and_active():
    p = LLMS["qwen3-30b-a3b"]
    assert round(llm_params(p) / 1e9, 1) == 30.5 and round(llm_active_params(p) / 1e9, 2) == 3.35


def _vision_count(cfg, cls) -> int:
    with torch.device("meta"):
        m = cls(cfg)
    tower = getattr(m, "vision_model", m)  # transformers 4 wraps the tower, 5 does not
    head = getattr(tower, "head", None)
    # a VLM takes the tower's hidden states: SigLIP's attention-pooling head is not part of it
    return sum(p.numel() for p in m.parameters()) - (sum(p.numel() for p in head.parameters()) if head else 0)


ENC_SMALL = dict(
    hidden_size=48,
    intermediate_size=80,
    num_hidden_layers=2,
    num_attention_heads=4,
    image_size=32,
    patch_size=8,
)
# a second size: more layers and heads, another patch grid
ENC_OTHER = dict(
    hidden_size=96,
    intermediate_size=160,
    num_hidden_layers=3,
    num_attention_heads=6,
    image_size=56,
    patch_size=14,
)
# what each family's config needs beyond the sizes (InternViT-300M's biased q/k/v)
_VISION_EXTRA = {"clip": {}, "siglip": {}, "internvit": {"attention_bias": True}}


def _vision_classes(kind: str):
    T = transformers
    return {
        "clip": (T.CLIPVisionConfig, T.CLIPVisionModel, T.CLIPConfig),
        "siglip": (T.SiglipVisionConfig, T.SiglipVisionModel, T.SiglipConfig),
        "internvit": (T.InternVLVisionConfig, T.InternVLVisionModel, T.InternVLConfig),
    }[kind]


@pytest.mark.parametrize("size", [ENC_SMALL, ENC_OTHER], ids=["small", "other"])
@pytest.mark.parametrize("kind", ["clip", "siglip", "internvit"])
def test_vision_towers_count_exactly_as_transformers(kind, size):
    vcls, cls, full = _vision_classes(kind)
    vc = vcls(**size, **_VISION_EXTRA[kind])
    e = EncoderArch.from_dict(hf.encoder_fields(_as_json(vc)))
    assert vit_params(e) == _vision_count(vc, cls)
    # a full vision + text config: its vision_config
    whole = full(vision_config=size | _VISION_EXTRA[kind])
    assert EncoderArch.from_dict(hf.encoder_fields(_as_json(whole))) == e


@pytest.mark.parametrize("name", list(ENCODERS))
def test_encoder_presets_count_exactly_as_transformers(name):
    e = ENCODERS[name]
    vcls, cls, _ = _vision_classes(e.kind)
    vc = vcls(
        **_VISION_EXTRA[e.kind],
        hidden_size=e.hidden_size,
        intermediate_size=e.ffn_hidden_size,
        num_hidden_layers=e.num_layers,
        num_attention_heads=e.num_attention_heads,
        image_size=e.image_size,
        patch_size=e.patch_size,
    )
    assert vit_params(e) == _vision_count(vc, cls)


@pytest.mark.parametrize(
    "cfg, field, words",
    [
        ({"architectures": ["DeepseekV3ForCausalLM"]}, "architectures", "multi-head latent attention"),
        ({"architectures": ["JambaForCausalLM"]}, "architectures", "Mamba"),
        ({"architectures": ["GPTNeoXForCausalLM"]}, "architectures", "unknown architecture"),
        ({"model_type": "mamba"}, "model_type", "Mamba"),
    ],
)
def test_unbuildable_families_are_refused_by_name(cfg, field, words):
    with pytest.raises(ArchError) as e:
        hf.llm_fields(cfg)
    assert e.value.field == field and words in str(e.value)


def test_sliding_window_is_refused_when_enabled():
    T = transformers
    cfg = _as_json(T.MistralConfig(**SMALL, sliding_window=4096))
    with pytest.raises(ArchError, match="sliding-window attention") as e:
        hf.llm_fields(cfg)
    assert e.value.field == "sliding_window"
    # Qwen2 carries a window size but leaves it off: accepted
    hf.llm_fields(_as_json(T.Qwen2Config(**SMALL, use_sliding_window=False)))
    with pytest.raises(ArchError, match="sliding-window"):
        hf.llm_fields(
            _as_json(T.Qwen2Config(**SMALL, use_sliding_window=True, sliding_window=64, max_window_layers=0))
        )


def test_a_written_config_json_resolves_with_overrides(tmp_path):
    cfg = _llm_configs()["qwen3_moe"]
    d = tmp_path / "models" / "my-moe"
    cfg.save_pretrained(d)
    vd = tmp_path / "models" / "vit"
    transformers.SiglipVisionConfig(**ENC_SMALL).save_pretrained(vd)
    a = arch_of(
        {
            "encoder": {"hf_config": "models/vit/config.json", "downsample": 2},
            "llm": {"hf_config": "models/my-moe/config.json", "num_layers": 2, "moe_layer_pattern": [1, 1]},
        },
        tmp_path,
    )
    assert a.llm.num_layers == 2 and a.llm.name == "my-moe[moe_layer_pattern=[1, 1]][num_layers=2]"
    assert a.encoder.downsample == 2 and a.encoder.tokens_per_image == 4

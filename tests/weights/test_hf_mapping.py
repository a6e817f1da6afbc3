"""The families' weight mappings (model/families/, on model/hf_weights.py's engine) by hand: megatron-core's fused QKV rows per query group, a gated fc1's halves cut per
TP rank, the vocabulary padding; the config.json written for export reads back (model/hf.py) to the same
description for every family."""

from __future__ import annotations

import pytest

from mimo_jobs.model import hf
from mimo_jobs.model.arch import ArchError, EncoderArch, LLMArch
from mimo_jobs.model.hf import encoder_config, encoder_layout, llm_config, llm_layout
from mimo_jobs.model.hf_weights import canonical_alias, piece_reads, shard_rows

transformers = pytest.importorskip("transformers")

import hf_models  # noqa: E402

LLAMA = LLMArch(**hf.llm_fields(hf_models.llm_config("llama").to_dict()))


def _rows(t, lo, hi):
    """(HF tensor, first row, last row + 1) of each read of rows [lo, hi) of target t."""
    return [
        (pc.hf.rsplit(".", 2)[-2] if pc.hf else None, pc.start + a, pc.start + b)
        for pc, a, b in piece_reads(t, lo, hi)
    ]


def test_qkv_rows_interleave_q_k_v_per_query_group():
    # 4 heads over 2 groups of head_dim 16: group g is [q heads 2g, 2g+1; k_g; v_g] (megatron-core attention.py)
    t = llm_layout(LLAMA, "llama", 1).targets["decoder.layers.0.self_attention.linear_qkv.weight"]
    assert t.shape == ((2 + 2) * 2 * 16, 64)
    assert _rows(t, 0, t.shape[0]) == [
        ("q_proj", 0, 32), ("k_proj", 0, 16), ("v_proj", 0, 16),
        ("q_proj", 32, 64), ("k_proj", 16, 32), ("v_proj", 16, 32),
    ]  # fmt: skip
    # TP2: rank 1 holds the second query group whole
    ranges, _ = shard_rows(t, 0, 1, 2, 1)
    lo, hi = ranges[0]
    assert len(ranges) == 1 and _rows(t, lo, hi) == [
        ("q_proj", 32, 64),
        ("k_proj", 16, 32),
        ("v_proj", 16, 32),
    ]


def test_gated_fc1_rank_holds_its_gate_rows_then_its_up_rows():
    t = llm_layout(LLAMA, "llama", 2).targets["decoder.layers.1.mlp.linear_fc1.weight"]
    ranges, cols = shard_rows(t, 0, 1, 2, t.parts)
    assert cols is None and t.parts == 2
    reads = [r for lo, hi in ranges for r in _rows(t, lo, hi)]
    assert reads == [("gate_proj", 48, 96), ("up_proj", 48, 96)]


def test_row_parallel_weights_split_columns_and_vocabulary_pads_with_zero_rows():
    lay = llm_layout(LLAMA, "llama", 2)
    proj = lay.targets["decoder.layers.0.self_attention.linear_proj.weight"]
    assert shard_rows(proj, 1, 1, 2, 1) == ([(0, 64)], (32, 64))
    emb = lay.targets["embedding.word_embeddings.weight"]
    assert emb.shape == (256, 64) and [(p.hf, p.rows) for p in emb.pieces] == [
        ("model.embed_tokens.weight", 250),
        (None, 6),
    ]
    assert lay.hf_shapes["lm_head.weight"] == (250, 64)


def test_te_fused_norms_are_the_layer_norms():
    a = "decoder.layers.3.self_attention.linear_qkv.layer_norm_weight"
    assert canonical_alias(a) == "decoder.layers.3.input_layernorm.weight"
    assert canonical_alias("vit.decoder.layers.0.mlp.linear_fc1.layer_norm_bias") == (
        "vit.decoder.layers.0.pre_mlp_layernorm.bias"
    )


def test_clip_position_table_is_the_class_row_then_the_patch_rows():
    e = EncoderArch(**hf.encoder_fields(hf_models.encoder_config("clip").to_dict()))
    lay = encoder_layout(e, "vision_model.")
    n = e.grid**2
    assert lay.hf_shapes["vision_model.embeddings.position_embedding.weight"] == (n + 1, 32)
    pos = lay.targets["vit.position_embeddings"]
    assert pos.shape == (1, n, 32) and [(p.start, p.rows) for p in pos.pieces] == [(1, n)]
    assert [(p.start, p.rows) for p in lay.targets["vit.class_position"].pieces] == [(0, 1)]
    assert lay.targets["vit.embedder.weight"].shape == (32, 3 * 4 * 4)


@pytest.mark.parametrize(
    "family", ["llama", "llama-tied", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "mixtral"]
)
def test_exported_llm_config_reads_back_to_the_same_description(family):
    fields = hf.llm_fields(hf_models.llm_config(family).to_dict())
    cfg = llm_config(LLMArch(**fields))
    assert cfg["model_type"] == family.removesuffix("-tied")
    assert hf.llm_fields(cfg) == fields


@pytest.mark.parametrize("kind", ["clip", "siglip", "internvit"])
def test_exported_vision_config_reads_back_to_the_same_description(kind):
    fields = hf.encoder_fields(hf_models.encoder_config(kind).to_dict())
    assert hf.encoder_fields(encoder_config(EncoderArch(**fields))) == fields


def test_export_refuses_what_no_family_expresses():
    moe = LLMArch(**hf.llm_fields(hf_models.llm_config("qwen3_moe").to_dict()))
    with pytest.raises(ArchError, match="sigmoid"):
        llm_config(LLMArch(**(moe.to_dict() | {"moe_router_score_function": "sigmoid"})))

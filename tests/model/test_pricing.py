"""The planner's per-rank counts on the model description, against hand-written standard formulas."""

from __future__ import annotations

from dataclasses import replace

import pytest

from mimo_jobs.model.arch import ArchError, EncoderArch, LLMArch, ModelArch, padded_vocab
from mimo_jobs.model.presets import ENCODERS, LLMS, PRESETS
from mimo_jobs.model.splits import tp_problems
from mimo_jobs.predict.params import (
    encoder_tensors,
    llm_active_params,
    llm_params,
    llm_tensors,
    model_summary,
)

QWEN = ModelArch("pair", ENCODERS["siglip-so400m-14-384"], LLMS["qwen3-30b-a3b"])


def test_qwen3_30b_a3b_rank_at_tp2_ep8_by_hand():
    """One LLM rank of the production study: TP2, EP8, one pipeline stage."""
    h, v, L, E, fe, d = 2048, 151936, 48, 128, 768, 128
    q, kv = 32 * d, 4 * d
    tables = 2 * v * h // 2  # embedding and untied output layer, vocabulary split over TP2
    attention = q * h // 2 + (q + 2 * kv) * h // 2 + 2 * d  # o, qkv, q/k norms
    norms = 2 * h
    router = E * h
    experts = (E // 8) * 3 * h * fe  # 16 local experts, SwiGLU: gate, up, down
    want = tables + L * (attention + norms + router + experts) + h
    got = sum(t.numel for t in llm_tensors(QWEN, 2, 8, 1, 1, 0))
    assert got == want == 4_400_822_272
    # bf16 weights + fp32 gradient buffer: 6 bytes a parameter
    assert round(got * 6 / 2**30, 1) == 24.6


def test_totals_and_summary_name_the_model():
    assert llm_params(LLMS["qwen3-30b-a3b"]) == 30_532_122_624
    assert llm_active_params(LLMS["qwen3-30b-a3b"]) == 3_353_032_704
    assert model_summary(QWEN)[1] == "llm qwen3-30b-a3b: 30.5B total, 3.35B active"


def test_vocab_padding_is_counted_per_rank_not_in_totals():
    p = replace(LLMS["qwen3-8b"], vocab_size=151_000, num_layers=1)
    m = ModelArch("m", PRESETS["tiny"].encoder, p)
    assert padded_vocab(151_000, 1) == 151_040 and padded_vocab(151_000, 3) == 151_296
    emb = llm_tensors(m, 1, 1, 1, 1, 0)[0].numel
    assert emb == 151_040 * p.hidden_size
    total_rank = sum(t.numel for t in llm_tensors(m, 1, 1, 1, 1, 0))
    assert total_rank - llm_params(p) == 2 * 40 * p.hidden_size  # 40 padded rows, twice (untied)


def test_tied_embeddings_hold_one_table_with_one_stage():
    p = replace(PRESETS["tiny-swiglu"].llm, tie_word_embeddings=True)
    m = replace(PRESETS["tiny-swiglu"], llm=p)
    untied = sum(t.numel for t in llm_tensors(PRESETS["tiny-swiglu"], 1, 1, 1, 1, 0))
    assert sum(t.numel for t in llm_tensors(m, 1, 1, 1, 1, 0)) == untied - 128 * 32
    assert any(r[0] == "model-tied" for r in tp_problems(m, 1, 1, 1, 2))


def test_downsample_feeds_the_projector_s2_channels():
    e = replace(PRESETS["tiny"].encoder, downsample=2)
    m = ModelArch("m", e, PRESETS["tiny"].llm)
    assert e.tokens_per_image == 4 and e.tokens_for(16, 8) == 2 and e.projector_input == 4 * 32
    assert encoder_tensors(m, 1)[-4].numel == 32 * 4 * 32  # projector fc1: LLM width x s^2 h


def test_shared_experts_and_dense_first_layers():
    p = PRESETS["tiny-moe-shared"].llm
    assert [p.is_moe_layer(i) for i in range(2)] == [False, True]
    dense, moe = (
        sum(t.numel for t in llm_tensors(PRESETS["tiny-moe-shared"], 1, 1, 1, 2, s)) for s in (0, 1)
    )
    # stage 1 holds the MoE layer: router 4 x 32, 4 experts of 3 x 32 x 32, a shared expert of 3 x 32 x 48
    assert moe - dense > 4 * 32 + 4 * 3 * 32 * 32 + 3 * 32 * 48 - 3 * 32 * 64 - 1


@pytest.mark.parametrize(
    "kw, field",
    [
        ({"num_query_groups": 3}, "num_query_groups"),
        ({"activation": "relu"}, "activation"),
        ({"num_experts": 4, "moe_router_topk": 5}, "moe_router_topk"),
        ({"num_experts": 4, "moe_layer_pattern": [1]}, "moe_layer_pattern"),
        ({"normalization": "BatchNorm"}, "normalization"),
    ],
)
def test_bad_llm_fields_name_themselves(kw, field):
    base = dict(num_layers=2, hidden_size=32, num_attention_heads=4, ffn_hidden_size=64, vocab_size=128)
    with pytest.raises(ArchError) as e:
        LLMArch(**(base | kw))
    assert e.value.field == field


def test_encoder_downsample_must_divide_the_grid():
    with pytest.raises(ArchError) as e:
        EncoderArch("siglip", 2, 32, 4, 64, patch_size=14, image_size=384, downsample=2)
    assert e.value.field == "downsample"

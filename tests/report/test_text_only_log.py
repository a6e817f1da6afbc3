"""A Megatron-LM GPT log described as a text-only model: `ingest --model '{llm: {...}}'` of the upstream
fixture (tests/ingest/fixtures/megatron_upstream.log: an MoE GPT, TP2, EP8, DP8 on 16 H100s, GBS 128, its
own `throughput per GPU (TFLOP/s/GPU)` on its lines) gives an MFU of the LLM's FLOPs alone, checked against
a hand computation and, loosely, against the program's own FLOPs count.

The model is an assumption: Mixtral-8x7B (the fields of mistralai/Mixtral-8x7B-v0.1's config.json,
https://huggingface.co/mistralai/Mixtral-8x7B-v0.1) at seq_length 2048, chosen because the log has an MoE
load-balancing loss and because Megatron-LM's own FLOPs formula for that model and length reproduces the
TFLOP/s/GPU the log prints (checked below); the log itself names neither."""

from __future__ import annotations

import json
import statistics

import pytest
import yaml

from helpers import TESTS
from helpers.submit import cli
from mimo_jobs.ingest.told import resolve_model
from mimo_jobs.model.resolve import arch_of
from mimo_jobs.predict.flops import llm_flops_per_token
from mimo_jobs.predict.hardware import get_gpu
from mimo_jobs.report import build
from mimo_jobs.store.connection import connect

LOG = TESTS / "ingest" / "fixtures" / "megatron_upstream.log"
# The steady-state window (iterations 70-73) as the log prints it: times, and TFLOP/s/GPU on three lines.
WINDOW_MS = [5372.3, 5361.6, 5358.9, 5366.0]
WINDOW_TFLOPS = [243.1, 243.6, 243.3]
GBS, SEQ, GPUS = 128, 2048, 16
# Mixtral-8x7B: 32 layers, hidden 4096, 32 query heads of 128 channels in 8 KV groups, SwiGLU experts of
# width 14336, 8 experts, top-2, vocabulary 32000 (already a multiple of 128: unpadded)
L, H, A, G, D, F, E, K, V = 32, 4096, 32, 8, 128, 14336, 8, 2, 32000
MIXTRAL = {
    "num_layers": L, "hidden_size": H, "num_attention_heads": A, "num_query_groups": G,
    "ffn_hidden_size": F, "vocab_size": V, "activation": "silu", "gated_linear_unit": True,
    "normalization": "RMSNorm", "rotary_base": 1e6, "num_experts": E, "moe_router_topk": K,
    "moe_ffn_hidden_size": F,
}  # fmt: skip
HF_CONFIG = {
    "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": H,
    "intermediate_size": F, "num_hidden_layers": L, "num_attention_heads": A, "num_key_value_heads": G,
    "vocab_size": V, "num_local_experts": E, "num_experts_per_tok": K, "rope_theta": 1e6,
    "rms_norm_eps": 1e-5, "hidden_act": "silu", "max_position_embeddings": 32768, "sliding_window": None,
    "tie_word_embeddings": False,
}  # fmt: skip


def _flops_per_token_by_hand(seq: int) -> float:
    """Training FLOPs of one token, written out: per layer forward the Q, K, V and output projections, the
    causal attention core (QK^T and AV over half the keys on average), the router and the k routed SwiGLU
    experts (three h x f matrices each); the logits; backward twice the forward."""
    q, kv = A * D, G * D
    layer = 2 * H * q + 2 * 2 * H * kv + 2 * q * H + 2 * 2 * seq * q / 2 + 2 * H * E + K * 3 * 2 * H * F
    return 3 * (L * layer + 2 * H * V)


def _megatron_flops_per_token(seq: int) -> float:
    """Megatron-LM's `num_floating_point_operations` / (batch x seq) as of the log's date (megatron/training/
    training.py, 2024-04): Narayanan et al. 2021 (https://arxiv.org/abs/2104.04473) eq. (3), 72 B s l h^2
    (1 + s/6h + V/12lh), generalised to GQA, SwiGLU and top-k experts; the attention core unmasked, no
    router."""
    return (
        12 * L * H * H
        * ((1 + G / A + seq / H) * (A * D / H) + F / H * K * 3 / 2 + V / (2 * L * H))
    )  # fmt: skip


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    db = tmp_path_factory.mktemp("txt") / "s.duckdb"
    model = json.dumps({"name": "mixtral-8x7b", "llm": MIXTRAL})
    cli("ingest", LOG, "--db", db, "--study", "upstream", "--name", "gpt", "--seq-length", str(SEQ),
        "--layout", "llm tp2 ep8 dp8", "--model", model, check=True)  # fmt: skip
    con = connect(db, read_only=True)
    try:
        return build(con, "upstream", gpu="H100")
    finally:
        con.close()


def test_the_assumed_model_reproduces_the_logs_own_flops():
    """Megatron-LM's count for Mixtral-8x7B at 2048 tokens gives the TFLOP/s/GPU the log prints, line by line
    (within 0.05%: the printed times are rounded): the description is what produced the log, as far as FLOPs
    tell. At 4096 tokens the same model would print about 506."""
    for ms, printed in zip((5372.3, 5361.6, 5366.0), WINDOW_TFLOPS, strict=True):
        tflops = _megatron_flops_per_token(SEQ) * GBS * SEQ / (ms / 1000) / GPUS / 1e12
        assert tflops == pytest.approx(printed, rel=5e-4)


def test_mfu_of_a_text_only_model_is_the_llms_flops(report):
    (r,) = report.runs
    peak = get_gpu("H100").peak_flops
    samples_per_s = GBS / (statistics.median(WINDOW_MS) / 1000)
    by_hand = _flops_per_token_by_hand(SEQ) * SEQ * samples_per_s / (GPUS * peak)
    assert r.model == "mixtral-8x7b" and "text-only" in r.mfu_note
    assert r.mfu == pytest.approx(by_hand, rel=1e-9)
    a = arch_of(resolve_model(json.dumps({"llm": MIXTRAL})))
    assert a.text_only and r.mfu == pytest.approx(
        llm_flops_per_token(a.llm, SEQ) * SEQ * samples_per_s / (GPUS * peak), rel=1e-9
    )
    # Loosely against the program's own count (the MFU its printed TFLOP/s implies): mimo-jobs counts the
    # causal core at half, which Megatron-LM's formula of that date does not (s / (h (1 + G/A + s/h) + ...)
    # of the total, about 2% at 2048 tokens), and the router (0.01%): lower, within 3%.
    assert 0.97 * r.log_mfu < r.mfu < r.log_mfu
    assert r.log_mfu == pytest.approx(statistics.median(WINDOW_TFLOPS) * 1e12 / peak)


def test_a_hf_config_alone_is_the_same_text_only_model(tmp_path):
    """`--model DIR` of an LLM's config.json describes a text-only model, the same LLM as the fields."""
    (tmp_path / "mixtral").mkdir()
    (tmp_path / "mixtral" / "config.json").write_text(json.dumps(HF_CONFIG))
    from_hf = arch_of(resolve_model(str(tmp_path / "mixtral")))
    inline = arch_of(resolve_model(yaml.safe_dump({"llm": MIXTRAL}, default_flow_style=True)))
    assert from_hf.text_only and from_hf.name == "mixtral"
    fields = ("name", "source")
    assert {k: v for k, v in from_hf.llm.to_dict().items() if k not in fields} == {
        k: v for k, v in inline.llm.to_dict().items() if k not in fields
    }

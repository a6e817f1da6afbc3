"""The core attention priced by the kernel a run uses (operators.core_attention_s, opdata.ATTENTION_SHARES):
the unfused attention against an independent published measurement of it, the fused kernels' shares by
sequence length, the kernel a study's layers run (model/attention.py attention_kernel, optime.attention_for),
every published row's kernel, and the rows whose source does not know its GPUs' peak kept out of the fit."""

from __future__ import annotations

import math
import sys
from dataclasses import replace

import pytest
import yaml

from helpers import REPO
from mimo_jobs.predict import operators as ops
from mimo_jobs.predict.opdata import ATTENTION_KERNELS, ATTENTION_SEQS, OP_GPUS

sys.path.insert(0, str(REPO / "benchmarks"))
import published  # noqa: E402

H100, A100 = OP_GPUS["H100"], OP_GPUS["A100"]
# Azure/AI-benchmarking-guide, Azure_Results/ND_H100_v5_results.md, "Flash Attention 2.0": head dim 128,
# batch 2, sequence 8192 (flash-attention's benchmark: hidden 2048, so 16 heads; no causal mask, no dropout)
AZURE_SHAPE = dict(batch=2, heads=16, d=128, s_q=8192, s_k=8192, causal=False)
AZURE_STANDARD_TFLOPS, AZURE_FLASH2_TFLOPS = 145.1, 327.9


def _fwd_bwd_tflops(att: ops.Attention, gpu=H100) -> float:
    """The fused-attention convention's TFLOP/s (forward 4 b a d s^2, backward 2.5x) of the priced time."""
    f, b = ops.core_attention_s(att, gpu, ops.Residual(), **AZURE_SHAPE)
    flops = ops.attention_flops(2, 16, 128, 8192, 8192, causal=False)
    return (1 + ops.ATTENTION_BACKWARD) * flops / (f + b) / 1e12


def test_unfused_attention_is_slower_than_flash_attention_by_the_ratio_azure_measured():
    # the unfused passes' HBM share is derived from the FlashAttention-3 paper's measurement of PyTorch's
    # standard attention (torch's eager kernels); Azure's H100 is another machine and another run of the
    # same shape: both kernels within 20% of it, and their ratio too
    flash2 = _fwd_bwd_tflops(ops.Attention("flash2"))
    unfused = _fwd_bwd_tflops(ops.Attention("unfused", fused_softmax=False))
    assert flash2 == pytest.approx(AZURE_FLASH2_TFLOPS, rel=0.20)
    assert unfused == pytest.approx(AZURE_STANDARD_TFLOPS, rel=0.20)
    assert flash2 / unfused == pytest.approx(AZURE_FLASH2_TFLOPS / AZURE_STANDARD_TFLOPS, rel=0.20)
    # cuDNN's fused attention (what Transformer Engine runs on Hopper) is faster still than FlashAttention-2
    assert _fwd_bwd_tflops(ops.Attention("cudnn")) > 1.4 * flash2


def test_unfused_attention_pays_its_score_passes_and_dropout_and_the_full_score_matrix():
    shape = dict(AZURE_SHAPE, s_q=2048, s_k=2048)
    eager = dict(fused_softmax=False)  # torch's eager passes, at the measured share of the HBM bandwidth
    plain = sum(ops.core_attention_s(ops.Attention("unfused", **eager), A100, ops.Residual(), **shape))
    dropped = sum(
        ops.core_attention_s(ops.Attention("unfused", dropout=True, **eager), A100, ops.Residual(), **shape)
    )
    fp32 = sum(
        ops.core_attention_s(ops.Attention("unfused", softmax_fp32=True), A100, ops.Residual(), **shape)
    )
    assert plain < dropped < fp32
    # dropout's passes: 5 + 5 bytes a score against the fused softmax's 4 + 6, the GEMMs unchanged
    gemms = plain - 2 * 16 * 2048**2 * 10 / (A100.hbm_bytes_per_s * 0.42)
    assert dropped - gemms == pytest.approx(2 * (plain - gemms), rel=1e-9)
    # the causal mask halves a fused kernel's work, not the unfused one's: it computes every score
    causal = dict(shape, causal=True)
    assert (
        sum(ops.core_attention_s(ops.Attention("unfused", **eager), A100, ops.Residual(), **causal)) == plain
    )
    # Megatron's fused scale-mask-softmax kernel moves the same bytes at the whole HBM bandwidth
    megatron = sum(ops.core_attention_s(ops.Attention("unfused"), A100, ops.Residual(), **shape))
    assert megatron - gemms == pytest.approx(0.42 * (plain - gemms), rel=1e-9)
    fused = sum(ops.core_attention_s(ops.Attention("flash2"), A100, ops.Residual(), **shape))
    assert sum(ops.core_attention_s(ops.Attention("flash2"), A100, ops.Residual(), **causal)) == fused / 2


def test_fused_shares_interpolate_in_log_sequence_length_and_hold_at_the_measured_ends():
    lo, hi = ops.kernel_shares("cudnn", "hopper", 2048), ops.kernel_shares("cudnn", "hopper", 4096)
    mid = ops.kernel_shares("cudnn", "hopper", math.sqrt(2048 * 4096))
    assert mid == pytest.approx(tuple((a + b) / 2 for a, b in zip(lo, hi, strict=True)))
    assert ops.kernel_shares("cudnn", "hopper", 128) == ops.kernel_shares(
        "cudnn", "hopper", ATTENTION_SEQS[0]
    )
    assert ops.kernel_shares("cudnn", "hopper", 1 << 20) == ops.kernel_shares("cudnn", "hopper", 16384)
    # the shares apply to the priced GPU's own peak: a GPU at half the peak takes twice as long
    flops = ops.attention_flops(1, 32, 128, 4096, 4096, causal=True)
    full = ops.attention_s(flops, H100, (4096, 4096, 128, True), "flash3")
    half = ops.attention_s(
        flops, replace(H100, bf16_flops=H100.bf16_flops / 2), (4096, 4096, 128, True), "flash3"
    )
    assert half == pytest.approx(tuple(2 * t for t in full))


def test_a_kernel_without_figures_for_the_generation_or_an_unknown_kernel_is_refused():
    with pytest.raises(ValueError, match="flash3 attention on ampere"):
        ops.kernel_shares("flash3", "ampere", 2048)
    with pytest.raises(ValueError, match="not one of flash1, flash2, cudnn, flash3, unfused"):
        ops.Attention("sdpa")


def test_a_study_prices_the_kernel_its_layers_run():
    from mimo_jobs.model.attention import SDPA, UNFUSED
    from mimo_jobs.predict import optime
    from mimo_jobs.predict.estimate import predict_shape
    from mimo_jobs.predict.hardware import GPUS
    from mimo_jobs.predict.steptime import Efficiency

    _, rows = published.load_rows()
    row = next(r for r in rows if r.id == "flash-attention-gpt3-1.3b-8gpu")
    te, local = GPUS["A100"], replace(GPUS["A100"], layers="local")
    mem = predict_shape(row.shape, te, Efficiency()).memory
    assert optime.attention_for(row.shape, te) == ops.Attention("cudnn")
    on_sdpa = replace(row.shape, attention=SDPA)
    on_unfused = replace(row.shape, attention=UNFUSED)
    assert optime.attention_for(on_sdpa, local) == ops.Attention("flash2")
    # megatron-core's local DotProductAttention: the scores materialised, torch's softmax on an fp32 copy, no
    # dropout (the trainer's attention dropout is 0)
    assert optime.attention_for(on_unfused, local) == ops.Attention("unfused", softmax_fp32=True)
    res = ops.Residual()
    unfused = optime.op_step(on_unfused, mem, local, res).stage.attention
    fused = optime.op_step(on_sdpa, mem, local, res).stage.attention
    explicit = optime.op_step(on_sdpa, mem, local, res, attention=ops.Attention("unfused", softmax_fp32=True))
    assert unfused == explicit.stage.attention
    assert unfused > 2 * fused


def test_every_published_row_carries_a_kernel_and_a_bad_one_is_refused(tmp_path):
    doc = yaml.safe_load(published.DATA.read_text())
    for r in doc["rows"]:
        assert r.get("attention") in ATTENTION_KERNELS, r["id"]
    _, rows = published.load_rows()
    # a source that predates FlashAttention ran the unfused attention, priced with Megatron's dropout
    korthikanti = [r for r in rows if r.source == "korthikanti2022"]
    assert korthikanti and all(
        published.row_attention(r) == ops.Attention("unfused", dropout=True) for r in korthikanti
    )
    bad = dict(doc, rows=[dict(doc["rows"][0], attention="flash4")])
    path = tmp_path / "runs.yaml"
    path.write_text(yaml.safe_dump(bad))
    with pytest.raises(ValueError, match=r"korthikanti-22b-sp-selective.*'flash4' is not one of flash1"):
        published.load_rows(path)


def test_rows_whose_source_does_not_know_the_peak_are_priced_but_kept_out_of_the_fit():
    _, rows = published.load_rows()
    unknown = [r for r in rows if r.peak_not_known]
    # torchtitan's H100s: "HBM2e-based SXM H100 with lower TDP, the actual peak TFLOPs number is between SXM
    # and NVL, and we don't know its exact value" (its llama3_h100_202412_torchtitan.md, footnote 2)
    assert {r.source for r in unknown} == {"torchtitan"} and {r.gpu for r in unknown} == {"H100"}
    assert all("we don't know its exact value" in r.peak_not_known for r in unknown)
    assert any(r.precision == "bf16" for r in unknown)
    assert not any(r.fitted for r in unknown)
    # the bf16 summary (the held-out figures) leaves them out
    n_fitted = sum(r.fitted for r in rows)
    summary = published.summary(rows, {"x": list(range(len(rows)))})
    assert len(summary["x"]) == n_fitted
    assert not {rows[i].id for i in summary["x"]} & {r.id for r in unknown}

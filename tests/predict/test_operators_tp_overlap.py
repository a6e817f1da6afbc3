"""Tensor-parallel communication overlapped with its GEMMs (Transformer Engine's userbuffers, megatron-core's
tp_comm_overlap) in the operator-term model (operators.tp_block_overlap): each overlap rule against a
chunk-by-chunk schedule simulated here, and a layer and a step with and without it."""

from __future__ import annotations

import pytest

from mimo_jobs.model.arch import LLMArch
from mimo_jobs.predict import operators as ops
from mimo_jobs.predict.opdata import OP_GPUS, UB_PIPELINE_SPLITS

H100 = OP_GPUS["H100"]
LLAMA_70B = LLMArch(
    80, 8192, 64, 28672, 128256, num_query_groups=8, activation="silu", gated_linear_unit=True
)
OSS_120B = LLMArch(
    36, 2880, 64, 2880, 201088, num_query_groups=8, kv_channels=64, activation="silu",
    gated_linear_unit=True, num_experts=128, moe_router_topk=4,
)  # fmt: skip


def _ring_schedule(comm: float, gemm: float, n: int) -> float:
    """Exposed time of an all-gather ring feeding a GEMM split in n chunks, event by event: chunk 0 is local,
    chunk i arrives after i of the n - 1 transfers; each chunk's GEMM starts once it is here and the previous
    chunk's GEMM is done."""
    end = 0.0
    for i in range(n):
        arrived = i * comm / (n - 1)
        end = max(end, arrived) + gemm / n
    return end - gemm


def _pipeline_schedule(comm: float, gemm: float, splits: int) -> float:
    """Exposed time of a reduce-scatter of a GEMM's output in `splits` chunks: chunk i's transfer starts when
    its GEMM is done and the previous transfer has finished."""
    gemm_end, sent = 0.0, 0.0
    for _ in range(splits):
        gemm_end += gemm / splits
        sent = max(sent, gemm_end) + comm / splits
    return sent - gemm


@pytest.mark.parametrize("comm,gemm", [(1.0, 10.0), (10.0, 1.0), (4.0, 4.0), (3.0, 3.5)])
@pytest.mark.parametrize("n", [2, 4, 8])
def test_ring_and_pipeline_overlaps_match_their_chunk_schedules(comm, gemm, n):
    assert ops.ring_overlap_s(comm, gemm, n) == pytest.approx(_ring_schedule(comm, gemm, n))
    assert ops.pipeline_overlap_s(comm, gemm, n) == pytest.approx(_pipeline_schedule(comm, gemm, n))
    # the last reduce-scatter chunk runs after every GEMM chunk: never hidden
    assert ops.pipeline_overlap_s(comm, gemm, n) >= comm / n
    assert ops.bulk_overlap_s(comm, gemm) == max(0.0, comm - gemm)


def _tp_collectives(p, tokens, tp, bw):
    act = tokens * p.hidden_size * 2
    return ops.collective_s("all_gather", act, tp, bw), ops.collective_s("reduce_scatter", act, tp, bw)


@pytest.mark.parametrize("recompute", ["none", "full"])
@pytest.mark.parametrize("tp", [2, 4, 8])
def test_a_sequence_parallel_layer_exposes_less_tp_time_but_never_the_last_chunks(tp, recompute):
    split = ops.Split(tp=tp, cp=2, sp=True)
    plain = ops.layer_terms(LLAMA_70B, 1, 8192, split, H100, False, recompute)
    over = ops.layer_terms(LLAMA_70B, 1, 8192, split, H100, False, recompute, tp_overlap=True)
    # without overlap: per block (attention, MLP) rc forward and one backward all-gather + reduce-scatter
    ag, rs = _tp_collectives(LLAMA_70B, 8192 / 2, tp, H100.nvlink_bytes_per_s)
    rc = 2 if recompute == "full" else 1
    assert plain.tp == pytest.approx(2 * (rc + 1) * (ag + rs))
    assert over.tp < plain.tp
    # the pipelined reduce-scatters after the projection and fc2, rc times: their last chunk stays exposed
    assert over.tp >= 2 * rc * rs / UB_PIPELINE_SPLITS
    # the GEMMs pay for the SMs the communication kernels take, less than the communication hidden
    assert plain.gemm < over.gemm < plain.gemm + (plain.tp - over.tp)
    assert over.total < plain.total
    assert (over.attention, over.elementwise, over.flops) == (plain.attention, plain.elementwise, plain.flops)


def test_communication_the_gemms_cannot_cover_stays_exposed():
    # TP 16 over two nodes: the collectives run at the network's 50 GB/s per GPU, far longer than the GEMMs
    split = ops.Split(tp=16, sp=True)
    plain = ops.layer_terms(LLAMA_70B, 1, 4096, split, H100, False)
    over = ops.layer_terms(LLAMA_70B, 1, 4096, split, H100, False, tp_overlap=True)
    ag, rs = _tp_collectives(LLAMA_70B, 4096, 16, H100.net_bytes_per_s)
    assert plain.tp == pytest.approx(4 * (ag + rs))
    # at most the whole GEMM time of the layer can hide communication
    assert plain.tp - over.tp <= plain.gemm
    assert over.tp > plain.tp / 2


def test_overlap_changes_nothing_without_tp_or_without_sequence_parallelism():
    for split in (ops.Split(tp=1, cp=2), ops.Split(tp=4, sp=False)):
        plain = ops.layer_terms(LLAMA_70B, 1, 8192, split, H100, False)
        over = ops.layer_terms(LLAMA_70B, 1, 8192, split, H100, False, tp_overlap=True)
        assert (over.gemm, over.tp, over.total) == (plain.gemm, plain.tp, plain.total)


def test_a_moe_layer_overlaps_its_attention_block_only():
    # userbuffers sit in TE's linear layers; the experts' tokens move by the MoE dispatcher's own collectives
    split = ops.Split(tp=4, ep=2, sp=True)
    plain = ops.layer_terms(OSS_120B, 1, 4096, split, H100, True)
    over = ops.layer_terms(OSS_120B, 1, 4096, split, H100, True, tp_overlap=True)
    ag, rs = _tp_collectives(OSS_120B, 4096, 4, H100.nvlink_bytes_per_s)
    assert over.tp < plain.tp
    assert over.tp >= 2 * (ag + rs)  # the MLP block's forward and backward pair, exposed as before
    assert over.ep == plain.ep


def test_a_step_with_tp_comm_overlap_is_shorter_by_its_tp_part():
    kw = dict(
        seq=8192, mbs=1, microbatches=16, tp=4, pp=4, cp=2, ep=1, dp=2, vp=5, sp=True, gpu=H100,
        params_per_rank=70e9 / 16, overlap_dp=True,
    )  # fmt: skip
    plain = ops.step(LLAMA_70B, **kw)
    over = ops.step(LLAMA_70B, **kw, tp_comm_overlap=True)
    assert over.parts["tp"] < plain.parts["tp"]
    assert over.iteration_s < plain.iteration_s
    one = ops.step(LLAMA_70B, **(kw | dict(tp=1, dp=8, sp=False)))
    assert ops.step(LLAMA_70B, **(kw | dict(tp=1, dp=8, sp=False)), tp_comm_overlap=True) == one

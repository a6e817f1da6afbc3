"""Step time from operator terms: every GEMM, the fused attention, the element-wise kernels and every
collective of one training iteration, each priced from published figures (opdata.py), summed as
megatron-core schedules them (docs/predict.md, "The operator-term time model").

  GEMM          2 M N K FLOPs at the dtype's tensor peak x the wave efficiency (tiles / (waves x SMs), an
                output tile of opdata.TILE_M x TILE_N per SM), and never faster than its operands and
                output at HBM bandwidth; backward two GEMMs of the same FLOPs (data and weight gradients)
  attention     by the run's kernel (Attention; opdata.ATTENTION_KERNELS): a fused one's 4 b a d s_q s_k FLOPs
                forward (QK^T and AV), halved under the causal mask, backward 2.5x the forward (five
                products against two), at that kernel's published share of the peak on this generation at
                this sequence length over the GEMM residual; the unfused one as its batched GEMMs plus its
                s x s scores' passes
  element-wise  norms, residual adds, the MLP activation, rotary embedding, the loss: bytes moved / HBM
                bandwidth (backward twice the forward's bytes)
  collectives   the ring (alpha-beta) model: time = steps x alpha + bytes x factor / bus bandwidth, factor
                2 (n - 1) / n for an all-reduce, (n - 1) / n for a reduce-scatter, all-gather or all-to-all
                of the full buffer, 1 for a send (NVIDIA nccl-tests doc/PERFORMANCE.md: busbw = algbw x that
                factor); the bus bandwidth NVLink's while the group stays in one node (or in the GPUs'
                NVLink domain, GB200 NVL72's 72), the network's per GPU once it spans more
  pipeline      (microbatches + (pp - 1) / vp) x one stage's microbatch time (Narayanan et al. 2021,
                "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", 2.2.2)
  overlap       as megatron-core runs it: the DP gradient reduce-scatter and parameter all-gather (the
                distributed optimizer, overlap_grad_reduce / overlap_param_gather) hide behind the last
                microbatch's backward and the first one's forward, all but one bucket; the CP ring behind
                the attention it feeds; the interleaved schedule's pipeline sends behind the other chunks'
                compute; EP collectives and 1F1B's sends exposed; TP collectives exposed, or under
                tp_comm_overlap (Transformer Engine's userbuffers, with sequence parallelism) overlapped
                with the GEMMs that produce or consume them (tp_block_overlap)
  fp8           as Transformer Engine runs it: GEMMs at the FP8 peak (same wave efficiency), attention,
                element-wise kernels and communication in bf16, plus the cast bytes of every GEMM input
                (opdata.FP8_CAST_BYTES_PER_ELEMENT) and of the weights once per iteration
Per transformer layer: QKV, attention, projection, MLP (gated or not) or MoE experts (grouped, per local
expert, each GEMM by its own shape; the router's GEMM; the token dispatcher's reorderings at HBM bandwidth:
moe_reorder_bytes), two norms, with TP splitting the heads and the MLP width, SP the element-wise tokens, CP the
sequence, EP the experts. Full recompute adds each layer's forward again; selective adds the attention
core's forward. The logits and the loss run on the last stage, the slowest.

Two residual constants per generation scale what the published figures leave out (Residual): `gemm`
divides every GEMM's and fused attention kernel's time (the unfused attention's GEMMs included) (1: the peaks as the wave model gives them), `comm`
multiplies the exposed communication (1: the links at their published rates).

A measured table (OpGPU.measured, `cluster.hardware.ops`) replaces the published figures for the GEMMs of
its dtypes and the attention: each shape at the rate optable.py interpolates from the device's own times,
with no residual (they are the device's, not a model's), and no HBM floor (the time measured includes it);
the backward attention at the forward's measured rate. Communication and element-wise kernels keep the
model. A shape the table's range does not cover goes into the `clamped` set a caller passes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from . import optable
from .hardware import nvlink_reach
from .opdata import (
    ATTENTION_KERNELS,
    ATTENTION_SEQS,
    ATTENTION_SHARES,
    BUCKET_PARAMS,
    BUCKET_PARAMS_PER_DP,
    FP8_CAST_BYTES_PER_ELEMENT,
    MOE_SORT_PASSES,
    TILE_M,
    TILE_N,
    UB_COMM_SMS,
    UB_PIPELINE_SPLITS,
    UNFUSED,
    UNFUSED_PASS_HBM_SHARE,
    UNFUSED_SCORE_BYTES,
    OpGPU,
)

BF16 = 2  # bytes per element of activations, gradients and collectives


@dataclass(frozen=True)
class Residual:
    """What the fit sets per generation (module docstring); the defaults are the physical figures."""

    gemm: float = 1.0
    comm: float = 1.0


# -- single operators


def wave_efficiency(m: int, n: int, sms: int) -> float:
    """Tiles / (waves x SMs): the share of the SMs a GEMM's output tiles keep busy over its waves (tile and
    wave quantization)."""
    tiles = math.ceil(m / TILE_M) * math.ceil(n / TILE_N)
    waves = math.ceil(tiles / sms)
    return (m * n) / (waves * sms * TILE_M * TILE_N)


def gemm_s(
    m: float, n: float, k: float, gpu: OpGPU, fp8: bool = False, res: Residual = Residual(),
    clamped: set | None = None,
) -> float:  # fmt: skip
    """One (M x K) @ (K x N) GEMM: its FLOPs at the measured rate of its shape where the GPU has a measured
    table of its dtype (module docstring), else at the peak x wave efficiency / res.gemm, or its bytes
    (operands and output in bf16) at HBM bandwidth, whichever is longer."""
    if m <= 0 or n <= 0 or k <= 0:
        return 0.0
    if gpu.measured is not None:
        dtype = "fp8" if fp8 and gpu.has_fp8 else "bf16"
        got = optable.gemm_rate(gpu.measured, m, n, k, dtype)
        if got is not None:
            if got.clamped and clamped is not None:
                clamped.add(("gemm", round(m), round(n), round(k)))
            return 2 * m * n * k / got.rate
    peak = gpu.fp8_flops if fp8 and gpu.has_fp8 else gpu.bf16_flops
    m_i, n_i = max(1, round(m)), max(1, round(n))
    compute = 2 * m * n * k / (peak * wave_efficiency(m_i, n_i, gpu.sms) * res.gemm)
    nbytes = (m * k + k * n + m * n) * (1 if fp8 and gpu.has_fp8 else BF16)
    return max(compute, nbytes / gpu.hbm_bytes_per_s)


def gemm_train_s(
    m: float, n: float, k: float, gpu: OpGPU, fp8: bool, res: Residual, clamped: set | None = None
) -> tuple[float, float]:
    """(forward, backward) of one linear layer on M tokens: forward (M, N, K); backward the data gradient
    and the weight gradient (gemm_grads_s)."""
    fwd = gemm_s(m, n, k, gpu, fp8, res, clamped)
    return fwd, sum(gemm_grads_s(m, n, k, gpu, fp8, res, clamped))


def gemm_grads_s(
    m: float, n: float, k: float, gpu: OpGPU, fp8: bool, res: Residual, clamped: set | None = None,
    data: bool = True, weight: bool = True,
) -> tuple[float, float]:  # fmt: skip
    """(data gradient, weight gradient) of one linear layer's (M, N, K) forward: (M, K, N) and (K, N, M);
    0 for the one not computed (`data`, `weight` False)."""
    d = gemm_s(m, k, n, gpu, fp8, res, clamped) if data else 0.0
    return d, gemm_s(k, n, m, gpu, fp8, res, clamped) if weight else 0.0


def attention_flops(batch: float, heads: float, head_dim: int, s_q: float, s_k: float, causal: bool) -> float:
    """Forward FLOPs of QK^T and AV over `s_q` queries and `s_k` keys per sequence."""
    return 4 * batch * heads * head_dim * s_q * s_k / (2 if causal else 1)


ATTENTION_BACKWARD = 2.5  # backward / forward FLOPs of a fused attention (five products against two)


@dataclass(frozen=True)
class Attention:
    """The core attention kernel a run uses (opdata.ATTENTION_KERNELS) and, for the unfused one, which
    element-wise passes its s x s scores take (opdata.UNFUSED_SCORE_BYTES)."""

    kernel: str = "cudnn"
    dropout: bool = False  # attention dropout on the probabilities (a pass of its own when unfused)
    softmax_fp32: bool = False  # unfused: torch's softmax on an fp32 copy, not Megatron's fused kernel
    # unfused: the score passes as Megatron's fused scale-mask-softmax kernel runs them (at the HBM
    # bandwidth), or as torch's eager kernels (at opdata.UNFUSED_PASS_HBM_SHARE of it: the share measured on
    # PyTorch's standard attention); torch's fp32 softmax is eager
    fused_softmax: bool = True

    def __post_init__(self) -> None:
        if self.kernel not in ATTENTION_KERNELS:
            raise ValueError(f"attention kernel {self.kernel!r} is not one of {', '.join(ATTENTION_KERNELS)}")


def kernel_shares(kernel: str, generation: str, seq: float) -> tuple[float, float]:
    """(forward, backward) share of the bf16 peak a fused kernel reaches on sequences of `seq` queries
    (opdata.ATTENTION_SHARES, interpolated in log sequence length, held at the measured ends)."""
    got = ATTENTION_SHARES.get((kernel, generation))
    if got is None:
        have = ", ".join(k for k, g in ATTENTION_SHARES if g == generation)
        raise ValueError(f"no published figures for {kernel} attention on {generation} GPUs (there: {have})")
    x = math.log(min(max(seq, ATTENTION_SEQS[0]), ATTENTION_SEQS[-1]))
    xs = [math.log(v) for v in ATTENTION_SEQS]
    i = max(0, min(len(xs) - 2, sum(1 for v in xs if v <= x) - 1))
    w = (x - xs[i]) / (xs[i + 1] - xs[i])
    return tuple(c[i] + w * (c[i + 1] - c[i]) for c in got)  # type: ignore[return-value]


def attention_s(
    flops_fwd: float, gpu: OpGPU, shape: tuple, kernel: str = "cudnn", res: Residual = Residual(),
    clamped: set | None = None,
) -> tuple[float, float]:  # fmt: skip
    """(forward, backward) seconds of a fused attention of `flops_fwd` forward FLOPs; `shape` (queries per
    sequence, keys per sequence, head dim, causal): from the GPU's measured table where it has one, else at
    the kernel's published shares of the peak at that many queries over the GEMM residual (the kernels'
    figures are short benchmarks, as the GEMMs' peaks are; held out, the published runs say the residual
    applies to both: docs/predict.md)."""
    s_q, s_k, d, causal = shape
    got = optable.attention_rate(gpu.measured, s_k, d, causal) if gpu.measured is not None else None
    if got is not None:
        if got.clamped and clamped is not None:
            clamped.add(("attention", round(s_k), d, causal))
        return flops_fwd / got.rate, ATTENTION_BACKWARD * flops_fwd / got.rate
    fwd, bwd = kernel_shares(kernel, gpu.generation, s_q)
    rate = gpu.bf16_flops * res.gemm
    return flops_fwd / (rate * fwd), ATTENTION_BACKWARD * flops_fwd / (rate * bwd)


def unfused_attention_s(
    batch_heads: float, d: int, s_q: float, s_k: float, gpu: OpGPU, att: Attention, res: Residual = Residual(),
    clamped: set | None = None,
) -> tuple[float, float]:  # fmt: skip
    """(forward, backward) seconds of the attention with its scores materialised, for `batch_heads`
    (sequence, head) pairs: Q K^T and P V as batched GEMMs (the batch's rows stacked, one wave count for
    all), backward dP = dO V^T, dV = P^T dO, dQ = dS K, dK = dS^T Q; the whole s_q x s_k scores however
    the mask falls; plus the scores' element-wise passes (opdata.UNFUSED_SCORE_BYTES): Megatron's fused
    kernel at the HBM bandwidth, torch's eager passes at the share of it they were measured to reach
    (opdata.UNFUSED_PASS_HBM_SHARE; Attention.fused_softmax)."""
    mq, mk = batch_heads * s_q, batch_heads * s_k
    scores_n, pv = gemm_s(mq, s_k, d, gpu, False, res, clamped), gemm_s(mq, d, s_k, gpu, False, res, clamped)
    to_kv = gemm_s(mk, d, s_q, gpu, False, res, clamped)
    passes = [UNFUSED_SCORE_BYTES["softmax_fp32" if att.softmax_fp32 else "softmax_fused16"]]
    if att.dropout:
        passes.append(UNFUSED_SCORE_BYTES["dropout"])
    eager = att.softmax_fp32 or not att.fused_softmax
    elements = batch_heads * s_q * s_k / (UNFUSED_PASS_HBM_SHARE if eager else 1.0)
    fwd = scores_n + pv + bytes_s(elements * sum(p[0] for p in passes), gpu)
    bwd = scores_n + pv + 2 * to_kv + bytes_s(elements * sum(p[1] for p in passes), gpu)
    return fwd, bwd


def core_attention_s(
    att: Attention, gpu: OpGPU, res: Residual, batch: float, heads: float, d: int, s_q: float, s_k: float,
    causal: bool, clamped: set | None = None,
) -> tuple[float, float]:  # fmt: skip
    """(forward, backward) seconds of the core attention as the run's kernel prices it (module docstring)."""
    if att.kernel == UNFUSED:
        return unfused_attention_s(batch * heads, d, s_q, s_k, gpu, att, res, clamped)
    flops = attention_flops(batch, heads, d, s_q, s_k, causal)
    return attention_s(flops, gpu, (s_q, s_k, d, causal), att.kernel, res, clamped)


def bytes_s(nbytes: float, gpu: OpGPU) -> float:
    """An element-wise or norm kernel moving `nbytes` through HBM."""
    return nbytes / gpu.hbm_bytes_per_s


# -- collectives (nccl-tests doc/PERFORMANCE.md's bus bandwidth factors)


def bus_factor(kind: str, n: int) -> float:
    """busbw / algbw for a collective over n ranks (nccl-tests doc/PERFORMANCE.md)."""
    if n <= 1:
        return 0.0
    if kind == "all_reduce":
        return 2 * (n - 1) / n
    if kind in ("reduce_scatter", "all_gather", "all_to_all"):
        return (n - 1) / n
    if kind == "p2p":
        return 1.0
    raise ValueError(f"unknown collective {kind!r}")


def ring_steps(kind: str, n: int) -> int:
    if n <= 1:
        return 0
    return {"all_reduce": 2 * (n - 1), "p2p": 1}.get(kind, n - 1)


def link_bytes_per_s(span: int, gpus_per_node: int, gpu: OpGPU) -> float:
    """The bus bandwidth of a group spanning `span` consecutive ranks: NVLink inside a node or the GPUs'
    NVLink domain (hardware.nvlink_reach), else the network per GPU (a ring across nodes runs at its slowest
    link)."""
    inside = span <= nvlink_reach(gpus_per_node, gpu.nvlink_domain)
    return gpu.nvlink_bytes_per_s if inside else gpu.net_bytes_per_s


def collective_s(kind: str, nbytes: float, n: int, bw: float, alpha_s: float = 0.0) -> float:
    """One collective of `nbytes` (the full buffer: all-reduce's, the gathered all-gather's, the input of a
    reduce-scatter or all-to-all, a send's) over n ranks at bus bandwidth `bw`."""
    if kind != "p2p" and n <= 1:
        return 0.0
    return ring_steps(kind, max(n, 2)) * alpha_s + nbytes * bus_factor(kind, max(n, 2)) / bw


# -- tensor-parallel communication overlapped with its GEMMs (Transformer Engine's userbuffers, opdata.UB_*).
# The decomposition rule of Wang et al. 2023, "Overlap Communication with Dependent Computation via
# Decomposition in Large Deep Learning Models" (ASPLOS '23): a collective feeding or fed by a GEMM is split
# into chunks, each transfer running under the GEMM of a chunk already at hand; what stays exposed is the
# transfer the GEMM chunks cannot cover, and the chunk no GEMM runs beside (the last reduce-scatter chunk).


def ring_overlap_s(comm: float, gemm: float, n: int) -> float:
    """Exposed seconds of an all-gather run as a ring under the GEMM that consumes it, split into the n TP
    chunks (TE's "ring_exchange"): the GEMM of the local shard starts at once, and each of the n - 1
    transfers runs under one chunk's GEMM."""
    if n <= 1:
        return 0.0
    return max(0.0, comm - gemm * (n - 1) / n)


def pipeline_overlap_s(comm: float, gemm: float, splits: int) -> float:
    """Exposed seconds of a reduce-scatter of a GEMM's output split into `splits` chunks (TE's "pipeline"):
    each chunk's transfer runs under the next chunk's GEMM, the last one after all of them."""
    return comm / splits + max(0.0, comm - gemm) * (splits - 1) / splits


def bulk_overlap_s(comm: float, gemm: float) -> float:
    """Exposed seconds of a collective run whole beside an independent GEMM (TE's "bulk")."""
    return max(0.0, comm - gemm)


def tp_block_overlap(
    col: tuple, row: tuple, ag_s: float, rs_s: float, tp: int, gpu: OpGPU, fp8: bool, res: Residual,
    rc: float = 1.0, clamped: set | None = None,
) -> tuple[float, float]:  # fmt: skip
    """(exposed communication, GEMM seconds added) of one tensor-parallel block under TE's userbuffers
    (opdata.UB_*) for one microbatch: a column-parallel linear `col` (QKV, fc1), its input all-gathered, and
    a row-parallel linear `row` (projection, fc2), its output reduce-scattered, each an (M, N, K) shape;
    `ag_s` / `rs_s` one all-gather / reduce-scatter of the activations. Forward (rc times): the all-gather
    as a ring under the column GEMM, the reduce-scatter pipelined after the row GEMM, which runs on the SMs
    its kernels leave. Backward: the output gradient's all-gather as a ring under the row linear's
    data-gradient GEMM; the column linear's input all-gathered again (bulk) beside its data-gradient GEMM
    and that gradient reduce-scattered (bulk) beside its weight-gradient GEMM, their kernels taking SMs from
    the GEMM while they run. A split GEMM is priced whole: TE runs its chunks round-robin on up to three
    compute streams (transformer_engine/common/comm_gemm_overlap/comm_gemm_overlap.cpp), so one chunk's
    last wave shares the SMs with the next chunk's first."""

    def g(m: float, n: float, k: float) -> float:
        return gemm_s(m, n, k, gpu, fp8, res, clamped)

    (mc, nc, kc), (mr, nr, kr) = col, row
    col_f, row_f, row_d = g(mc, nc, kc), g(mr, nr, kr), g(mr, kr, nr)
    col_d, col_w = g(mc, kc, nc), g(kc, nc, mc)
    margin = row_f * UB_COMM_SMS / (gpu.sms - UB_COMM_SMS)  # the row GEMM on the SMs left (set_sm_margin)
    exposed = rc * (
        ring_overlap_s(ag_s, col_f, tp) + pipeline_overlap_s(rs_s, row_f + margin, UB_PIPELINE_SPLITS)
    )
    exposed += ring_overlap_s(ag_s, row_d, tp) + bulk_overlap_s(ag_s, col_d) + bulk_overlap_s(rs_s, col_w)
    added = rc * margin + (min(ag_s, col_d) + min(rs_s, col_w)) * UB_COMM_SMS / gpu.sms
    return exposed, added


def bubble_fraction(pp: int, vp: int, microbatches: int) -> float:
    """The pipeline bubble against the microbatches' own time: (pp - 1) / (vp x m)."""
    return (pp - 1) / (vp * microbatches)


# -- one layer


@dataclass(frozen=True)
class Split:
    """How a layer's work divides over ranks: tensor, context, expert parallel, and sequence parallelism."""

    tp: int = 1
    cp: int = 1
    ep: int = 1
    sp: bool = False


@dataclass
class Terms:
    """Seconds of one microbatch on one rank, forward + backward, by kind; flops the model FLOPs counted
    (Megatron's convention: backward 2x the forward)."""

    gemm: float = 0.0
    attention: float = 0.0
    elementwise: float = 0.0
    tp: float = 0.0
    cp: float = 0.0  # exposed part of the CP ring
    ep: float = 0.0
    flops: float = 0.0
    detail: dict = field(default_factory=dict)

    def add(self, other: Terms, times: float = 1.0) -> None:
        for k in ("gemm", "attention", "elementwise", "tp", "cp", "ep", "flops"):
            setattr(self, k, getattr(self, k) + times * getattr(other, k))
        if other.detail.get("clamped"):
            self.clamped.update(other.detail["clamped"])

    @property
    def clamped(self) -> set:
        """The shapes priced from a measured table outside its range (operators' module docstring)."""
        return self.detail.setdefault("clamped", set())

    @property
    def compute(self) -> float:
        return self.gemm + self.attention + self.elementwise

    @property
    def comm(self) -> float:
        return self.tp + self.cp + self.ep

    @property
    def total(self) -> float:
        return self.compute + self.comm


# What a layer's backward computes (the `grads` of layer_terms and _linear): "all", data and weight
# gradients (a trained module); "data", the data gradients only (frozen weights the gradient still flows
# through to a trained module before it: a frozen LLM under trained encoders); "none", no backward (a
# frozen encoder module, whose forward the trainer runs under torch.no_grad: step/common.py's embed)
GRADS = ("all", "data", "none")


def _linear(
    t: Terms, m: float, n: float, k: float, gpu: OpGPU, fp8: bool, res: Residual, rc: float,
    grads: str = "all", input_grad: bool = True,
) -> None:  # fmt: skip
    """A linear layer on M tokens into `t`: its GEMMs (forward x rc under recompute; the backward's as
    `grads` says, no data gradient where the input needs none: `input_grad` False), FP8 casts, and the
    FLOPs its GEMMs run (3 x the forward's when it computes both gradients)."""
    back = grads != "none"
    data, weight = back and input_grad, grads == "all"
    dgrad, wgrad = gemm_grads_s(m, n, k, gpu, fp8, res, t.clamped, data, weight)
    t.gemm += rc * gemm_s(m, n, k, gpu, fp8, res, t.clamped) + (dgrad + wgrad)
    t.flops += (1 + data + weight) * 2 * m * n * k
    if fp8 and gpu.has_fp8:  # the input cast forward, the output gradient's backward
        t.elementwise += bytes_s((rc * m * k + back * m * n) * FP8_CAST_BYTES_PER_ELEMENT, gpu)


def layer_terms(
    p, mbs: int, seq: int, split: Split, gpu: OpGPU, moe: bool, recompute: str = "none",
    fp8: bool = False, res: Residual = Residual(), gpus_per_node: int = 8, alpha_s: float = 0.0,
    causal: bool = True, rotary: bool = True, grads: str = "all", tp_overlap: bool = False,
    attention: Attention = Attention(),
) -> Terms:  # fmt: skip
    """One transformer layer of LLM `p` (mimo_jobs.model.arch.LLMArch) for one microbatch of `mbs`
    sequences of `seq` tokens on one rank. An encoder's layer (encops.py) is one of bidirectional attention
    (`causal` False) over each image's or clip's own tokens (a sequence each) without rotary embedding;
    `grads` (GRADS) what its backward computes; `tp_overlap`: its TP collectives overlapped with their
    GEMMs (tp_block_overlap; sequence parallel and a backward only)."""
    tp, cp, ep = split.tp, split.cp, split.ep
    h, d = p.hidden_size, p.head_dim
    q, kv = p.num_attention_heads * d, p.query_groups * d
    tokens = mbs * seq / cp  # this rank's tokens of the microbatch (CP splits the sequence)
    ew_tokens = tokens / tp if split.sp else tokens  # element-wise kernels: SP splits the tokens
    back = grads != "none"
    # forward GEMMs and kernels run again before the backward (none without a backward: no checkpoints)
    rc = 2.0 if recompute == "full" and back else 1.0
    t = Terms()
    # attention block: QKV, core, projection
    qkv, proj = (tokens, (q + 2 * kv) / tp, h), (tokens, h, q / tp)
    _linear(t, *qkv, gpu, fp8, res, rc, grads)
    core = attention_flops(mbs, p.num_attention_heads / tp, d, seq / cp, seq, causal=causal)
    af, ab = core_attention_s(
        attention, gpu, res, mbs, p.num_attention_heads / tp, d, seq / cp, seq, causal, t.clamped
    )
    ab = ab if back else 0.0
    replays = rc if recompute == "full" else 2.0 if recompute == "selective" and back else 1.0
    t.attention += af * replays + ab
    t.flops += (1 + 2 * back) * core
    _linear(t, *proj, gpu, fp8, res, rc, grads)
    blocks = [(qkv, proj)]  # the TP blocks whose collectives userbuffers overlap (the experts' are not)
    # MLP or experts
    m = 3 if p.gated_linear_unit else 2
    if moe:
        # the router, in bf16, on its tokens
        _linear(t, ew_tokens, p.num_experts, h, gpu, False, res, rc, grads)
        local = max(1, p.num_experts // ep)
        per_expert = tokens * p.moe_router_topk * ep / p.num_experts
        e = Terms()
        _linear(e, per_expert, (m - 1) * p.expert_ffn / tp, h, gpu, fp8, res, rc, grads)
        _linear(e, per_expert, h, p.expert_ffn / tp, gpu, fp8, res, rc, grads)
        t.add(e, local)
        if p.moe_shared_expert_intermediate_size:
            f_s = p.moe_shared_expert_intermediate_size
            _linear(t, tokens, (m - 1) * f_s / tp, h, gpu, fp8, res, rc, grads)
            _linear(t, tokens, h, f_s / tp, gpu, fp8, res, rc, grads)
        act_width = per_expert * local * p.expert_ffn / tp
        fwd, bwd = moe_reorder_bytes(ew_tokens, p.moe_router_topk, per_expert * local, local, h)
        t.elementwise += bytes_s(rc * fwd + back * bwd, gpu)
    else:
        fc1, fc2 = (tokens, (m - 1) * p.ffn_hidden_size / tp, h), (tokens, h, p.ffn_hidden_size / tp)
        _linear(t, *fc1, gpu, fp8, res, rc, grads)
        _linear(t, *fc2, gpu, fp8, res, rc, grads)
        blocks.append((fc1, fc2))
        act_width = tokens * p.ffn_hidden_size / tp
    # element-wise forward bytes: two norms (read, write), two residual adds (two reads, a write), the
    # activation (gated: two reads, a write), rotary embedding on q and k (read, write); backward twice
    fwd_bytes = BF16 * (2 * 2 * ew_tokens * h + 2 * 3 * ew_tokens * h + m * act_width)
    fwd_bytes += BF16 * 2 * tokens * (q + kv) / tp if rotary else 0.0
    t.elementwise += bytes_s(fwd_bytes * (rc + 2 * back), gpu)
    # a forward-only layer (a frozen encoder) is priced with its TP collectives exposed
    overlapped = blocks if tp_overlap and split.sp and grads == "all" else []
    _layer_comm(
        t, p, tokens, split, gpu, moe, gpus_per_node, alpha_s, res, af + ab, rc, back, overlapped, fp8
    )
    return t


def moe_reorder_bytes(
    tokens: float, topk: int, received: float, local_experts: int, hidden: int
) -> tuple[float, float]:
    """(forward, backward) HBM bytes of megatron-core's all-to-all token dispatcher reordering one MoE
    layer's token rows of `hidden` bf16 elements (opdata.py, "MoE token reordering"): permute reads the
    rank's `tokens` and writes their `topk` copies; with more than one local expert the `received` rows
    are sorted by expert after the dispatch all-to-all and back before the combine (each read and
    written); unpermute reads the copies and writes each token's weighted sum. The backward runs each
    reordering's inverse on the gradients (the same rows read and written) and unpermute's backward reads
    the expert outputs once more for the routing probabilities' gradient."""
    routed = tokens * topk
    sorts = MOE_SORT_PASSES * 2 * received if local_experts > 1 else 0.0
    forward = (tokens + routed) + sorts + (routed + tokens)
    return BF16 * hidden * forward, BF16 * hidden * (forward + routed)


def _layer_comm(
    t: Terms, p, tokens, split: Split, gpu: OpGPU, moe, gpn, alpha_s, res, attn_s, rc: float = 1.0,
    backward: bool = True, overlapped: list = (), fp8: bool = False,
) -> None:  # fmt: skip
    """TP, CP and EP collectives of one layer and microbatch (exposed parts) into `t`. `rc` 2: full
    recompute runs the layer's forward again before its backward, collectives included (megatron-core's
    CheckpointFunction replays the whole forward of the layers it checkpoints); `backward` False: a forward
    only (a frozen encoder module). `overlapped`: the TP blocks ((column, row) linear shapes) whose
    collectives userbuffers overlap (tp_block_overlap), the GEMM time that costs into t.gemm."""
    tp, cp, ep = split.tp, split.cp, split.ep
    b = 2 if backward else 0  # the backward's collectives per forward pair
    act = tokens * p.hidden_size * BF16
    if tp > 1:
        # per TP block (attention, MLP) one forward (rc times) and one backward all-reduce, or all-gather +
        # reduce-scatter under SP (the same bytes)
        bw = link_bytes_per_s(tp, gpn, gpu)
        ag = collective_s("all_gather", act, tp, bw, alpha_s) * res.comm
        rs = collective_s("reduce_scatter", act, tp, bw, alpha_s) * res.comm
        t.tp += (2 - len(overlapped)) * (rc + b / 2) * (ag + rs)
        for col, row in overlapped:
            exposed, added = tp_block_overlap(col, row, ag, rs, tp, gpu, fp8, res, rc, t.clamped)
            t.tp += exposed
            t.gemm += added
    if cp > 1:
        # the ring passes every rank's keys and values forward (rc times), keys, values and their gradients
        # backward, behind the attention it feeds
        kv = 2 * tokens * p.query_groups * p.head_dim * BF16 / tp
        bw = link_bytes_per_s(cp * tp, gpn, gpu)
        ring = (rc + b) * (cp - 1) * (kv / bw + alpha_s) * res.comm
        t.cp += max(0.0, ring - attn_s)
    if moe and ep > 1:
        routed = act * p.moe_router_topk / (tp if split.sp else 1)
        bw = link_bytes_per_s(ep * tp, gpn, gpu)
        t.ep += (2 * rc + b) * collective_s("all_to_all", routed, ep, bw, alpha_s) * res.comm


def logits_terms(
    p, mbs: int, seq: int, split: Split, gpu: OpGPU, fp8: bool, res: Residual, vocab: int,
    grads: str = "all",
) -> Terms:  # fmt: skip
    """The output layer and the loss on the last stage: one GEMM (TE keeps it in bf16) and the fp32
    softmax cross entropy (read and write the logits forward, twice backward)."""
    tokens = mbs * seq / split.cp
    t = Terms()
    _linear(t, tokens, vocab / split.tp, p.hidden_size, gpu, False, res, 1.0, grads)
    t.elementwise += bytes_s(4 * 4 * tokens * vocab / split.tp, gpu)
    if split.tp > 1:
        t.tp += collective_s("all_reduce", tokens * 4 * 3, split.tp, gpu.nvlink_bytes_per_s) * res.comm
    return t


# -- one iteration


@dataclass(frozen=True)
class OpStep:
    """One iteration by parts (seconds): the pipeline's compute and exposed communication, the exposed DP
    transfers, the optimizer pass; and the per-microbatch stage terms it was built from."""

    iteration_s: float
    stage_mb_s: float
    parts: dict
    stage: Terms


def dp_exposed_s(
    grad_bytes: float, param_bytes: float, params: float, dp: int, bw: float, overlap: bool,
    distributed_optimizer: bool, cover_s: float, alpha_s: float, res: Residual,
) -> float:  # fmt: skip
    """The DP transfers left on the critical path: everything without overlap; with it, the larger of one
    bucket's share (the last to reduce, the first to gather) and what the cover cannot hide."""
    if dp <= 1:
        return 0.0
    if distributed_optimizer:
        full = collective_s("reduce_scatter", grad_bytes, dp, bw, alpha_s)
        full += collective_s("all_gather", param_bytes, dp, bw, alpha_s)
    else:
        full = collective_s("all_reduce", grad_bytes, dp, bw, alpha_s)
    full *= res.comm
    if not overlap:
        return full
    bucket = min(1.0, max(BUCKET_PARAMS, BUCKET_PARAMS_PER_DP * dp) / max(params, 1.0))
    return max(full * bucket, full - cover_s)


def step(
    p, *, seq: int, mbs: int, microbatches: int, tp: int, pp: int, cp: int, ep: int, dp: int, vp: int = 1,
    sp: bool = False, recompute: str = "none", fp8: bool = False, gpu: OpGPU, gpus_per_node: int = 8,
    params_per_rank: float, grad_reduce_bytes: int = 4, distributed_optimizer: bool = True,
    overlap_dp: bool = False, optimizer_bytes_per_rank: float = 0.0, alpha_s: float = 0.0,
    res: Residual = Residual(), vocab: int | None = None, layers_per_stage: float | None = None,
    grads: str = "all", tp_comm_overlap: bool = False, attention: Attention = Attention(),
) -> OpStep:  # fmt: skip
    """One iteration of LLM `p` on a layout (module docstring); `layers_per_stage`: the slowest stage's
    layers (pipesplit.slowest_stage_layers), by default the mean num_layers / pp; `grads` "data": frozen
    weights (GRADS: no weight gradients, nothing to reduce over DP); `tp_comm_overlap`: Transformer
    Engine's userbuffers overlap the TP collectives with their GEMMs (with sequence parallelism, which
    Megatron-LM requires of --tp-comm-overlap)."""
    split = Split(tp=tp, cp=cp, ep=ep, sp=sp and tp > 1)
    if layers_per_stage is None:
        layers_per_stage = p.num_layers / pp
    moe_share = p.moe_layers / p.num_layers if p.num_experts else 0.0
    stage = Terms()
    for moe, share in ((True, moe_share), (False, 1 - moe_share)):  # the MoE layers, then the dense ones
        if share > 0:
            layer = layer_terms(
                p, mbs, seq, split, gpu, moe, recompute, fp8, res, gpus_per_node, alpha_s, grads=grads,
                tp_overlap=tp_comm_overlap, attention=attention,
            )  # fmt: skip
            stage.add(layer, layers_per_stage * share)
    v = vocab if vocab is not None else p.vocab_size
    stage.add(logits_terms(p, mbs, seq, split, gpu, fp8, res, v, grads))
    send_s = 0.0
    if pp > 1:
        # each model chunk sends its activations forward and receives their gradients back
        act = mbs * seq / cp * p.hidden_size * BF16 / (tp if split.sp else 1)
        bw = link_bytes_per_s(tp * cp * dp * 2, gpus_per_node, gpu)
        send_s = 2 * vp * collective_s("p2p", act, 2, bw, alpha_s) * res.comm
        if vp > 1:
            # the interleaved schedule overlaps its sends with the other chunks' compute (Megatron-LM's
            # overlap_p2p_comm, on unless --no-overlap-p2p-communication)
            send_s = max(0.0, send_s - stage.compute)
    mb_s = stage.total + send_s
    pipe = (microbatches + (pp - 1) / vp) * mb_s
    dp_span = tp * cp * dp  # DP ranks sit outside TP and CP in megatron-core's order
    dp_bw = link_bytes_per_s(dp_span, gpus_per_node, gpu)
    exposed_dp = dp_exposed_s(
        params_per_rank * grad_reduce_bytes, params_per_rank * BF16, params_per_rank, dp * cp, dp_bw,
        overlap_dp, distributed_optimizer, stage.compute, alpha_s, res,
    ) if grads == "all" else 0.0  # fmt: skip
    optimizer = bytes_s(optimizer_bytes_per_rank, gpu)
    if fp8 and gpu.has_fp8:  # weights cast to FP8 once per iteration
        optimizer += bytes_s(params_per_rank * FP8_CAST_BYTES_PER_ELEMENT, gpu)
    parts = {
        "compute": (microbatches + (pp - 1) / vp) * stage.compute,
        "tp": (microbatches + (pp - 1) / vp) * (stage.tp + send_s),
        "cp": (microbatches + (pp - 1) / vp) * stage.cp,
        "ep": (microbatches + (pp - 1) / vp) * stage.ep,
        "dp": exposed_dp,
        "optimizer": optimizer,
    }
    return OpStep(pipe + exposed_dp + optimizer, mb_s, parts, stage)

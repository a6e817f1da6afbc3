"""Iteration time of one run (docs/predict.md):

  compute    FLOPs / (GPUs x peak x efficiency), per module (flops.py);
  tp         per layer and microbatch 4 all-reduces (2 forward, 2 backward; all-gather + reduce-scatter under
             sequence parallelism: the same bytes) of s b h, over NVLink (TP stays inside a node);
  ep         per MoE layer 4 all-to-alls (dispatch and combine, forward and backward) of the routed tokens;
  bridge     the embeddings one replica of each encoder module sends per microbatch, and their gradients
             back, over the module's own bridge;
  dp         after the last microbatch: the gradient reduce-scatter + parameter all-gather (distributed
             optimizer) or all-reduce, dense over DP, experts over expert-DP;
  optimizer  one pass over weights, gradients and optimizer state at HBM bandwidth;
  latency    the per-call costs beside those bandwidth terms: OPS_PER_LAYER kernel launches (operators on
             CPU) per layer and microbatch plus OPS_PER_MICROBATCH outside the layers, at gpu.op_s each, and
             every collective's and send's ring steps (comm.py) at gpu.step_s each, all times
             Efficiency.latency (1 uncalibrated; `--db` fits it). On a GPU these are microseconds against
             milliseconds of compute; on CPU runs of a tiny model they are most of the time.
Full activation recompute runs each layer's forward again in the backward: compute x 4/3 (forward 1,
backward 2, plus one forward), for the module that recomputes only (each module has its own setting);
selective recompute redoes only the attention core, left unpriced.
Every model is priced module by module (one encoder is a model of one module; a text-only one has none):
each encoder module with its own architecture, mix (modmix.py), TP, DP and ranks (topology.module_ranges).
The modules run as a pipeline of microbatches: M x the slowest (an encoder module or an LLM stage) + fill
and drain (the other side once, and the LLM's pp - 1 stage bubble); colocated, every rank runs every module
in turn.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from mimo_jobs.contract.modules import LLM
from mimo_jobs.study.topology import module_ranges

from . import comm
from .flops import SampleFlops
from .hardware import (
    FITTED_EFFICIENCY,
    GPU,
    LOCAL_COMPUTE_SHARE,
    LOCAL_EXPERTS_SHARE,
    generation,
    nvlink_reach,
)
from .memory import MemoryPlan
from .modmix import sample_flops_by_module
from .pipesplit import most_stage_layers, splits
from .run import RunShape


@dataclass(frozen=True)
class Efficiency:
    """Achieved fractions of the peaks: compute per module, and the network."""

    encoder: float = 0.40
    llm: float = 0.40
    network: float = 0.70
    latency: float = 1.0  # measured / nominal per-call latency (a scale on time, not a fraction of a peak)
    # per-rank GEMM width (gemm_width) at which the GEMMs reach half the compute fraction above; 0: no size
    # effect (the CPU, and a calibration from the trainer's own runs)
    gemm_half_width: float = 0.0
    # the share of the llm fraction an MoE model's LLM reaches: 1 with grouped-GEMM experts (Transformer
    # Engine), hardware.LOCAL_EXPERTS_SHARE with megatron-core's local SequentialMLP
    experts: float = 1.0


def gemm_factor(width: float, half_width: float) -> float:
    """The share of the fitted compute fraction a module's GEMMs reach at a per-rank width: width / (width +
    half_width). A narrow GEMM (a small hidden size, or one split by a wide TP) fills fewer of the GPU's
    tiles per wave and spends more of its time on reading its operands; Korthikanti et al. 2022, "Reducing
    Activation Recomputation in Large Transformer Models", Table 5, measure 41.5% MFU at hidden 6144 and
    56.3% at 25600, both over TP 8 on A100."""
    return width / (width + half_width) if half_width > 0 else 1.0


def gemm_width(hidden_size: int, tp: int) -> float:
    """The per-rank width the size effect is priced by: the hidden size over TP (the attention projection's
    input on each rank, the narrowest dimension a layer's GEMMs share)."""
    return hidden_size / tp


def efficiency_for(gpu: GPU) -> Efficiency:
    """The efficiencies `predict` and `plan` price a GPU with: its generation's fitted figures
    (hardware.FITTED_EFFICIENCY; one compute fraction for both modules' GEMMs), else the defaults; on
    megatron-core's local layers (gpu.layers) the compute fraction and MoE experts at the local shares
    (hardware.LOCAL_COMPUTE_SHARE, LOCAL_EXPERTS_SHARE). The CPU's defaults are its local layers' already."""
    fitted = FITTED_EFFICIENCY.get(generation(gpu.name))
    if fitted is None:
        return Efficiency()
    compute, network, half_width = fitted
    eff = Efficiency(encoder=compute, llm=compute, network=network, gemm_half_width=half_width)
    return on_local_layers(eff) if gpu.layers == "local" else eff


def on_local_layers(eff: Efficiency, compute_share: float | None = None, experts_share: float | None = None):
    """`eff` (Transformer Engine layers) as megatron-core's local layers reach it: both modules' compute
    fractions times the compute share, an MoE LLM's further times the experts share (hardware's shares
    unless given: the fit in benchmarks/measured.py gives others)."""
    c = LOCAL_COMPUTE_SHARE if compute_share is None else compute_share
    x = LOCAL_EXPERTS_SHARE if experts_share is None else experts_share
    return replace(eff, encoder=eff.encoder * c, llm=eff.llm * c, experts=eff.experts * x)


# Kernels per transformer layer per microbatch, forward and backward: about 12 forward (two norms, QKV,
# the attention core's few, the projection, two MLP GEMMs, the activation, two residual adds) and twice
# that backward; outside the layers, embedding, projector, loss and the bridge's copies.
OPS_PER_LAYER = 36
OPS_PER_MICROBATCH = 20


@dataclass(frozen=True)
class StepTime:
    iteration_s: float
    encoder_mb_s: float  # one microbatch of the slowest encoder module on its ranks (compute + tp + bridge)
    llm_mb_s: float  # one microbatch on one LLM stage (compute + tp + ep)
    parts: dict = field(default_factory=dict)  # compute/tp/ep/dp/bridge/optimizer seconds per iteration
    bottleneck: str = "llm"  # the module that bounds the step: an encoder module's name, or "llm"
    idle_fraction: float = 0.0  # of the module that waits longest for the bottleneck
    dominant: str = "compute"
    flops: SampleFlops | None = None  # per sample
    encoder_compute_s: float = 0.0  # parts["compute"] split by module (calibrate.py fits each)
    llm_compute_s: float = 0.0
    # one microbatch's seconds per module by its name ("llm": one stage), in rank order
    modules: dict = field(default_factory=dict)
    # the measured operator table the step was priced from (cluster.hardware.ops; optime.py), and the
    # shapes outside its range it priced at the nearest measured ones
    ops_file: str | None = None
    ops_clamped: tuple = ()
    model: str = "flops"  # the time model that priced it: "flops" (this module) or "operators" (optime.py)

    @property
    def network_s(self) -> float:
        """The parts that scale with the network efficiency."""
        return sum(self.parts.get(k, 0.0) for k in ("tp", "ep", "bridge", "dp"))

    @property
    def latency_s(self) -> float:
        """The part that scales with Efficiency.latency."""
        return self.parts.get("latency", 0.0)


def _bw(span_gpus: int, gpn: int, gpu: GPU, eff: Efficiency) -> float:
    """NVLink while a group stays inside a node or the GPUs' NVLink domain, InfiniBand once it spans more."""
    inside = span_gpus <= nvlink_reach(gpn, gpu.nvlink_domain)
    return (gpu.nvlink_bytes_per_s if inside else gpu.ib_bytes_per_s) * eff.network


def _recompute_factor(recompute: str) -> float:
    return 4 / 3 if recompute == "full" else 1.0


def _module_mb(rs: RunShape, gpu: GPU, eff: Efficiency, i: int, flops: float) -> dict:
    """One microbatch of encoder module `i` (rs.modules[i]) on its ranks, by part (`flops`: its training
    FLOPs per sample): its samples per microbatch over its TP, its layers' TP all-reduces, and on ranks of
    its own its embeddings and their gradients over its bridge."""
    lay, arch = rs.layout, rs.preset.named_encoders[i][1]
    mix, mr = rs.modules[i], module_ranges(lay)[i]
    samples, tp = mr.samples_per_encoder_microbatch, mr.tp
    rc = _recompute_factor(rs.recompute.encoder)
    g = gemm_factor(gemm_width(arch.hidden_size, tp), eff.gemm_half_width)
    compute = samples * flops * rc / (tp * gpu.peak_flops * eff.encoder * g)
    tokens = samples * mix.tokens_mean
    nvl = _bw(tp, lay.gpus_per_node, gpu, eff)
    layers = arch.num_layers
    tp_s = 4 * layers * comm.all_reduce_s(tokens * arch.hidden_size * rs.dtype_bytes, tp, nvl)
    steps = 4 * layers * comm.all_reduce_steps(tp)
    bridge = 0.0
    if not lay.colocated:
        nbytes = tokens * rs.preset.llm.hidden_size * rs.dtype_bytes
        bridge = 2 * comm.p2p_s(nbytes, gpu.ib_bytes_per_s * eff.network)
        steps += 2
    ops = layers * OPS_PER_LAYER * rc + OPS_PER_MICROBATCH
    latency = (ops * gpu.op_s + steps * gpu.step_s) * eff.latency
    return {"compute": compute, "tp": tp_s, "bridge": bridge, "latency": latency}


def _llm_mb(rs: RunShape, gpu: GPU, eff: Efficiency, fl: SampleFlops) -> dict:
    """One microbatch on one stage (the stages run different microbatches at the same time)."""
    lay, p = rs.layout, rs.preset.llm
    # the slowest stage holds the most layers (pipesplit.py: megatron-core's split, even unless a run counts
    # the embedding and the loss as layers); its compute is that share of the layers' FLOPs
    layers = most_stage_layers(p.num_layers, lay.llm_pp, rs.virtual_stages, rs.pipeline_split)
    built = splits(p.num_layers, lay.llm_pp, rs.virtual_stages, rs.pipeline_split)
    share = layers * lay.llm_pp / p.num_layers if built else 1.0
    rc = _recompute_factor(rs.recompute.llm)
    cp = lay.llm_cp  # context parallelism: each rank holds 1/cp of every sequence
    g = gemm_factor(gemm_width(p.hidden_size, lay.llm_tp), eff.gemm_half_width)
    if p.num_experts:
        g *= eff.experts
    compute = share * lay.mbs * fl.llm * rc / (lay.llm_tp * cp * lay.llm_pp * gpu.peak_flops * eff.llm * g)
    tokens = lay.mbs * rs.seq_length / cp
    act = tokens * p.hidden_size * rs.dtype_bytes
    nvl = _bw(lay.llm_tp, lay.gpus_per_node, gpu, eff)
    tp = 4 * layers * comm.all_reduce_s(act, lay.llm_tp, nvl)
    steps = 4 * layers * comm.all_reduce_steps(lay.llm_tp)
    if cp > 1:
        # ring attention: each layer passes every rank's keys and values (TP-split heads) around the CP
        # ring forward, and keys, values and their gradients backward
        kv = 2 * tokens * p.query_groups * p.head_dim * rs.dtype_bytes / lay.llm_tp
        tp += (
            3 * layers * comm.reduce_scatter_s(kv * cp, cp, _bw(cp * lay.llm_tp, lay.gpus_per_node, gpu, eff))
        )
        steps += 3 * layers * comm.ring_steps(cp)
    ep = 0.0
    if p.num_experts and lay.llm_ep > 1:
        routed = act * p.moe_router_topk / lay.llm_tp  # each TP rank dispatches its sequence shard
        bw = _bw(lay.llm_ep * lay.llm_tp, lay.gpus_per_node, gpu, eff)
        ep = 4 * layers * comm.all_to_all_s(routed, lay.llm_ep, bw)
        steps += 4 * layers * comm.ring_steps(lay.llm_ep)
    if lay.llm_pp > 1:
        # interleaved stages send a microbatch's activations once per model chunk
        v = rs.virtual_stages
        tp += 2 * v * comm.p2p_s(act / lay.llm_tp, _bw(2 * lay.gpus_per_node, lay.gpus_per_node, gpu, eff))
        steps += 2 * v
    ops = layers * OPS_PER_LAYER * rc + OPS_PER_MICROBATCH
    latency = (ops * gpu.op_s + steps * gpu.step_s) * eff.latency
    return {"compute": compute, "tp": tp, "ep": ep, "latency": latency}


def _dp_s(rs: RunShape, mem: MemoryPlan, gpu: GPU, eff: Efficiency) -> tuple[float, float]:
    """Gradient reduction after the last microbatch, each module over its own DP group, on the slowest rank
    class: (bandwidth s, latency s)."""
    lay = rs.layout
    dps = {m.name: m.dp for m in lay.encoders} | {LLM: lay.llm_dp}
    worst, worst_lat = 0.0, 0.0
    for cls in mem.classes:
        t, steps = 0.0, 0
        for m in cls.modules:
            dp = dps[m.module]
            span = m.ranks[1] - m.ranks[0] + 1
            bw = _bw(span, lay.gpus_per_node, gpu, eff)
            # what crosses the network: every gradient in the reduce dtype and, sharded, every parameter in
            # the compute dtype; under FSDP the rank holds only its shard, not what it moves
            grads = m.grad_bytes if not rs.fsdp else (m.params * rs.grad_reduce_bytes if m.grad_bytes else 0)
            if rs.distributed_optimizer or rs.fsdp:
                t += comm.reduce_scatter_s(grads, dp, bw)
                t += comm.reduce_scatter_s(m.params * rs.dtype_bytes, dp, bw)  # the parameter all-gather
                steps += 2 * comm.ring_steps(dp)
            else:
                t += comm.all_reduce_s(m.grad_bytes, dp, bw)
                steps += comm.all_reduce_steps(dp)
        worst = max(worst, t)
        worst_lat = max(worst_lat, steps * gpu.step_s * eff.latency)
    return worst, worst_lat


def _optimizer_s(mem: MemoryPlan, gpu: GPU) -> float:
    touched = max(
        sum(m.weight_bytes + m.grad_bytes + 2 * m.optimizer_bytes for m in c.modules) for c in mem.classes
    )
    return touched / gpu.hbm_bytes_per_s


@dataclass(frozen=True)
class Pipeline:
    """The modules' microbatches composed into one iteration (compose): the critical path's seconds, each
    part's seconds on it (every module's together), and what bounds it."""

    seconds: float
    parts: dict
    bottleneck: str  # an encoder module's name, or "llm"
    idle_fraction: float
    modules: dict  # one microbatch's seconds per module by its name ("llm": one stage), in rank order
    encoder_compute_s: float  # parts["compute"] split by module
    llm_compute_s: float


def compose(
    encs: dict, llm: dict, microbatches: int, fill: float, colocated: bool, encoder_ranks: bool
) -> Pipeline:
    """The one rule of how the modules' microbatches make an iteration (both time models call it): `encs`
    each encoder module's microbatch by part (seconds on its ranks), `llm` one LLM stage's, `fill` the
    LLM's pipeline bubble in microbatches ((pp - 1) / vp). Each encoder module runs its microbatches on its
    own ranks and sends its embeddings over its own bridge into the LLM's first stage, all at once, so the
    step is bounded by the slowest of the modules: M x slowest + the fill of the other side (the slowest
    encoder's first microbatch when the LLM bounds, the LLM's last when an encoder does) + the LLM's
    pipeline bubble; colocated, every rank runs every module in turn: M x (every encoder + LLM) + bubble.
    `encoder_ranks`: the layout has encoder ranks (a text-only model's wait throughout)."""
    times = {n: sum(p.values()) for n, p in encs.items()}
    l_ = sum(llm.values())
    m = microbatches
    bubble = fill * l_
    every = {**times, LLM: l_}
    # the slowest module bounds the step; of modules equally slow, the LLM
    bottleneck = max(every, key=lambda n: (every[n], n == LLM))
    slow = every[bottleneck]
    if colocated:
        pipe = m * (sum(times.values()) + l_) + bubble
        scale = dict.fromkeys(every, float(m))
        idle = 0.0
    else:
        other = l_ if bottleneck != LLM else max(times.values(), default=0.0)
        pipe = m * slow + other + bubble
        # the module that waits longest: a text-only model's encoder ranks (no module of its) wait throughout
        waits = min(every.values()) if times or not encoder_ranks else 0.0
        idle = 1 - waits / slow if slow > 0 else 0.0
        # the critical path: the bottleneck module's parts M times; the other side once (fill or drain)
        scale = dict.fromkeys(every, 1.0)
        scale[bottleneck] = float(m)
    scale[LLM] += fill
    keys = list(dict.fromkeys([k for p in (*encs.values(), llm) for k in p]))
    parts = {
        k: sum((p.get(k, 0.0) * scale[n] for n, p in encs.items()), 0.0) + llm.get(k, 0.0) * scale[LLM]
        for k in keys
    }
    enc_c = sum((p.get("compute", 0.0) * scale[n] for n, p in encs.items()), 0.0)
    return Pipeline(pipe, parts, bottleneck, idle, every, enc_c, llm.get("compute", 0.0) * scale[LLM])


def step_time(rs: RunShape, mem: MemoryPlan, gpu: GPU, eff: Efficiency) -> StepTime:
    """Every module's microbatch priced from its FLOPs (_module_mb, _llm_mb) and composed into the
    iteration (compose), then the DP transfers and the optimizer pass."""
    lay = rs.layout
    per, fl = sample_flops_by_module(rs.preset, rs.modules, rs.seq_length)
    encs = {n: _module_mb(rs, gpu, eff, i, per[n]) for i, n in enumerate(per)}
    llm = _llm_mb(rs, gpu, eff, fl)
    (dp, dp_lat), opt = _dp_s(rs, mem, gpu, eff), _optimizer_s(mem, gpu)
    if rs.overlap_dp:
        # the gradient reduce-scatter hides behind the last microbatch's backward, the parameter all-gather
        # behind the first one's forward: up to one microbatch's compute of each module is cover
        dp = max(0.0, dp - max([llm["compute"]] + [p["compute"] for p in encs.values()]))
    # the 1F1B bubble, (pp - 1) microbatch times, shrinks by the model chunks per stage under the interleaved
    # schedule (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
    # Megatron-LM", section 2.2.2)
    fill = (lay.llm_pp - 1) / rs.virtual_stages
    pipe = compose(encs, llm, rs.microbatches, fill, lay.colocated, bool(lay.encoder_ranks))
    parts = {
        "compute": pipe.parts["compute"],
        "tp": pipe.parts["tp"],
        "ep": pipe.parts["ep"],
        "bridge": pipe.parts.get("bridge", 0.0),
        "dp": dp,
        "optimizer": opt,
        "latency": pipe.parts["latency"] + dp_lat,
    }
    dominant = max(("compute", "tp", "ep", "dp", "bridge", "latency"), key=lambda k: parts[k])
    return StepTime(
        pipe.seconds + dp + dp_lat + opt,
        max((t for n, t in pipe.modules.items() if n != LLM), default=0.0),
        pipe.modules[LLM],
        parts,
        pipe.bottleneck,
        pipe.idle_fraction,
        dominant,
        fl,
        pipe.encoder_compute_s,
        pipe.llm_compute_s,
        modules=pipe.modules,
    )

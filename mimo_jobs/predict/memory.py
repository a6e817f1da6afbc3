"""Memory per rank class: what each encoder module's ranks and each LLM pipeline stage hold, and whether it
fits.

Per module on a rank (docs/predict.md has the sources and the derivation):
  weights     parameters after sharding (params.py) x bytes of the parameter dtype;
  gradients   megatron DDP's gradient buffer in the dtype the run reduces in (RunShape.grad_reduce_bytes:
              fp32 in the packaged trainer), padded for the distributed optimizer as megatron-core pads it;
  optimizer   Adam: fp32 exp_avg + exp_avg_sq (+ a 4-byte step counter per tensor), plus fp32 main params
              under bf16; the distributed optimizer keeps only this rank's shard of the buffer (the dense
              buffer over the DP x CP group, the expert buffer over the expert-DP group);
  activations bytes autograd keeps per microbatch and model chunk (activations.py) x the chunks the
              pipeline schedule holds at its peak (1F1B, interleaved with virtual stages), plus full
              recompute's one-layer workspace once;
  bridge      the embeddings in flight and their gradients, over each module's own bridge.
Plus a fixed framework allowance per GPU (hardware.GPU.framework_bytes).
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import itertools
import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass

from mimo_jobs.study.topology import module_ranges

from . import activations as A
from .hardware import GIB, GPU
from .params import Tensor, llm_layer_tensors, llm_parts, llm_tensors, module_tensors
from .pipesplit import EVEN, stage_layers
from .run import RunShape

GRAD_BYTES = 4  # the packaged trainer's gradient buffer: grad_reduce_in_fp32 in trainer/build.py
MOMENTUM_BYTES = 4  # SGD's fp32 momentum buffer
ADAM_STATE_BYTES = 8  # exp_avg + exp_avg_sq, fp32
STEP_BYTES = 4  # torch Adam's per-tensor step counter (a float32 scalar tensor)
MAIN_PARAM_BYTES = 4  # fp32 master copy under bf16


@dataclass(frozen=True)
class ModuleMemory:
    module: str  # an encoder module's name in the study (`vision`, `audio`), or "llm"
    stage: int
    ranks: tuple[int, int]  # first and last global rank of the class
    params: int
    weight_bytes: int
    grad_bytes: int
    optimizer_bytes: int
    activation_bytes: int
    bridge_bytes: int
    inflight: int  # microbatches whose activations are held at the peak

    @property
    def total_bytes(self) -> int:
        return (
            self.weight_bytes
            + self.grad_bytes
            + self.optimizer_bytes
            + self.activation_bytes
            + self.bridge_bytes
        )


@dataclass(frozen=True)
class RankClass:
    """Ranks that hold the same: one module (heterogeneous) or both (colocated)."""

    ranks: tuple[int, int]
    modules: tuple[ModuleMemory, ...]
    framework_bytes: int

    @property
    def total_bytes(self) -> int:
        return sum(m.total_bytes for m in self.modules) + self.framework_bytes


@dataclass(frozen=True)
class MemoryPlan:
    classes: tuple[RankClass, ...]
    capacity_bytes: int

    @property
    def worst(self) -> RankClass:
        return max(self.classes, key=lambda c: c.total_bytes)

    @property
    def fits(self) -> bool:
        return self.worst.total_bytes <= self.capacity_bytes

    def verdict(self) -> str:
        return verdict_text(self.worst.total_bytes, self.capacity_bytes, self.worst.ranks[0])


def verdict_text(used: int, capacity: int, rank: int) -> str:
    """`fits, 12.3 GiB free` or `over by 4.1 GiB on rank 17`."""
    if used <= capacity:
        return f"fits, {(capacity - used) / GIB:.1f} GiB free"
    return f"over by {(used - capacity) / GIB:.1f} GiB on rank {rank}"


# -- gradient buffer and the distributed optimizer's shards


@dataclass(frozen=True)
class Buffer:
    """One DDP gradient buffer: where each tensor starts and ends, and the padded size."""

    starts: tuple[int, ...]
    ends: tuple[int, ...]
    size: int
    dp: int

    @property
    def numel(self) -> int:
        return sum(e - s for s, e in zip(self.starts, self.ends))


def _pad(n: int, to: int) -> int:
    return -(-n // to) * to


def buffer_of(numels: Sequence[int], dp: int, distributed: bool) -> Buffer:
    """megatron-core's _ParamAndGradBuffer with one bucket (overlap_grad_reduce is off): tensors in reverse
    order; under the distributed optimizer each starts at a multiple of 64 and the end is padded to a
    multiple of lcm(dp, 128)."""
    order = numels[::-1]
    # a tensor starts where the one before it starts plus that one's size (padded to 64: the start before it
    # is a multiple of 64 already), summed in C: plan lays out buffers of thousands of experts
    steps = list(map({n: -(-n // 64) * 64 for n in set(order)}.__getitem__, order)) if distributed else order
    starts = tuple(itertools.accumulate(steps[:-1], initial=0)) if order else ()
    ends = tuple(map(operator.add, starts, order))
    pos = ends[-1] if ends else 0
    size = _pad(pos, math.lcm(dp, 128)) if distributed and numels else pos
    return Buffer(starts, ends, size, dp)


def shard_of(buf: Buffer, dp_rank: int) -> tuple[int, int]:
    """(elements, tensor pieces) of the buffer in DP rank `dp_rank`'s shard."""
    lo, hi = buf.size // buf.dp * dp_rank, buf.size // buf.dp * (dp_rank + 1)
    i = bisect.bisect_right(buf.ends, lo)
    n = pieces = 0
    while i < len(buf.starts) and buf.starts[i] < hi:
        overlap = min(hi, buf.ends[i]) - max(lo, buf.starts[i])
        if overlap > 0:
            n += overlap
            pieces += 1
        i += 1
    return n, pieces


def _state_bytes(elements: int, pieces: int, optimizer: str, bf16: bool) -> int:
    main = MAIN_PARAM_BYTES * elements if bf16 else 0
    if optimizer == "sgd":
        return MOMENTUM_BYTES * elements + main  # the momentum buffer
    return ADAM_STATE_BYTES * elements + STEP_BYTES * pieces + main


def optimizer_bytes(
    buffers: list[Buffer], distributed: bool, optimizer: str, bf16: bool, dp_rank=None
) -> int:
    """Optimizer state on DP rank `dp_rank` (None: the largest over the DP ranks)."""
    total = 0
    for b in buffers:
        if not b.starts:
            continue
        if not distributed:
            total += _state_bytes(b.numel, len(b.starts), optimizer, bf16)
            continue
        shards = all_shards(b) if dp_rank is None else [shard_of(b, dp_rank % b.dp)]
        total += max(_state_bytes(n, pieces, optimizer, bf16) for n, pieces in shards)
    return total


def all_shards(buf: Buffer) -> list[tuple[int, int]]:
    """shard_of for every DP rank in one pass over the tensors (plan prices DP up to hundreds)."""
    dp, width = buf.dp, buf.size // buf.dp
    n, pieces = [0] * dp, [0] * dp
    for s, e in zip(buf.starts, buf.ends) if width else ():
        if e <= s:
            continue  # an empty tensor is a piece of no shard
        first = s // width
        hi = (first + 1) * width
        if e <= hi:  # the whole tensor in one shard: most tensors
            n[first] += e - s
            pieces[first] += 1
            continue
        n[first] += hi - s  # its head, then every shard it covers, then its tail
        pieces[first] += 1
        for r in range(first + 1, min(dp, -(-e // width))):
            n[r] += min(e, (r + 1) * width) - r * width
            pieces[r] += 1
    return list(zip(n, pieces))


def buffers_of(tensors: list[Tensor], dp: int, edp: int, distributed: bool) -> list[Buffer]:
    dense = [t.numel for t in tensors if not t.expert and not t.frozen]  # a frozen tensor has no gradient
    expert = [t.numel for t in tensors if t.expert and not t.frozen]
    return [buffer_of(dense, dp, distributed)] + ([buffer_of(expert, edp, distributed)] if expert else [])


# -- per module


def _numels(tensors) -> tuple[int, tuple[int, ...], tuple[int, ...]]:
    """(parameters, the dense buffer's tensor sizes, the expert buffer's) of one rank's tensors, in
    registration order; a frozen tensor has no gradient, so no place in a buffer."""
    params, dense, expert = 0, [], []
    for t in tensors:
        params += t.numel
        if not t.frozen:
            (expert if t.expert else dense).append(t.numel)
    return params, tuple(dense), tuple(expert)


# One buffer's padded size and its optimizer state depend only on its tensor sizes, its DP and the optimizer:
# `plan` prices hundreds of layouts whose ranks share a few dozen buffers (the dense buffer of a stage is the
# same whatever the expert layout; an encoder's whatever the LLM's), so each is laid out and sharded once
# (1024 of them at most: an MoE stage's buffer lists tens of thousands of tensor sizes).
@functools.lru_cache(maxsize=1024)
def _buffer_held(numels: tuple[int, ...], dp: int, distributed: bool, optimizer: str, bf16: bool):
    """(padded elements, optimizer bytes on the fullest DP rank) of one gradient buffer (buffer_of)."""
    b = buffer_of(numels, dp, distributed)
    return b.size, optimizer_bytes([b], distributed, optimizer, bf16)


def _held_numels(numels: tuple, dp: int, edp: int, state: tuple, frozen: bool) -> tuple[int, int, int]:
    """(parameters, gradient bytes, optimizer bytes) of one rank's tensors given as _numels; `state`:
    _state_key. The dense buffer is sharded over `dp`, the expert buffer (if any) over `edp`."""
    distributed, optimizer, bf16, grad_bytes = state
    params, dense, expert = numels
    if frozen:
        return params, 0, 0
    bufs = [(dense, dp)] + ([(expert, edp)] if expert else [])
    held = [_buffer_held(n, d, distributed, optimizer, bf16) for n, d in bufs]
    return params, sum(size for size, _ in held) * grad_bytes, sum(opt for _, opt in held)


def _held(tensors: list[Tensor], dp: int, edp: int, state: tuple, frozen: bool) -> tuple[int, int, int]:
    """(parameters, gradient bytes, optimizer bytes) of one rank's tensors; `state`: _state_key."""
    return _held_numels(_numels(tensors), dp, edp, state, frozen)


# What a rank holds depends only on how its module is sharded, not on the rest of the layout: `plan` prices
# hundreds of layouts that share a handful of shardings, so each is counted once.
@functools.lru_cache(maxsize=4096)
def _module_held(state: tuple, arch, llm_hidden: int, tp: int, dp: int, frozen: bool) -> tuple[int, int, int]:
    return _held(module_tensors(arch, llm_hidden, tp), dp, dp, state, frozen)


@functools.lru_cache(maxsize=4096)
def _llm_held(state: tuple, preset, tp, ep, etp, pp, stage, dp, edp, frozen: bool, vp=1, split=EVEN):
    return _held_numels(_llm_stage_numels(preset, tp, ep, etp, pp, stage, vp, split), dp, edp, state, frozen)


@functools.lru_cache(maxsize=1024)
def _llm_stage_tensors(preset, tp, ep, etp, pp, stage, vp=1, split=EVEN) -> tuple:
    # one stage's tensors do not depend on DP: layouts that differ only in DP share them
    return tuple(llm_tensors(preset, tp, ep, etp, pp, stage, vp, split))


@functools.lru_cache(maxsize=1024)
def _llm_stage_numels(preset, tp, ep, etp, pp, stage, vp=1, split=EVEN) -> tuple:
    """_numels of one stage's tensors (llm_tensors), each of its parts read once: its layers of one kind are
    one list (params.llm_parts), tens of thousands of expert tensors in an MoE stage."""
    params, dense, expert = 0, [], []
    read: dict[int, tuple] = {}  # by the part's identity: the parts list holds every part while it is read
    for part in llm_parts(preset, tp, ep, etp, pp, stage, vp, split):
        if id(part) not in read:
            read[id(part)] = _numels(part)
        n, d, e = read[id(part)]
        params += n
        dense += d
        expert += e
    return params, tuple(dense), tuple(expert)


@contextlib.contextmanager
def unmemoised():
    """Inside, this module's memoised functions compute afresh on every call: the baseline benchmarks/predict.py
    times the plan against, and what tests compare the memoised figures to."""
    names = globals()
    cached = {
        n: f
        for n, f in names.items()
        if hasattr(f, "cache_clear") and getattr(f, "__module__", "") == __name__
    }
    names.update({n: f.__wrapped__ for n, f in cached.items()})
    try:
        yield
    finally:
        names.update(cached)


def _state_key(rs: RunShape) -> tuple:
    return (rs.distributed_optimizer, rs.optimizer, rs.bf16, rs.grad_reduce_bytes)


def _module(rs: RunShape, module: str, stage: int, ranks, held, act, bridge, inflight) -> ModuleMemory:
    params, grads, opt = held
    return ModuleMemory(
        module, stage, ranks, params, params * rs.dtype_bytes, grads, opt, act, bridge, inflight
    )


def module_memory(rs: RunShape, gpu: GPU, i: int) -> ModuleMemory:
    """Encoder module `i` (rs.modules[i]) on one of its ranks, under its name in the study: its shard of its
    encoder and projector over its own TP and DP, the microbatches it keeps (one colocated; else what
    encoder_inflight lets it run ahead, at most the LLM's stages' worth), and on ranks of its own the
    embeddings in flight over its bridge and their gradients."""
    lay = rs.layout
    name, arch = rs.preset.named_encoders[i]
    mix, mr = rs.modules[i], module_ranges(lay)[i]
    keep = 1 if lay.colocated else min(rs.microbatches, max(rs.encoder_inflight, lay.llm_pp))
    samples = mr.samples_per_encoder_microbatch
    bridge = 0 if lay.colocated else 2 * keep * A.bridge_bytes(rs, mix, samples)
    hl = rs.preset.llm.hidden_size
    held = _module_held(_state_key(rs), arch, hl, mr.tp, mr.dp, rs.frozen_encoder)
    act = keep * A.module_bytes(rs, i, gpu.layers)
    return _module(rs, name, 0, (mr.rank_start, mr.rank_end - 1), held, act, bridge, keep)


def llm_memory(rs: RunShape, gpu: GPU, stage: int) -> ModuleMemory:
    lay = rs.layout
    tp, pp, dp = lay.llm_tp, lay.llm_pp, lay.llm_dp
    # megatron-core reduces gradients and shards the distributed optimizer over DP x CP (the data-parallel
    # group with context parallelism, parallel_state's get_data_parallel_group(with_context_parallel=True));
    # the expert buffer over the expert-DP group, TP x CP x DP / (EP x ETP)
    shard = dp * lay.llm_cp
    edp = tp * shard // (lay.llm_ep * lay.llm_etp) if rs.preset.llm.num_experts else shard
    keep = max(1, min(rs.microbatches, pp - stage))  # 1F1B: stage s of p runs p - s - 1 warm-up forwards
    a = A.llm_stage(rs, stage, gpu.layers)
    held = A.inflight_chunk_bytes(pp, rs.virtual_stages, rs.microbatches, stage, a.chunks)
    act = int(held + keep * a.extra + a.workspace)
    bridge = 2 * keep * A.embedding_bytes(rs, lay.mbs) if stage == 0 and not lay.colocated else 0
    first = lay.llm_offset + tp * stage
    last = first + tp * pp * (dp - 1) + tp - 1
    if rs.fsdp:
        return _fsdp_module(rs, stage, (first, last), shard, act, bridge, keep)
    held = _llm_held(
        _state_key(rs),
        rs.preset,
        tp,
        lay.llm_ep,
        lay.llm_etp,
        pp,
        stage,
        shard,
        edp,
        rs.frozen_llm,
        rs.virtual_stages,
        rs.pipeline_split,
    )
    return _module(rs, "llm", stage, (first, last), held, act, bridge, keep)


FSDP_GATHERED_LAYERS = (
    2  # the layer computing and the one FSDP2 prefetches (torch's default forward prefetch)
)


def _fsdp_module(
    rs: RunShape, stage: int, ranks, shard: int, act: int, bridge: int, keep: int
) -> ModuleMemory:
    """A stage under FSDP with mixed precision, as torch's FSDP2 keeps it: the parameters sharded over DP
    in fp32 (they are the main copy), their gradients sharded in the reduce dtype, Adam's two fp32 states
    sharded; and, unsharded in the compute dtype, the parameters of the layers being computed and the
    gradients of the layer being reduced."""
    lay, p = rs.layout, rs.preset.llm
    tensors = _llm_stage_tensors(
        rs.preset,
        lay.llm_tp,
        lay.llm_ep,
        lay.llm_etp,
        lay.llm_pp,
        stage,
        rs.virtual_stages,
        rs.pipeline_split,
    )
    params = sum(t.numel for t in tensors)
    first = (stage_layers(p.num_layers, lay.llm_pp, rs.virtual_stages, rs.pipeline_split, stage) or [0])[0]
    layer = sum(t.numel for t in llm_layer_tensors(p, first, lay.llm_tp, 1, 1))
    sharded = -(-params // shard)
    weights = MAIN_PARAM_BYTES * sharded + FSDP_GATHERED_LAYERS * layer * rs.dtype_bytes
    grads = 0 if rs.frozen_llm else rs.grad_reduce_bytes * sharded + layer * rs.dtype_bytes
    opt = 0 if rs.frozen_llm else ADAM_STATE_BYTES * sharded + STEP_BYTES * len(tensors)
    return ModuleMemory("llm", stage, ranks, params, weights, grads, opt, act, bridge, keep)


def memory_plan(rs: RunShape, gpu: GPU) -> MemoryPlan:
    """One rank class per encoder module on ranks of its own, then one per LLM stage (whose first holds the
    bridge of every module's embeddings); colocated, one class per LLM stage holding every module. A
    text-only model: the LLM's ranks only (a layout's encoder ranks hold nothing it describes)."""
    lay, fw = rs.layout, gpu.framework_bytes
    encs = tuple(module_memory(rs, gpu, i) for i in range(len(rs.modules)))
    stages = [llm_memory(rs, gpu, s) for s in range(lay.llm_pp)]
    if lay.colocated:
        classes = tuple(RankClass(s.ranks, (*encs, s), fw) for s in stages)
    else:
        classes = tuple(RankClass(e.ranks, (e,), fw) for e in encs)
        classes += tuple(RankClass(s.ranks, (s,), fw) for s in stages)
    return MemoryPlan(classes, gpu.memory_bytes)

"""Memory per rank class and iteration time of a model priced module by module (modmix.by_module: several
encoders, or an audio one), with the one-encoder formulas of memory.py, activations.py and steptime.py
applied to each module on its own ranks (topology.module_ranges).

- an image module is priced exactly as the one encoder is, on a view of the run holding that module alone
  (its sizes, its samples per microbatch, its token mix);
- an audio module (model/audio_arch.py) holds params.audio_tensors and its projector (the frozen position
  table has no gradient and no optimizer state), and keeps per microbatch what audio_bytes counts;
- memory: one rank class per encoder module (its own ranks), then one per LLM stage, whose bridge holds
  every module's embeddings; colocated: one class per LLM stage holding every module;
- time: each encoder module runs its microbatches on its own ranks and sends its embeddings over its own
  bridge into the LLM's first stage, all at once, so the step is bounded by the slowest of the encoder
  modules and the LLM stages: M x slowest + the fill of the other side (the slowest encoder's first
  microbatch when the LLM bounds, the LLM's last when an encoder does) + the LLM's pipeline bubble;
  colocated, every rank runs every module in turn: M x (all encoders + LLM) + bubble.
"""

from __future__ import annotations

import functools
from dataclasses import replace

from mimo_jobs.model.arch import ModelArch
from mimo_jobs.model.attention import keeps_scores
from mimo_jobs.study.topology import module_ranges

from . import activations as A
from . import comm
from .flops import SampleFlops
from .hardware import GPU
from .memory import MemoryPlan, ModuleMemory, RankClass, _held, _state_key, encoder_memory, llm_memory
from .modmix import sample_flops_by_module
from .params import module_tensors
from .run import RunShape
from .steptime import Efficiency, StepTime, _bw, _encoder_mb, _llm_mb, _optimizer_s


def _view(rs: RunShape, i: int) -> RunShape:
    """The run as one encoder module sees it: module `i` alone with the LLM, its tokens and samples."""
    lay = rs.layout
    name, arch = rs.preset.named_encoders[i]
    mix, mr = rs.modules[i], module_ranges(lay)[i]
    return replace(
        rs,
        preset=ModelArch(rs.preset.name, None, rs.preset.llm, encoders={name: arch}),
        layout=replace(lay, encoders=(lay.encoders[i],)),
        image_tokens_mean=mix.tokens_mean,
        tokens_per_image=mix.tokens_per_item,
        image_tokens_max=mix.tokens_max,
        encoder_samples_per_microbatch=mr.samples_per_encoder_microbatch,
        modules=(),
    )


def audio_bytes(rs: RunShape, a, mix, samples: int, tp: int, layers: str) -> int:
    """One audio microbatch of `samples` samples, each at its most audio tokens (mix.tokens_max, in whole
    clips of mix.frames frames), as activations.encoder_bytes counts a ViT's: per layer and position the
    norm inputs and fp32 statistics, the QKV input, Q, K, V, the projection input, the MLP's two tensors of
    width f, and the scores unless fused or recomputed; before the layers the spectrogram, conv1's output
    and its GELU's (conv2's input), conv2's output and its GELU's; after them the pool, the final norm and
    the projector's inputs."""
    d, h, hl = rs.dtype_bytes, a.hidden_size, rs.preset.llm.hidden_size
    clips = mix.max_items * samples
    frames = mix.frames
    n = a.positions_for_frames(frames) if frames else 0  # positions per clip inside the transformer
    positions = clips * n
    replicated = d * 4 * h + A.LN_STATS
    shard = d * (3 * h + h) + d * 2 * a.ffn_hidden_size
    if not keeps_scores(layers, rs.attention):
        shard += 4 * a.num_attention_heads
    elif rs.recompute.encoder == "none":
        shard += d * a.num_attention_heads * n
    per_layer = replicated + shard / tp
    if rs.recompute.encoder == "full":
        body = positions * (a.num_layers * d * h + per_layer)
    else:
        body = positions * a.num_layers * per_layer
    convs = clips * frames * d * (a.num_mel_bins + 2 * h) + positions * d * 2 * h
    out_tokens = clips * (n // a.pooling)
    after = positions * d * h * (a.pooling > 1) + out_tokens * (d * h + A.LN_STATS // 2)
    projector = out_tokens * d * (a.out_width + 2 * hl / tp)
    masks = clips * A.mask_bytes(rs, layers, n)
    return int(body + convs + after + projector + masks)


@functools.lru_cache(maxsize=1024)
def _audio_held(state: tuple, a, llm_hidden: int, tp: int, dp: int, frozen: bool) -> tuple[int, int, int]:
    return _held(module_tensors(a, llm_hidden, tp), dp, dp, state, frozen)


def _audio_memory(rs: RunShape, gpu: GPU, i: int) -> ModuleMemory:
    lay = rs.layout
    name, a = rs.preset.named_encoders[i]
    mix, mr = rs.modules[i], module_ranges(lay)[i]
    keep = 1 if lay.colocated else min(rs.microbatches, max(rs.encoder_inflight, lay.llm_pp))
    samples = mr.samples_per_encoder_microbatch
    per_mb = audio_bytes(rs, a, mix, samples, mr.tp, gpu.layers)
    hl = rs.preset.llm.hidden_size
    bridge = 0 if lay.colocated else 2 * keep * int(samples * mix.tokens_max * hl * rs.dtype_bytes)
    params, grads, opt = _audio_held(_state_key(rs), a, hl, mr.tp, mr.dp, rs.frozen_encoder)
    return ModuleMemory(
        name,
        0,
        (mr.rank_start, mr.rank_end - 1),
        params,
        params * rs.dtype_bytes,
        grads,
        opt,
        keep * per_mb,
        bridge,
        keep,
    )


def module_memory(rs: RunShape, gpu: GPU, i: int) -> ModuleMemory:
    """Encoder module `i` on one of its ranks, under its own name."""
    name, arch = rs.preset.named_encoders[i]
    if arch.modality == "audio":
        return _audio_memory(rs, gpu, i)
    mr = module_ranges(rs.layout)[i]
    return replace(encoder_memory(_view(rs, i), gpu), module=name, ranks=(mr.rank_start, mr.rank_end - 1))


def memory_plan(rs: RunShape, gpu: GPU) -> MemoryPlan:
    lay, fw = rs.layout, gpu.framework_bytes
    encs = tuple(module_memory(rs, gpu, i) for i in range(len(rs.modules)))
    stages = [llm_memory(rs, gpu, s) for s in range(lay.llm_pp)]
    if lay.colocated:
        classes = tuple(RankClass(s.ranks, (*encs, s), fw) for s in stages)
    else:
        classes = tuple(RankClass(e.ranks, (e,), fw) for e in encs)
        classes += tuple(RankClass(s.ranks, (s,), fw) for s in stages)
    return MemoryPlan(classes, gpu.memory_bytes)


def _module_mb(rs: RunShape, gpu: GPU, eff: Efficiency, i: int, flops: float) -> dict:
    """One microbatch of module `i` on its ranks, by part (`flops`: its FLOPs per sample). An audio module
    runs steptime's encoder formula with its own FLOPs and tokens."""
    return _encoder_mb(_view(rs, i), gpu, eff, SampleFlops(flops, 0.0))


def _dp_s(rs: RunShape, mem: MemoryPlan, gpu: GPU, eff: Efficiency) -> tuple[float, float]:
    """steptime's gradient reduction with each module over its own DP group."""
    lay = rs.layout
    dps = {m.name: m.dp for m in lay.encoders} | {"llm": lay.llm_dp}
    worst, worst_lat = 0.0, 0.0
    for cls in mem.classes:
        t, steps = 0.0, 0
        for m in cls.modules:
            dp = dps[m.module]
            bw = _bw(m.ranks[1] - m.ranks[0] + 1, lay.gpus_per_node, gpu, eff)
            if rs.distributed_optimizer:
                t += comm.reduce_scatter_s(m.grad_bytes, dp, bw) + comm.reduce_scatter_s(
                    m.weight_bytes, dp, bw
                )
                steps += 2 * comm.ring_steps(dp)
            else:
                t += comm.all_reduce_s(m.grad_bytes, dp, bw)
                steps += comm.all_reduce_steps(dp)
        worst = max(worst, t)
        worst_lat = max(worst_lat, steps * gpu.step_s * eff.latency)
    return worst, worst_lat


def step_time(rs: RunShape, mem: MemoryPlan, gpu: GPU, eff: Efficiency) -> StepTime:
    lay = rs.layout
    per, fl = sample_flops_by_module(rs.preset, rs.modules, rs.seq_length)
    encs = {n: _module_mb(rs, gpu, eff, i, per[n]) for i, n in enumerate(per)}
    llm = _llm_mb(rs, gpu, eff, fl)
    times = {n: sum(p.values()) for n, p in encs.items()}
    l_ = sum(llm.values())
    m = rs.microbatches
    (dp, dp_lat), opt = _dp_s(rs, mem, gpu, eff), _optimizer_s(mem, gpu)
    if rs.overlap_dp:
        dp = max(0.0, dp - max([llm["compute"]] + [p["compute"] for p in encs.values()]))
    fill = (lay.llm_pp - 1) / rs.virtual_stages
    bubble = fill * l_
    every = {**times, "llm": l_}
    bottleneck = max(every, key=every.get)
    slow = every[bottleneck]
    if lay.colocated:
        pipe = m * (sum(times.values()) + l_) + bubble
        scale = dict.fromkeys(every, float(m))
        idle = 0.0
    else:
        other = l_ if bottleneck != "llm" else max(times.values())
        pipe = m * slow + other + bubble
        idle = 1 - min(every.values()) / slow if slow > 0 else 0.0
        # the critical path: the bottleneck module's parts M times; the other side once (fill or drain)
        scale = dict.fromkeys(every, 1.0)
        scale[bottleneck] = float(m)
    scale["llm"] += fill
    enc_c = sum(p["compute"] * scale[n] for n, p in encs.items())
    llm_c = llm["compute"] * scale["llm"]
    parts = {
        "compute": enc_c + llm_c,
        "tp": sum(p["tp"] * scale[n] for n, p in encs.items()) + llm["tp"] * scale["llm"],
        "ep": llm["ep"] * scale["llm"],
        "bridge": sum(p["bridge"] * scale[n] for n, p in encs.items()),
        "dp": dp,
        "optimizer": opt,
        "latency": sum(p["latency"] * scale[n] for n, p in encs.items())
        + llm["latency"] * scale["llm"]
        + dp_lat,
    }
    dominant = max(("compute", "tp", "ep", "dp", "bridge", "latency"), key=lambda k: parts[k])
    return StepTime(
        pipe + dp + dp_lat + opt,
        max(times.values()),
        l_,
        parts,
        bottleneck,
        idle,
        dominant,
        fl,
        enc_c,
        llm_c,
        modules=every,
    )

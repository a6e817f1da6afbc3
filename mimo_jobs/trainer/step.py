"""One training iteration: heterogeneous (encoder ranks | LLM ranks), colocated (both modules on every rank,
no bridge) or the one-process reference.

Per iteration:
  data      every rank draws the iteration's microbatches for its lanes (deterministic streams);
  tokens    N = loss-bearing tokens of the whole global batch, all-reduced over the world, so every rank
            scales by the same 1/N (per-token loss; DDP sums): gradients do not depend on enc_dp/llm_dp
            or on which encoder ranks saw images;
  encoder   1F1B across the bridge: each microbatch drawn, forwarded and sent as the encoder reaches it;
            once `encoder_inflight` await their gradient, the oldest one's backward runs before the next
            forward (saved activations bounded by the in-flight count, not the microbatch count);
  LLM       per microbatch: receive image embeddings, scatter them into the image-token positions,
            forward, per-token loss * mask summed / N, backward, send the embedding gradient back;
  finalize  per-module DDP reduce on the module's own groups (finalize_model_grads);
  optimizer MimoOptimizer (global norm, world-wide skip agreement), LR by consumed samples.
The reference runs the same functions in one process: encoder replicas and lanes in a loop, the encoder
output handed to the LLM directly (no bridge), one backward per microbatch.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from mimo_jobs.trainer.build import TrainState, rank_lanes
from mimo_jobs.trainer.parallel.bridge import segments_of_encoder


@dataclass
class StepStats:
    iteration: int
    loss: float  # token-weighted mean over the global batch
    tokens: int
    grad_norm: float | None
    lr: float
    skipped: bool
    nan: bool
    elapsed_s: float
    phases_s: dict = field(default_factory=dict)
    moe_aux_loss: float | None = None
    image_tokens: int = 0
    empty_encoder_microbatches: int = 0  # encoder microbatches with no image at all (this rank)
    saved_peak_bytes: int = 0  # most bytes autograd held for backward during the step (this rank)
    inflight_peak: int = 0  # most encoder microbatches awaiting their backward (encoder ranks)


class _Timer:
    def __init__(self):
        self.acc: dict[str, float] = {}

    def add(self, k: str, dt: float) -> None:
        self.acc[k] = self.acc.get(k, 0.0) + dt


def _tick() -> float:
    return time.perf_counter()


def _causal_mask(s: int, device):
    import torch

    return torch.triu(torch.ones(s, s, dtype=torch.bool, device=device), diagonal=1)[None, None]


def check_alignment(batch, image_token_id: int) -> None:
    """The runtime alignment invariant: placeholder tokens per sample == the image token counts."""
    got = (batch.tokens == image_token_id).sum(dim=1).tolist()
    if got != list(batch.image_token_counts):
        raise RuntimeError(
            f"lane {batch.lane} microbatch {batch.microbatch}: image placeholder tokens per "
            f"sample {got} != image_token_counts {batch.image_token_counts}"
        )


def llm_forward(st: TrainState, batch, img_emb, hidden=None):
    """The LLM on one lane's microbatch. Whole (or on the last pipeline stage): the sum over the lane's
    loss-bearing tokens of the per-token loss (not yet divided by N). On an earlier stage: its output hidden
    states, for the next stage. The first stage embeds the tokens and scatters the image embeddings in;
    a later one continues from `hidden`, the previous stage's output."""
    lm = st.language
    gpt = lm.core
    dev = st.device
    role = st.role
    if role.is_first_stage or st.reference:
        dec_in = _decoder_input(st, batch, img_emb)
    else:
        gpt.set_input_tensor(hidden)
        dec_in = None
    last = role.is_last_stage or st.reference
    # masked positions carry IGNORE_INDEX; loss_mask drops them
    labels = batch.labels.to(dev).clamp(min=0) if last else None
    out = lm.model(
        input_ids=None,
        position_ids=batch.position_ids.to(dev),
        attention_mask=_causal_mask(batch.tokens.shape[1], dev),
        decoder_input=dec_in,
        labels=labels,
    )
    if not last:
        return out
    return (out.float() * batch.loss_mask.to(dev)).sum()


def _decoder_input(st: TrainState, batch, img_emb):
    """Token embeddings with the image embeddings scattered into the image-token positions, [s, b, h] (the
    local sequence shard under sequence parallelism)."""
    lm = st.language
    gpt = lm.core
    tokens = batch.tokens.to(st.device)
    emb = gpt.embedding.word_embeddings(tokens)  # [b, s, h], complete on every TP rank
    mask = tokens == st.image_token_id
    if img_emb is not None and img_emb.shape[0] > 0:
        # masked_scatter fills positions in row-major order: sample 0's image tokens first, as the bridge sends
        emb = emb.masked_scatter(mask.unsqueeze(-1), img_emb.to(emb.dtype))
    dec_in = emb.transpose(0, 1).contiguous()  # mcore wants [s, b, h]
    if gpt.config.sequence_parallel:
        from megatron.core.tensor_parallel.mappings import scatter_to_sequence_parallel_region

        dec_in = scatter_to_sequence_parallel_region(dec_in, group=lm.pgc.tp)
    return dec_in


def encoder_forward(st: TrainState, images: list):
    """Flat embeddings [sum N_i, H] of the images present (None entries are text-only samples)."""
    import torch

    ims = [im.to(st.device) for im in images if im is not None]
    enc = st.encoder
    if not ims:
        return torch.zeros(0, st.preset.llm.hidden_size, dtype=st.prec.dtype, device=st.device)
    if enc.frozen:
        with torch.no_grad():
            return enc.model(ims)
    return enc.model(ims)


def _encoder_samples(st: TrainState, lane_batches: dict, segs):
    """This encoder replica's samples of one microbatch, in global order: (images, keys, counts)."""
    images, keys, counts = [], [], []
    for g in segs:
        b = lane_batches[g.lane]
        sl = slice(g.lane_start, g.lane_start + g.n)
        images += (b.images or [None] * len(b.sample_keys))[sl]
        keys += b.sample_keys[sl]
        counts += b.image_token_counts[sl]
    return images, keys, counts


def _zero_grads(st: TrainState) -> None:
    for m in (st.encoder, st.language):
        if m is not None and m.ddp is not None:
            m.ddp.zero_grad_buffer()
    st.optimizer.zero_grad()


def _finalize(st: TrainState) -> None:
    from megatron.core.distributed.finalize_model_grads import finalize_model_grads

    for m in (st.encoder, st.language):
        if m is not None and m.ddp is not None:
            finalize_model_grads([m.ddp], pg_collection=m.pgc)


def _world_sum(st: TrainState, values: list[float]) -> list[float]:
    import torch
    import torch.distributed as dist

    t = torch.tensor(values, dtype=torch.float64 if st.device == "cpu" else torch.float32, device=st.device)
    dist.all_reduce(t)
    return t.tolist()


def _moe_aux(st: TrainState) -> float:
    """Mean over layers of the load-balancing loss summed over this iteration's microbatches; cleared."""
    if not st.preset.llm.num_experts or st.language is None:
        return 0.0
    import torch.distributed as dist
    from megatron.core.transformer.moe.moe_utils import (
        clear_aux_losses_tracker,
        get_moe_layer_wise_logging_tracker,
    )

    tr = get_moe_layer_wise_logging_tracker()
    v = 0.0
    for x in tr.values():
        vals = x["values"]
        if _sp_size(st) > 1:  # with sequence parallelism each TP rank holds its shard's partial loss
            vals = vals.clone()
            dist.all_reduce(vals, group=st.language.pgc.tp)
        if st.llm_shape.pp > 1 and not st.reference:  # each stage filled the slots of its own layers
            vals = vals.clone()
            dist.all_reduce(vals, group=st.language.pgc.pp)
        v += float(vals.mean())
    clear_aux_losses_tracker()
    return v


def _sp_size(st: TrainState) -> int:
    cfg = st.language.core.config
    return cfg.tensor_model_parallel_size if cfg.sequence_parallel else 1


def _set_aux_scale(st: TrainState, n_tokens: float) -> None:
    if st.preset.llm.num_experts and st.language is not None:
        import torch
        from megatron.core.transformer.moe.moe_utils import MoEAuxLossAutoScaler

        # Per-token-loss mode: the aux loss gradient is scaled like the main loss (1/N). mcore 0.16.1 weights
        # each rank's (partial, under sequence parallelism) aux loss by its LOCAL token count, which SP
        # divides by the TP size; multiplying back keeps the gradient independent of the LLM's TP size.
        scale = _sp_size(st) / max(n_tokens, 1.0)
        MoEAuxLossAutoScaler.set_loss_scale(torch.tensor(scale, device=st.device))


def train_step(st: TrainState) -> StepStats:
    """One iteration on this rank (see the module doc). Every rank runs the same world collectives in the
    same order: the token all-reduce, the optimizer's agreements, the figures' all-reduce."""
    t0 = _tick()
    tm = _Timer()
    lr = st.schedule(st.consumed_samples)
    st.optimizer.set_lr(lr)
    _zero_grads(st)
    # An encoder rank draws each microbatch when it runs it (its images are the memory that matters); the
    # others draw the iteration's token batches first: N, the global batch's loss-bearing tokens, scales
    # every backward and must be known before the first.
    lazy = _encoder_only(st)
    batches = [] if lazy else _draw_batches(st, tm)
    n_tokens = _global_tokens(st, batches)
    _set_aux_scale(st, n_tokens)
    st.meter.reset_peak()
    with st.meter.hooks():
        tally = _microbatches(st, batches, n_tokens, tm)
    res = _optimizer_step(st, tm)
    loss_sum, aux, image_tokens = _global_figures(st, tally)
    st.iteration += 1
    st.consumed_samples += st.plan.layout.gbs
    aux_per_microbatch = aux / (st.plan.num_microbatches * st.plan.layout.llm_dp)
    return StepStats(
        iteration=st.iteration,
        loss=loss_sum / max(n_tokens, 1.0),
        tokens=int(n_tokens),
        grad_norm=res.grad_norm,
        lr=lr,
        skipped=res.skipped,
        nan=res.nan,
        elapsed_s=_tick() - t0,
        phases_s=dict(tm.acc),
        moe_aux_loss=aux_per_microbatch if st.preset.llm.num_experts else None,
        image_tokens=int(image_tokens),
        empty_encoder_microbatches=tally.empty_encoder_microbatches,
        saved_peak_bytes=st.meter.peak,
        inflight_peak=tally.inflight_peak,
    )


def _microbatches(st: TrainState, batches: list[dict], n_tokens: float, tm: _Timer) -> _Tally:
    if st.reference:
        return _reference_microbatches(st, batches, n_tokens, tm)
    if st.plan.layout.colocated:
        return _colocated_microbatches(st, batches, n_tokens, tm)
    if st.role.is_encoder:
        return _encoder_microbatches(st, tm)
    return _language_microbatches(st, batches, n_tokens, tm)


def _encoder_only(st: TrainState) -> bool:
    return not st.reference and not st.plan.layout.colocated and not st.role.is_language


@dataclass
class _Tally:
    """What this rank's microbatches of one iteration add up to."""

    loss_sum: float = 0.0  # per-token loss summed over the loss-bearing tokens (not yet divided by N)
    image_tokens: int = 0  # image embeddings the LLM consumed
    empty_encoder_microbatches: int = 0
    inflight_peak: int = 0


def _contributes(st: TrainState) -> bool:
    """Whether this rank's loss and token figures count in world sums: TP rank 0 of each lane's last
    pipeline stage (where the loss is), or the reference (the other TP ranks hold the same figures)."""
    return st.role.is_language and (st.reference or (st.role.is_leader and st.role.is_last_stage))


def _grads_come_back(st: TrainState) -> bool:
    """The LLM returns embedding gradients to the encoder (not when the encoder is frozen)."""
    return not st.run.trainer.freeze.encoder


def _draw_batches(st: TrainState, tm: _Timer) -> list[dict]:
    """This rank's data of the whole iteration: [microbatch] -> {lane: LaneBatch}, alignment-checked."""
    return [_draw_microbatch(st, tm) for _ in range(st.plan.num_microbatches)]


def _draw_microbatch(st: TrainState, tm: _Timer) -> dict:
    """This rank's next microbatch, {lane: LaneBatch}, alignment-checked (lanes are drawn in order, so
    drawing a microbatch at a time gives the same samples as drawing the iteration at once)."""
    a = _tick()
    mb = {lane: st.provider.next(lane) for lane in rank_lanes(st.plan, st.role, st.reference)}
    for b in mb.values():
        check_alignment(b, st.image_token_id)
    tm.add("data", _tick() - a)
    return mb


def _global_tokens(st: TrainState, batches: list[dict]) -> float:
    """N: the loss-bearing tokens of the whole global batch (a world all-reduce: every rank takes part)."""
    local_tokens = 0.0
    if _contributes(st):
        local_tokens = float(sum(float(b.loss_mask.sum()) for mb in batches for b in mb.values()))
    return local_tokens if st.reference else _world_sum(st, [local_tokens])[0]


def _reference_microbatches(st: TrainState, batches: list[dict], n_tokens: float, tm: _Timer) -> _Tally:
    """The one-process reference: per microbatch, every encoder replica's forward, every lane's LLM forward on
    the encoder output (no bridge), one backward of their sum."""
    import torch

    tally = _Tally()
    for mb in batches:
        a = _tick()
        per_lane = _reference_encoder_forward(st, mb, tally)
        tm.add("enc_fwd", _tick() - a)
        a = _tick()
        total = None
        for lane in range(st.plan.layout.llm_dp):
            x = torch.cat(per_lane[lane]) if per_lane.get(lane) else None
            tally.image_tokens += 0 if x is None else x.shape[0]
            ls = llm_forward(st, mb[lane], x)
            tally.loss_sum += float(ls.detach())
            total = ls / max(n_tokens, 1.0) if total is None else total + ls / max(n_tokens, 1.0)
        tm.add("llm_fwd", _tick() - a)
        a = _tick()
        if total.requires_grad:
            total.backward()
        tm.add("llm_bwd", _tick() - a)
    return tally


def _reference_encoder_forward(st: TrainState, mb: dict, tally: _Tally) -> dict[int, list]:
    """Embeddings of one microbatch per lane, computed replica by replica: the same per-replica image batches
    as the real encoder ranks see."""
    per_lane: dict[int, list] = {}
    for e in range(st.plan.layout.enc_dp):
        segs = segments_of_encoder(st.plan, e)
        images, _keys, _counts = _encoder_samples(st, mb, segs)
        flat = encoder_forward(st, images)
        tally.empty_encoder_microbatches += int(flat.shape[0] == 0)
        row = 0
        for g in segs:
            n = sum(mb[g.lane].image_token_counts[g.lane_start : g.lane_start + g.n])
            per_lane.setdefault(g.lane, []).append(flat[row : row + n])
            row += n
    return per_lane


def _colocated_microbatches(st: TrainState, batches: list[dict], n_tokens: float, tm: _Timer) -> _Tally:
    """Colocated ranks, per microbatch of their lane: the encoder forward on the lane's images, the LLM
    forward on its output (no bridge), one backward through both. The encoder's TP peers are the LLM's, and
    every one of them holds the whole embedding and its whole gradient, as over the bridge."""
    tally = _Tally()
    lane = st.role.dp_rank
    for mb in batches:
        b = mb[lane]
        a = _tick()
        flat = encoder_forward(st, b.images or [None] * len(b.sample_keys))
        tally.empty_encoder_microbatches += int(flat.shape[0] == 0)
        tm.add("enc_fwd", _tick() - a)
        tally.image_tokens += flat.shape[0]
        a = _tick()
        ls = llm_forward(st, b, flat)
        tally.loss_sum += float(ls.detach())
        tm.add("llm_fwd", _tick() - a)
        a = _tick()
        scaled = ls / max(n_tokens, 1.0)
        if scaled.requires_grad:
            scaled.backward()
        tm.add("llm_bwd", _tick() - a)  # the encoder's backward runs inside it
    return tally


def _encoder_microbatches(st: TrainState, tm: _Timer) -> _Tally:
    """Encoder ranks, 1F1B across the bridge: draw a microbatch, forward it and send it; once
    `trainer.encoder_inflight` microbatches await their gradient, take the oldest one's back and run its
    backward before the next forward; the rest at the end. Saved activations thus stay bounded by the
    in-flight count, not by the iteration's microbatches. The LLM lanes answer microbatches in order, so
    the oldest gradient is always the next one to arrive."""
    from collections import deque

    tally = _Tally()
    segs = segments_of_encoder(st.plan, st.role.dp_rank)
    br = st.bridge
    back = _grads_come_back(st)
    # the first LLM stage runs llm.pp forwards before its first backward: it needs that many ahead
    keep = max(st.run.trainer.encoder_inflight, st.llm_shape.pp)
    inflight: deque = deque()
    for m in range(st.plan.num_microbatches):
        mb = _draw_microbatch(st, tm)
        a = _tick()
        images, keys, counts = _encoder_samples(st, mb, segs)
        flat = encoder_forward(st, images)
        tally.empty_encoder_microbatches += int(flat.shape[0] == 0)
        tm.add("enc_fwd", _tick() - a)
        br.send_forward(st.iteration, m, flat, keys, counts)
        del mb, images  # only the embeddings' graph is kept, for the backward
        if not back:
            continue
        inflight.append((m, flat, keys, counts))
        tally.inflight_peak = max(tally.inflight_peak, len(inflight))
        while len(inflight) >= keep:
            _encoder_backward(st, inflight.popleft(), tm)
    while inflight:
        _encoder_backward(st, inflight.popleft(), tm)
    _finish_bridge(st, tm)
    return tally


def _encoder_backward(st: TrainState, item: tuple, tm: _Timer) -> None:
    """Receive microbatch m's embedding gradient and run the encoder's backward from it."""
    m, flat, keys, counts = item
    br = st.bridge
    w0 = br.wait_s
    g = br.recv_backward(st.iteration, m, keys, counts)
    b0 = _tick()
    tm.add("bridge_wait", br.wait_s - w0)
    if st.encoder is not None and not st.encoder.frozen and flat.shape[0] > 0:
        flat.backward(g.to(flat.dtype))
    tm.add("enc_bwd", _tick() - b0)


def _language_microbatches(st: TrainState, batches: list[dict], n_tokens: float, tm: _Timer) -> _Tally:
    """LLM ranks, 1F1B over the pipeline stages (one stage: forward and backward of each microbatch in
    turn). The first stage receives the lane's image embeddings over the bridge and returns their gradient;
    the last computes the loss; stages in between pass hidden states and their gradients (pipeline.py)."""
    from collections import deque

    from mimo_jobs.trainer.parallel.pipeline import one_f_one_b

    tally = _Tally()
    waiting: deque = deque()
    for kind, m in one_f_one_b(_stage(st), st.llm_shape.pp, len(batches)):
        if kind == "F":
            waiting.append(_stage_forward(st, m, batches[m], n_tokens, tm, tally))
        else:
            _stage_backward(st, waiting.popleft(), tm)
    if st.link is not None:
        a = _tick()
        st.link.finish()
        tm.add("pipeline_wait", _tick() - a)
    _finish_bridge(st, tm)
    return tally


def _stage(st: TrainState) -> int:
    return st.llm_shape.coords(st.role.rank)[1]


def _stage_forward(st: TrainState, m: int, mb: dict, n_tokens: float, tm: _Timer, tally: _Tally) -> tuple:
    """Forward of microbatch m on this stage; what its backward needs: (m, batch, input, output, image emb)."""
    b = mb[st.role.dp_rank]
    x = hidden = None
    if st.role.is_first_stage:
        br = st.bridge
        w0 = br.wait_s
        x = br.recv_forward(st.iteration, m, b.sample_keys, b.image_token_counts)
        tm.add("bridge_wait", br.wait_s - w0)
        if _grads_come_back(st):
            x = x.detach().requires_grad_(True)
    else:
        w0 = st.link.wait_s
        hidden = st.link.recv_forward()
        tm.add("pipeline_wait", st.link.wait_s - w0)
    a = _tick()
    out = llm_forward(st, b, x, hidden)
    if st.role.is_last_stage:
        tally.loss_sum += float(out.detach())
        tally.image_tokens += sum(b.image_token_counts)
        out = out / max(n_tokens, 1.0)
    else:
        st.link.send_forward(out)
    tm.add("llm_fwd", _tick() - a)
    return m, b, hidden, out, x


def _stage_backward(st: TrainState, item: tuple, tm: _Timer) -> None:
    """Backward of the oldest forward: from the loss on the last stage, else from the next stage's gradient;
    the input's gradient goes to the previous stage, or over the bridge from the first stage."""
    import torch

    m, b, hidden, out, x = item
    grad = None
    if not st.role.is_last_stage:
        w0 = st.link.wait_s
        grad = st.link.recv_backward()
        tm.add("pipeline_wait", st.link.wait_s - w0)
    a = _tick()
    if out.requires_grad:
        out.backward(grad)
    tm.add("llm_bwd", _tick() - a)
    if hidden is not None:
        st.link.send_backward(hidden.grad if hidden.grad is not None else torch.zeros_like(hidden))
    if st.role.is_first_stage and _grads_come_back(st):
        g = x.grad if x.grad is not None else torch.zeros_like(x)
        st.bridge.send_backward(st.iteration, m, g, b.sample_keys, b.image_token_counts)


def _finish_bridge(st: TrainState, tm: _Timer) -> None:
    a = _tick()
    st.bridge.finish()
    tm.add("bridge_wait", _tick() - a)


def _optimizer_step(st: TrainState, tm: _Timer):
    """Per-module gradient reduction, then the world-wide optimizer step (clipping by the global norm)."""
    a = _tick()
    _finalize(st)
    res = st.optimizer.step(st.run.trainer.optimizer.clip_grad)
    tm.add("optimizer", _tick() - a)
    return res


def _global_figures(st: TrainState, tally: _Tally) -> list:
    """[loss sum, MoE aux loss, image tokens] over the whole global batch (a world all-reduce, except in the
    reference)."""
    aux = _moe_aux(st)
    if _contributes(st):
        vals = [tally.loss_sum, aux, tally.image_tokens]
    else:
        vals = [0.0, 0.0, 0.0]
    return vals if st.reference else _world_sum(st, vals)

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
Several encoder modules (a vision tower and an audio encoder) run colocated, in the reference, or each on
ranks of its own with a bridge of its own into the LLM's first stage: each embeds its own inputs of the
microbatch (images, audio clips), the LLM scatters each module's embeddings at its own placeholders
(image_token_id, audio_token_id), and one backward reaches every module. The phases of such a model are
per module (`<module>_fwd`, `<module>_bwd`); a model of one encoder records `enc_fwd`/`enc_bwd`.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from mimo_jobs.trainer.build import TrainState, rank_lanes
from mimo_jobs.trainer.parallel.bridge import segments_of_encoder, token_counts
from mimo_jobs.trainer.parallel.pipeline import first_stage_bridge, interleaved, one_f_one_b


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
    audio_tokens: int = 0  # audio embeddings the LLM consumed (a model with an audio encoder)
    carried_tokens: int = 0  # the global batch's positions before padding (carried_positions)
    empty_encoder_microbatches: int = 0  # encoder microbatches with no image at all (this rank)
    saved_peak_bytes: int = 0  # most bytes autograd held for backward during the step (this rank)
    inflight_peak: int = 0  # most encoder microbatches awaiting their backward (encoder ranks)


class PhaseTimer:
    """Per-phase seconds between marks: `a = tm.mark()` ... `tm.add("phase", a)`. On a GPU kernels run after
    their launch, so a phase is timed by CUDA events recorded on the current stream at its two ends (what
    the stream ran and waited for in between, not the launches), read when `acc` is asked for, once per
    iteration: one device sync per iteration rather than one per phase boundary. On the CPU a mark is a
    clock reading. `now()` is the synchronised wall clock (the iteration's own ends). `on_mark` is called
    at every mark (tests place the boundaries among the messages with it)."""

    def __init__(self, device=None, on_mark=None):
        self.gpu = getattr(device, "type", device) == "cuda"
        self.on_mark = on_mark
        self._acc: dict[str, float] = {}
        self._spans: list[tuple[str, object, object]] = []

    def now(self) -> float:
        if self.gpu:
            torch.cuda.synchronize()
        return time.perf_counter()

    def mark(self):
        if self.on_mark is not None:
            self.on_mark()
        if not self.gpu:
            return time.perf_counter()
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def add(self, k: str, start) -> None:
        end = self.mark()
        if self.gpu:
            self._spans.append((k, start, end))
        else:
            self._acc[k] = self._acc.get(k, 0.0) + (end - start)

    @property
    def acc(self) -> dict[str, float]:
        if self._spans:
            self._spans[-1][2].synchronize()
            for k, a, b in self._spans:
                self._acc[k] = self._acc.get(k, 0.0) + a.elapsed_time(b) / 1000.0
            self._spans.clear()
        return self._acc


def _causal_mask(s: int, device):
    return torch.triu(torch.ones(s, s, dtype=torch.bool, device=device), diagonal=1)[None, None]


def check_alignment(batch, image_token_id: int, audio_token_id: int | None = None) -> None:
    """The runtime alignment invariant: placeholder tokens per sample == the image (and audio) token counts."""
    kinds = [("image", image_token_id, batch.image_token_counts)]
    if audio_token_id is not None:
        kinds.append(("audio", audio_token_id, batch.audio_token_counts or [0] * len(batch.sample_keys)))
    for what, token_id, counts in kinds:
        got = (batch.tokens == token_id).sum(dim=1).tolist()
        if got != list(counts):
            raise RuntimeError(
                f"lane {batch.lane} microbatch {batch.microbatch}: {what} placeholder tokens per "
                f"sample {got} != {what}_token_counts {counts}"
            )


def llm_forward(st: TrainState, batch, img_emb, hidden=None, aud_emb=None):
    """The LLM on one lane's microbatch. Whole (or on the last pipeline stage): the sum over the lane's
    loss-bearing tokens of the per-token loss (not yet divided by N). On an earlier stage: its output hidden
    states, for the next stage. The first stage embeds the tokens and scatters the image (and audio)
    embeddings in; a later one continues from `hidden`, the previous stage's output."""
    lm = st.language
    gpt = lm.core
    dev = st.device
    role = st.role
    if role.is_first_stage or st.reference:
        dec_in = _decoder_input(st, batch, img_emb, aud_emb)
    else:
        gpt.set_input_tensor(hidden)
        dec_in = None
    last = role.is_last_stage or st.reference
    # masked positions carry IGNORE_INDEX; loss_mask drops them
    labels = batch.labels.to(dev).clamp(min=0) if last else None
    mask, positions = _attention(st, batch)
    with positions:
        out = lm.model(
            input_ids=None,
            position_ids=batch.position_ids.to(dev),
            attention_mask=mask,
            decoder_input=dec_in,
            labels=labels,
        )
    if not last:
        return out
    return (out.float() * batch.loss_mask.to(dev)).sum()


def _attention(st: TrainState, batch):
    """(attention mask, context for the forward) of a microbatch: causal over the row, or for packed rows
    (segment_ids) block-diagonal causal with RoPE at each sample's own positions (model/packed.py)."""
    dev = st.device
    if batch.segment_ids is None:
        return _causal_mask(batch.tokens.shape[1], dev), contextlib.nullcontext()
    from mimo_jobs.trainer.model.packed import packed_mask, rotary_at

    # kernels that ignore this mask were refused before the job started (main.kernel_problem)
    return packed_mask(batch.segment_ids.to(dev)), rotary_at(st.language.core, batch.position_ids.to(dev))


def _decoder_input(st: TrainState, batch, img_emb, aud_emb=None):
    """Token embeddings with each encoder module's embeddings scattered into its placeholder positions
    (image tokens, audio tokens), [s, b, h] (the local sequence shard under sequence parallelism)."""
    lm = st.language
    gpt = lm.core
    tokens = batch.tokens.to(st.device)
    emb = gpt.embedding.word_embeddings(tokens)  # [b, s, h], complete on every TP rank
    for token_id, rows in ((st.image_token_id, img_emb), (st.audio_token_id, aud_emb)):
        if rows is not None and rows.shape[0] > 0:
            # masked_scatter fills positions in row-major order: sample 0's placeholders first, in the order the
            # encoder embedded them (and the bridge sends them)
            emb = emb.masked_scatter((tokens == token_id).unsqueeze(-1), rows.to(emb.dtype))
    dec_in = emb.transpose(0, 1).contiguous()  # mcore wants [s, b, h]
    if gpt.config.sequence_parallel:
        from megatron.core.tensor_parallel.mappings import scatter_to_sequence_parallel_region

        dec_in = scatter_to_sequence_parallel_region(dec_in, group=lm.pgc.tp)
    return dec_in


def encoder_forward(st: TrainState, images: list):
    """Flat embeddings [sum N_i, H] of the images present (None entries are text-only samples; a tiled
    image's tiles are encoder samples of their own, in order: data.images.encoder_inputs)."""
    from mimo_jobs.data.images import encoder_inputs

    return _module_forward(st, st.encoder, [im.to(st.device) for im in encoder_inputs(images)])


def audio_forward(st: TrainState, audio):
    """Flat embeddings [sum T_i, H] of the clips of a lane's samples (`LaneBatch.audio`: per sample None or
    its clips, in placeholder order); None when the model has no audio module."""
    from mimo_jobs.data.audio import audio_inputs

    mod = st.module_of("audio")
    if mod is None:
        return None
    return _module_forward(st, mod, [c.to(st.device) for c in audio_inputs(audio or [])])


def _module_forward(st: TrainState, mod, inputs: list):
    """One encoder module on its inputs (images or clips, flattened): [sum N_i, H], no rows when none."""
    if not inputs:
        return torch.zeros(0, st.preset.llm.hidden_size, dtype=st.prec.dtype, device=st.device)
    if mod.frozen:
        with torch.no_grad():
            return mod.model(inputs)
    return mod.model(inputs)


def _encoder_samples(st: TrainState, lane_batches: dict, segs, modality: str = "image"):
    """This encoder replica's samples of one microbatch, in global order: (inputs, keys, counts), the
    inputs and placeholder counts of its module's modality (images; per sample None or its audio clips)."""
    inputs, keys, counts = [], [], []
    for g in segs:
        b = lane_batches[g.lane]
        sl = slice(g.lane_start, g.lane_start + g.n)
        own = b.audio if modality == "audio" else b.images
        inputs += (own or [None] * len(b.sample_keys))[sl]
        keys += b.sample_keys[sl]
        counts += token_counts(b, modality)[sl]
    return inputs, keys, counts


def _embed(st: TrainState, modality: str, inputs: list):
    """This rank's module of `modality` on its inputs: [sum N_i, H]."""
    return audio_forward(st, inputs) if modality == "audio" else encoder_forward(st, inputs)


def enc_phase(st: TrainState, modality: str, which: str) -> str:
    """The phase an encoder module's forward or backward (`which`: fwd, bwd) is timed under: `enc_fwd` of
    the one encoder (what older records have), `<module>_fwd` of each of several (vision_fwd, audio_fwd)."""
    if not st.plan.layout.several:
        return f"enc_{which}"
    mod = st.module_of(modality)
    return f"{mod.label if mod is not None else modality}_{which}"


def _zero_grads(st: TrainState) -> None:
    for m in st.modules:
        if m.ddp is not None:
            m.ddp.zero_grad_buffer()
    st.optimizer.zero_grad()


def _finalize(st: TrainState) -> None:
    from megatron.core.distributed.finalize_model_grads import finalize_model_grads

    for m in st.modules:
        if m.ddp is not None:
            finalize_model_grads([m.ddp], pg_collection=m.pgc)


def _world_sum(st: TrainState, values: list[float]) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64 if st.device == "cpu" else torch.float32, device=st.device)
    dist.all_reduce(t)
    return t.tolist()


# the losses megatron-core tracks for the router's aux_loss balancing (models.py sets no z-loss)
MOE_AUX_LOSSES = ("load_balancing_loss",)


def _moe_aux(st: TrainState) -> float:
    """Mean over the MoE layers of the load-balancing loss summed over this iteration's microbatches (dense
    layers hold a zero slot in the tracker); cleared."""
    if not st.preset.llm.num_experts or st.language is None:
        return 0.0
    from megatron.core.transformer.moe.moe_utils import (
        clear_aux_losses_tracker,
        get_moe_layer_wise_logging_tracker,
    )

    tr = get_moe_layer_wise_logging_tracker()
    v = 0.0
    # a pipeline stage of dense layers only tracks nothing, yet must join the stages' all-reduce: every
    # rank reduces the same names, zeros where it has none
    for name in MOE_AUX_LOSSES:
        x = tr.get(name)
        vals = x["values"] if x is not None else torch.zeros(st.preset.llm.num_layers, device=st.device)
        if _sp_size(st) > 1:  # with sequence parallelism each TP rank holds its shard's partial loss
            vals = vals.clone()
            dist.all_reduce(vals, group=st.language.pgc.tp)
        if st.llm_shape.pp > 1 and not st.reference:  # each stage filled the slots of its own layers
            vals = vals.clone()
            dist.all_reduce(vals, group=st.language.pgc.pp)
        v += float(vals.sum()) / st.preset.llm.moe_layers
    clear_aux_losses_tracker()
    return v


def _sp_size(st: TrainState) -> int:
    cfg = st.language.core.config
    return cfg.tensor_model_parallel_size if cfg.sequence_parallel else 1


def _set_aux_scale(st: TrainState, n_tokens: float) -> None:
    if st.preset.llm.num_experts and st.language is not None:
        from megatron.core.transformer.moe.moe_utils import MoEAuxLossAutoScaler

        # Per-token-loss mode: the aux loss gradient is scaled like the main loss (1/N). megatron-core 0.19
        # weights each rank's aux loss by its local token count times the tp_cp group's size (router.py,
        # calculate_per_token_loss): under sequence parallelism that is the whole sequence's count, so the
        # gradient is already independent of the LLM's TP size (0.16.1 weighted by the local count alone,
        # and the trainer multiplied the SP size back).
        scale = 1.0 / max(n_tokens, 1.0)
        MoEAuxLossAutoScaler.set_loss_scale(torch.tensor(scale, device=st.device))


def train_step(st: TrainState) -> StepStats:
    """One iteration on this rank (see the module doc). Every rank runs the same world collectives in the
    same order: the token all-reduce, the optimizer's agreements, the figures' all-reduce."""
    tm = PhaseTimer(st.device)
    t0 = tm.now()
    lr = st.schedule(st.consumed_samples)
    st.optimizer.set_lr(lr)
    _zero_grads(st)
    # An encoder rank draws each microbatch when it runs it (its images are the memory that matters); the
    # others draw the iteration's token batches first: N, the global batch's loss-bearing tokens, scales
    # every backward and must be known before the first.
    lazy = _encoder_only(st)
    batches = [] if lazy else _draw_batches(st, tm)
    n_tokens, carried = _global_tokens(st, batches)
    _set_aux_scale(st, n_tokens)
    st.meter.reset_peak()
    with st.meter.hooks():
        tally = _microbatches(st, batches, n_tokens, tm)
    res = _optimizer_step(st, tm)
    loss_sum, aux, image_tokens, audio_tokens = _global_figures(st, tally)
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
        elapsed_s=tm.now() - t0,
        phases_s=dict(tm.acc),
        moe_aux_loss=aux_per_microbatch if st.preset.llm.num_experts else None,
        image_tokens=int(image_tokens),
        audio_tokens=int(audio_tokens),
        carried_tokens=int(carried),
        empty_encoder_microbatches=tally.empty_encoder_microbatches,
        saved_peak_bytes=st.meter.peak,
        inflight_peak=tally.inflight_peak,
    )


def _microbatches(st: TrainState, batches: list[dict], n_tokens: float, tm: PhaseTimer) -> _Tally:
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
    audio_tokens: int = 0  # audio embeddings the LLM consumed
    empty_encoder_microbatches: int = 0
    inflight_peak: int = 0


def _contributes(st: TrainState) -> bool:
    """Whether this rank's loss and token figures count in world sums: TP rank 0 of each lane's last
    pipeline stage (where the loss is), or the reference (the other TP ranks hold the same figures)."""
    return st.role.is_language and (st.reference or (st.role.is_leader and st.role.is_last_stage))


def _grads_come_back(st: TrainState) -> bool:
    """The LLM returns embedding gradients to the encoder (not when every encoder is frozen)."""
    return not st.run.trainer.freeze.every_encoder(st.run.trainer.model)


def _draw_batches(st: TrainState, tm: PhaseTimer) -> list[dict]:
    """This rank's data of the whole iteration: [microbatch] -> {lane: LaneBatch}, alignment-checked."""
    return [_draw_microbatch(st, tm) for _ in range(st.plan.num_microbatches)]


def _draw_microbatch(st: TrainState, tm: PhaseTimer) -> dict:
    """This rank's next microbatch, {lane: LaneBatch}, alignment-checked (lanes are drawn in order, so
    drawing a microbatch at a time gives the same samples as drawing the iteration at once)."""
    a = tm.mark()
    mb = {lane: st.provider.next(lane) for lane in rank_lanes(st.enc_plan or st.plan, st.role, st.reference)}
    for b in mb.values():
        check_alignment(b, st.image_token_id, st.audio_token_id)
    tm.add("data", a)
    return mb


def _global_tokens(st: TrainState, batches: list[dict]) -> tuple[float, float]:
    """N, the loss-bearing tokens of the whole global batch, and the positions it carries (one world
    all-reduce of both: every rank takes part)."""
    local = [0.0, 0.0]
    if _contributes(st):
        for b in (b for mb in batches for b in mb.values()):
            local[0] += float(b.loss_mask.sum())
            local[1] += float(carried_positions(b, st.image_token_id, st.audio_token_id))
    return (local[0], local[1]) if st.reference else tuple(_world_sum(st, local))


def carried_positions(b, image_token_id: int, audio_token_id: int | None = None) -> int:
    """The sequence positions a microbatch carries: per sample, up to the last one the loss reads (the
    target of the last loss-bearing position) or the last image (or audio) placeholder; the rest is
    padding."""
    idx = torch.arange(b.tokens.shape[1], device=b.tokens.device)
    last_loss = torch.where(b.loss_mask > 0, idx, -2).amax(dim=1) + 2
    placeholder = b.tokens == image_token_id
    if audio_token_id is not None:
        placeholder = placeholder | (b.tokens == audio_token_id)
    last_image = torch.where(placeholder, idx, -1).amax(dim=1) + 1
    return int(torch.clamp(torch.maximum(last_loss, last_image), max=b.tokens.shape[1]).sum())


def _reference_microbatches(st: TrainState, batches: list[dict], n_tokens: float, tm: PhaseTimer) -> _Tally:
    """The one-process reference: per microbatch, every encoder replica's forward, every lane's LLM forward on
    the encoder output (no bridge), one backward of their sum."""
    tally = _Tally()
    for mb in batches:
        a = tm.mark()
        per_lane = _reference_encoder_forward(st, mb, tally)
        total = None
        if st.plan.layout.several:
            tm.add(enc_phase(st, "image", "fwd"), a)
            a = tm.mark()
        aud = {lane: audio_forward(st, mb[lane].audio) for lane in range(st.plan.layout.llm_dp)}
        tm.add(enc_phase(st, "audio", "fwd"), a)
        a = tm.mark()
        for lane in range(st.plan.layout.llm_dp):
            x = torch.cat(per_lane[lane]) if per_lane.get(lane) else None
            tally.image_tokens += 0 if x is None else x.shape[0]
            tally.audio_tokens += 0 if aud[lane] is None else aud[lane].shape[0]
            ls = llm_forward(st, mb[lane], x, aud_emb=aud[lane])
            tally.loss_sum += float(ls.detach())
            total = ls / max(n_tokens, 1.0) if total is None else total + ls / max(n_tokens, 1.0)
        tm.add("llm_fwd", a)
        a = tm.mark()
        if total.requires_grad:
            total.backward()
        tm.add("llm_bwd", a)
    return tally


def _reference_encoder_forward(st: TrainState, mb: dict, tally: _Tally) -> dict[int, list]:
    """Embeddings of one microbatch per lane, computed replica by replica: the same per-replica image batches
    as the real encoder ranks see (several encoders run colocated: each lane's own)."""
    per_lane: dict[int, list] = {}
    if st.plan.layout.several:
        for lane, b in mb.items():
            flat = encoder_forward(st, b.images or [None] * len(b.sample_keys))
            tally.empty_encoder_microbatches += int(flat.shape[0] == 0)
            per_lane[lane] = [flat]
        return per_lane
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


def _colocated_microbatches(st: TrainState, batches: list[dict], n_tokens: float, tm: PhaseTimer) -> _Tally:
    """Colocated ranks, per microbatch of their lane: the encoder forward on the lane's images, the LLM
    forward on its output (no bridge), one backward through both. The encoder's TP peers are the LLM's, and
    every one of them holds the whole embedding and its whole gradient, as over the bridge."""
    tally = _Tally()
    lane = st.role.dp_rank
    for mb in batches:
        b = mb[lane]
        a = tm.mark()
        flat = encoder_forward(st, b.images or [None] * len(b.sample_keys))
        if st.plan.layout.several:
            tm.add(enc_phase(st, "image", "fwd"), a)
            a = tm.mark()
        aud = audio_forward(st, b.audio)
        tally.empty_encoder_microbatches += int(flat.shape[0] == 0)
        tm.add(enc_phase(st, "audio", "fwd"), a)
        tally.image_tokens += flat.shape[0]
        tally.audio_tokens += 0 if aud is None else aud.shape[0]
        a = tm.mark()
        ls = llm_forward(st, b, flat, aud_emb=aud)
        tally.loss_sum += float(ls.detach())
        tm.add("llm_fwd", a)
        a = tm.mark()
        scaled = ls / max(n_tokens, 1.0)
        if scaled.requires_grad:
            scaled.backward()
        tm.add("llm_bwd", a)  # the encoder's backward runs inside it
    return tally


def _encoder_microbatches(st: TrainState, tm: PhaseTimer) -> _Tally:
    """Encoder ranks: the compute of each microbatch (draw, forward; backward from its gradient) under
    run_encoder's schedule and exchanges."""
    tally = _Tally()
    segs = segments_of_encoder(st.enc_plan, st.role.dp_rank)
    modality = st.bridge.modality  # this rank's module (of several, each on ranks of its own) embeds its own
    mod = st.module_of(modality)
    fwd, bwd = enc_phase(st, modality, "fwd"), enc_phase(st, modality, "bwd")

    def forward(m: int):
        mb = _draw_microbatch(st, tm)
        a = tm.mark()
        inputs, keys, counts = _encoder_samples(st, mb, segs, modality)
        flat = _embed(st, modality, inputs)
        tally.empty_encoder_microbatches += int(flat.shape[0] == 0)
        tm.add(fwd, a)
        return flat, keys, counts  # only the embeddings' graph is kept, for the backward

    def backward(flat, g) -> None:
        a = tm.mark()
        if mod is not None and not mod.frozen and flat.shape[0] > 0:
            flat.backward(g.to(flat.dtype))
        tm.add(bwd, a)

    tally.inflight_peak = run_encoder(st, forward, backward, tm)
    return tally


def run_encoder(st, forward, backward, tm: PhaseTimer) -> int:
    """An encoder rank's schedule, 1F1B across the bridge: forward a microbatch; once
    `trainer.encoder_inflight` microbatches await their gradient, take the oldest one's back and run its
    backward before the next forward; the rest at the end. Saved activations thus stay bounded by the
    in-flight count, not by the iteration's microbatches. Messages go out in the first LLM stage's order
    (pipeline.first_stage_bridge): after every action, each exchange whose embeddings are computed is
    posted, its gradient's receive with it, without waiting; a gradient is waited for when its backward
    runs. `forward(m)` -> (flat, keys, counts), `backward(flat, grad)`: the compute. Returns the most
    microbatches that awaited their gradient."""
    back = _grads_come_back(st)
    microbatches, pp = st.plan.num_microbatches, st.llm_shape.pp
    # the first LLM stage runs llm.pp forwards before its first backward: it needs that many ahead
    keep = max(st.run.trainer.encoder_inflight, pp)
    sched = interleaved(keep - 1, microbatches) if back else [("F", m) for m in range(microbatches)]
    order = first_stage_bridge(pp, microbatches, back)
    unsent: dict[int, tuple] = {}  # forwarded, not yet posted: m -> (flat, keys, counts)
    saved: dict[int, tuple] = {}  # awaiting the gradient: m -> (flat, keys, counts)
    incoming: dict[int, object] = {}  # gradient receives posted, not yet collected: m -> bridge.Incoming
    asked: set[int] = set()  # microbatches whose gradient's receive is posted
    cursor, peak = 0, 0
    _timed(tm, "bridge_wait", st.bridge.encoder_expect, st.iteration)

    def post_ready() -> None:
        nonlocal cursor
        while cursor < len(order):
            (fwd, bwd), send = order[cursor], None
            if fwd and fwd[0] in unsent:
                send = (fwd[0], *unsent.pop(fwd[0]))
            recv = (bwd[0], *saved[bwd[0]][1:]) if bwd and bwd[0] not in asked else None
            if send is not None or recv is not None:
                inc = st.bridge.encoder_post(st.iteration, send, recv)
                if recv is not None:
                    incoming[bwd[0]] = inc
                    asked.add(bwd[0])
            if fwd and send is None:
                return  # its embeddings are not computed yet: nothing after it may go first
            cursor += 1

    for kind, m in sched:
        if kind == "F":
            unsent[m] = forward(m)
            if back:
                saved[m] = unsent[m]
                peak = max(peak, len(saved))
        else:
            grad = _timed(tm, "bridge_wait", st.bridge.collect, incoming.pop(m))
            backward(saved.pop(m)[0], grad)
        _timed(tm, "bridge_wait", post_ready)
    _timed(tm, "bridge_wait", st.bridge.finish)
    return peak


def _timed(tm: PhaseTimer, phase: str, fn, *args):
    a = tm.mark()
    out = fn(*args)
    tm.add(phase, a)
    return out


def _language_microbatches(st: TrainState, batches: list[dict], n_tokens: float, tm: PhaseTimer) -> _Tally:
    """LLM ranks: the compute of each microbatch on this stage under run_stage's schedule and exchanges."""
    tally = _Tally()
    run_stage(st, _StageWork(st, batches, n_tokens, tm, tally), len(batches), tm)
    return tally


class _StageWork:
    """The compute of one LLM stage: forward and backward of a microbatch of its lane."""

    def __init__(self, st: TrainState, batches: list[dict], n_tokens: float, tm: PhaseTimer, tally: _Tally):
        self.st, self.batches, self.n_tokens, self.tm, self.tally = st, batches, n_tokens, tm, tally

    def batch(self, m: int):
        return self.batches[m][self.st.role.dp_rank]

    def forward(self, m: int, emb, hidden):
        """Forward of microbatch m from the encoder modules' embeddings (first stage: {modality: [rows, H]},
        one entry per bridge) or the previous stage's output. Returns (what its backward needs, the output
        to send to the next stage or None on the last)."""
        st, b = self.st, self.batch(m)
        if emb is not None and _grads_come_back(st):
            emb = {k: v.detach().requires_grad_(True) for k, v in emb.items()}
        a = self.tm.mark()
        emb = emb or {}
        out = llm_forward(st, b, emb.get("image"), hidden, aud_emb=emb.get("audio"))
        to_next = None
        if st.role.is_last_stage:
            self.tally.loss_sum += float(out.detach())
            self.tally.image_tokens += sum(b.image_token_counts)
            self.tally.audio_tokens += b.num_audio_tokens
            out = out / max(self.n_tokens, 1.0)
        else:
            to_next = out
        self.tm.add("llm_fwd", a)
        return (out, hidden, emb), to_next

    def backward(self, item: tuple, grad):
        """Backward of a forward's item, from the loss on the last stage, else from the next stage's
        gradient. Returns (the input's gradient for the previous stage, the embeddings' gradients for the
        bridges, {modality: [rows, H]}), None where there is no such receiver."""
        out, hidden, emb = item
        a = self.tm.mark()
        if out.requires_grad:
            out.backward(grad)
        self.tm.add("llm_bwd", a)
        to_prev = to_bridge = None
        if hidden is not None:
            to_prev = hidden.grad if hidden.grad is not None else torch.zeros_like(hidden)
        if self.st.role.is_first_stage and _grads_come_back(self.st):
            to_bridge = {k: v.grad if v.grad is not None else torch.zeros_like(v) for k, v in emb.items()}
        return to_prev, to_bridge


def run_stage(st, work, microbatches: int, tm: PhaseTimer) -> None:
    """An LLM stage's schedule, 1F1B over the pipeline stages (one stage: forward and backward of each
    microbatch in turn). The first stage receives the lane's image embeddings over the bridge and returns
    their gradient; the last computes the loss; stages in between pass hidden states and their gradients
    (pipeline.py). Between two actions (and before the first) this rank posts one bridge exchange and one
    pipeline exchange, each sending what the first action produced and receiving what the second needs.
    `work` holds the compute (batch, forward, backward: _StageWork)."""
    sched = one_f_one_b(_stage(st), st.llm_shape.pp, microbatches)
    waiting: dict[int, tuple] = {}
    produced: dict = {}
    if st.role.is_first_stage:
        lane = [work.batch(m) for m in range(microbatches)]
        for br in st.bridges:
            br.language_expect(st.iteration, [(b.sample_keys, token_counts(b, br.modality)) for b in lane])
    got = _stage_exchange(st, work, produced, sched[0], tm)
    for i, (kind, m) in enumerate(sched):
        if kind == "F":
            waiting[m], to_next = work.forward(m, got["emb"], got["hidden"])
            produced = {"next": to_next}
        else:
            to_prev, to_bridge = work.backward(waiting.pop(m), got["grad"])
            produced = {"prev": to_prev, "bridge": None if to_bridge is None else (m, to_bridge)}
        got = _stage_exchange(st, work, produced, sched[i + 1] if i + 1 < len(sched) else None, tm)
    if st.link is not None:
        _timed(tm, "pipeline_wait", st.link.finish)
    for br in st.bridges:
        _timed(tm, "bridge_wait", br.finish)


def _stage_exchange(st, work, produced: dict, nxt, tm: PhaseTimer) -> dict:
    """Send what the last action produced, receive what the next one (`nxt`, or None at the end) needs:
    {"emb": image embeddings, "hidden": the previous stage's output, "grad": the next stage's gradient}."""
    role = st.role
    wants_f, wants_b = nxt is not None and nxt[0] == "F", nxt is not None and nxt[0] == "B"
    got = {"emb": None, "hidden": None, "grad": None}
    if role.is_first_stage:
        got["emb"] = bridge_exchanges(st, work, produced.get("bridge"), nxt[1] if wants_f else None, tm)
    if st.link is not None:
        to_next, to_prev = produced.get("next"), produced.get("prev")
        recv_prev, recv_next = wants_f and not role.is_first_stage, wants_b and not role.is_last_stage
        if to_next is not None or to_prev is not None or recv_prev or recv_next:
            got["hidden"], got["grad"] = _timed(
                tm, "pipeline_wait", st.link.exchange, to_next, to_prev, recv_prev, recv_next
            )
    return got


def bridge_exchanges(st, work, grads, m_next: int | None, tm: PhaseTimer) -> dict | None:
    """The first stage's bridge traffic at one boundary, one exchange per encoder module in the model's
    order: each sends its module's gradient of the backward just run (`grads`: (microbatch, {modality:
    gradient}) or None) with the receive of its embeddings for the forward to come (`m_next`), in one
    group, as that module's encoder posts them (run_encoder). Returns {modality: embeddings} (None when
    nothing is received). Each module's exchange completes before the next module's is posted: a module's
    encoder ranks wait for no other module, so the modules' exchanges cannot wait on each other."""
    got = {}
    for br in st.bridges:
        send = recv = None
        if grads is not None:
            m, g = grads
            b = work.batch(m)
            send = (m, g[br.modality], b.sample_keys, token_counts(b, br.modality))
        if m_next is not None:
            b = work.batch(m_next)
            recv = (m_next, b.sample_keys, token_counts(b, br.modality))
        if send is not None or recv is not None:
            got[br.modality] = _timed(tm, "bridge_wait", br.language_exchange, st.iteration, send, recv)
    return got if m_next is not None else None


def _stage(st) -> int:
    return st.llm_shape.coords(st.role.rank)[1]


def _optimizer_step(st: TrainState, tm: PhaseTimer):
    """Per-module gradient reduction, then the world-wide optimizer step (clipping by the global norm)."""
    a = tm.mark()
    _finalize(st)
    res = st.optimizer.step(st.run.trainer.optimizer.clip_grad)
    tm.add("optimizer", a)
    return res


def _global_figures(st: TrainState, tally: _Tally) -> list:
    """[loss sum, MoE aux loss, image tokens, audio tokens] over the whole global batch (a world all-reduce,
    except in the reference)."""
    aux = _moe_aux(st)
    if _contributes(st):
        vals = [tally.loss_sum, aux, tally.image_tokens, tally.audio_tokens]
    else:
        vals = [0.0, 0.0, 0.0, 0.0]
    return vals if st.reference else _world_sum(st, vals)

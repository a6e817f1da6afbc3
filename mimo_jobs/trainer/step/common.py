"""What every rank role's program shares: the step's figures and phase timer, the LLM's forward with each
encoder module's embeddings scattered at its own placeholders, a module's forward on its inputs, the data
draw with its alignment check, and the world sums."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from mimo_jobs.data.batch import flatten
from mimo_jobs.trainer.build import TrainState


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
    image_tokens: int = 0  # embeddings the LLM consumed from image modules (every one of them)
    audio_tokens: int = 0  # audio embeddings the LLM consumed (a model with an audio encoder)
    carried_tokens: int = 0  # the global batch's positions before padding (carried_positions)
    empty_encoder_microbatches: int = 0  # encoder module microbatches with nothing to embed (this rank)
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


def check_alignment(batch) -> None:
    """The runtime alignment invariant: per sample, each encoder module's placeholder tokens == its counts."""
    for name, m in batch.inputs.items():
        got = (batch.tokens == m.token_id).sum(dim=1).tolist()
        if got != list(m.counts):
            raise RuntimeError(
                f"lane {batch.lane} microbatch {batch.microbatch}: module {name!r} placeholder tokens per "
                f"sample {got} != its token counts {list(m.counts)}"
            )


def llm_forward(st: TrainState, batch, emb: dict | None, hidden=None):
    """The LLM on one lane's microbatch. Whole (or on the last pipeline stage): the sum over the lane's
    loss-bearing tokens of the per-token loss (not yet divided by N). On an earlier stage: its output hidden
    states, for the next stage. The first stage embeds the tokens and scatters each encoder module's
    embeddings (`emb`: {module: [rows, H]}) at its placeholders; a later one continues from `hidden`, the
    previous stage's output."""
    lm = st.language
    gpt = lm.core
    dev = st.device
    role = st.role
    if role.is_first_stage or st.reference:
        dec_in = decoder_input(st, batch, emb or {})
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


def decoder_input(st: TrainState, batch, emb: dict):
    """Token embeddings with each encoder module's embeddings (`emb`: {module: [rows, H]}) scattered into its
    own placeholder positions, [s, b, h] (the local sequence shard under sequence parallelism)."""
    lm = st.language
    gpt = lm.core
    tokens = batch.tokens.to(st.device)
    out = gpt.embedding.word_embeddings(tokens)  # [b, s, h], complete on every TP rank
    for name, m in batch.inputs.items():
        rows = emb.get(name)
        if rows is not None and rows.shape[0] > 0:
            # masked_scatter fills positions in row-major order: sample 0's placeholders first, in the order the
            # module embedded them (and its bridge sends them)
            out = out.masked_scatter((tokens == m.token_id).unsqueeze(-1), rows.to(out.dtype))
    dec_in = out.transpose(0, 1).contiguous()  # mcore wants [s, b, h]
    if gpt.config.sequence_parallel:
        from megatron.core.tensor_parallel.mappings import scatter_to_sequence_parallel_region

        dec_in = scatter_to_sequence_parallel_region(dec_in, group=lm.pgc.tp)
    return dec_in


def embed(st: TrainState, mod, items: list):
    """One encoder module on per-sample inputs (None: nothing for it; a sample's images, tiles or clips in
    placeholder order): its embeddings [sum N_i, H], flattened in that order; no rows when none."""
    inputs = [x.to(st.device) for x in flatten(items)]
    if not inputs:
        return torch.zeros(0, st.preset.llm.hidden_size, dtype=st.prec.dtype, device=st.device)
    if mod.frozen:
        with torch.no_grad():
            return mod.model(inputs)
    return mod.model(inputs)


def phase(st: TrainState, mod, which: str) -> str:
    """The phase a module's forward or backward (`which`: fwd, bwd) is timed under: `enc_fwd` of the one
    encoder module (what older records have), `<module>_fwd` of each of several (vision_fwd, audio_fwd)."""
    return f"enc_{which}" if not st.plan.layout.several else f"{mod.label}_{which}"


@dataclass
class Tally:
    """What this rank's microbatches of one iteration add up to."""

    loss_sum: float = 0.0  # per-token loss summed over the loss-bearing tokens (not yet divided by N)
    tokens: dict = field(default_factory=dict)  # input kind -> the embeddings of that kind the LLM consumed
    empty_encoder_microbatches: int = 0
    inflight_peak: int = 0

    def consumed(self, st: TrainState, batch) -> None:
        """The LLM read this lane batch: count each module's embeddings under its input kind."""
        for name, m in batch.inputs.items():
            kind = st.kind_of(name)
            self.tokens[kind] = self.tokens.get(kind, 0) + m.tokens


def contributes(st: TrainState) -> bool:
    """Whether this rank's loss and token figures count in world sums: TP rank 0 of each lane's last
    pipeline stage (where the loss is), or the reference (the other TP ranks hold the same figures)."""
    return st.role.is_language and (st.reference or (st.role.is_leader and st.role.is_last_stage))


def grads_come_back(st: TrainState) -> bool:
    """The LLM returns embedding gradients to the encoders (not when every encoder is frozen)."""
    return not st.run.trainer.freeze.every_encoder(st.run.trainer.model)


def draw_microbatch(st: TrainState, tm: PhaseTimer) -> dict:
    """This rank's next microbatch, {lane: LaneBatch}, alignment-checked (lanes are drawn in order, so
    drawing a microbatch at a time gives the same samples as drawing the iteration at once)."""
    a = tm.mark()
    mb = {lane: st.provider.next(lane) for lane in st.lanes()}
    for b in mb.values():
        check_alignment(b)
    tm.add("data", a)
    return mb


def world_sum(st: TrainState, values: list[float]) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64 if st.device == "cpu" else torch.float32, device=st.device)
    dist.all_reduce(t)
    return t.tolist()


def timed(tm: PhaseTimer, name: str, fn, *args):
    a = tm.mark()
    out = fn(*args)
    tm.add(name, a)
    return out


def replica_samples(lane_batches: dict, segs, module: str):
    """An encoder replica's samples of one microbatch, in global order (`segs`: the (replica, lane) segments
    it serves, bridge.segments_of_encoder): (per-sample inputs of `module`, sample keys, placeholder counts)."""
    items, keys, counts = [], [], []
    for g in segs:
        b = lane_batches[g.lane]
        sl = slice(g.lane_start, g.lane_start + g.n)
        items += b.items(module)[sl]
        keys += b.sample_keys[sl]
        counts += b.counts(module)[sl]
    return items, keys, counts

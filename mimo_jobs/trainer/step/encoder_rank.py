"""The program of an encoder module's ranks (a module on ranks of its own): each microbatch drawn, embedded
and sent over the module's bridge as the LLM's first stage needs it, 1F1B: once
`trainer.encoder_inflight` microbatches await their gradient, the oldest one's backward runs before the
next forward (saved activations bounded by the in-flight count, not the microbatch count)."""

from __future__ import annotations

from mimo_jobs.trainer.build import TrainState
from mimo_jobs.trainer.parallel.bridge import segments_of_encoder
from mimo_jobs.trainer.parallel.pipeline import first_stage_bridge, interleaved
from mimo_jobs.trainer.step.common import (
    PhaseTimer,
    Tally,
    draw_microbatch,
    embed,
    grads_come_back,
    phase,
    replica_samples,
    timed,
)
from mimo_jobs.trainer.step.dpsync import backward_of


def microbatches(st: TrainState, _batches: list, _n_tokens: float, tm: PhaseTimer) -> Tally:
    """The compute of each microbatch (draw, forward; backward from its gradient) under run_encoder's
    schedule and exchanges. This rank's module is its bridge's (each module on ranks of its own)."""
    tally = Tally()
    mod = st.module_named(st.bridge.module)
    segs = segments_of_encoder(st.module_plans[mod.label], st.role.dp_rank)
    fwd, bwd = phase(st, mod, "fwd"), phase(st, mod, "bwd")

    def forward(m: int):
        mb = draw_microbatch(st, tm)
        a = tm.mark()
        items, keys, counts = replica_samples(mb, segs, mod.label)
        flat = embed(st, mod, items)
        tally.empty_encoder_microbatches += int(flat.shape[0] == 0)
        tm.add(fwd, a)
        return flat, keys, counts  # only the embeddings' graph is kept, for the backward

    def backward(flat, g) -> None:
        a = tm.mark()
        if not mod.frozen and flat.shape[0] > 0:
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
    back = grads_come_back(st)
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
    timed(tm, "bridge_wait", st.bridge.encoder_expect, st.iteration)

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
            grad = timed(tm, "bridge_wait", st.bridge.collect, incoming.pop(m))
            with backward_of(st, m):
                backward(saved.pop(m)[0], grad)
        timed(tm, "bridge_wait", post_ready)
    timed(tm, "bridge_wait", st.bridge.finish)
    return peak

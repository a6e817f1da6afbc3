"""The colocated program: every encoder module and the LLM on each rank of a lane. Per microbatch each
module embeds its inputs of the lane's samples, the LLM reads them (no bridge), one backward through all.
A module's TP peers are the LLM's, and every one of them holds the whole embedding and its whole gradient,
as over a bridge."""

from __future__ import annotations

from mimo_jobs.trainer.build import TrainState
from mimo_jobs.trainer.step.common import PhaseTimer, Tally, embed, llm_forward, phase
from mimo_jobs.trainer.step.dpsync import backward_of


def microbatches(st: TrainState, batches: list[dict], n_tokens: float, tm: PhaseTimer) -> Tally:
    tally = Tally()
    lane = st.role.dp_rank
    for m, mb in enumerate(batches):
        b = mb[lane]
        emb = {}
        for mod in st.encoders:
            a = tm.mark()
            emb[mod.label] = embed(st, mod, b.items(mod.label))
            tally.empty_encoder_microbatches += int(emb[mod.label].shape[0] == 0)
            tm.add(phase(st, mod, "fwd"), a)
        tally.consumed(st, b)
        a = tm.mark()
        ls = llm_forward(st, b, emb)
        tally.loss_sum += float(ls.detach())
        tm.add("llm_fwd", a)
        a = tm.mark()
        scaled = ls / max(n_tokens, 1.0)
        if scaled.requires_grad:
            with backward_of(st, m):
                scaled.backward()
        tm.add("llm_bwd", a)  # the encoders' backward runs inside it
    return tally

"""The colocated program: every encoder module and the LLM on each rank of a lane. Per microbatch each
module embeds its inputs of the lane's samples, the LLM reads them (no bridge); the LLM's backward, then
each module's backward from its embeddings' gradient. A module's TP peers are the LLM's, and every one of
them holds the whole embedding and its whole gradient, as over a bridge.

Each module's backward is its own autograd call (`Cut`), timed under the module's phase as on ranks of its
own (`vision_bwd`, `audio_bwd`; `enc_bwd` of one encoder), not inside `llm_bwd`. A cut rather than autograd
hooks: autograd runs independent branches in any order, so a hook where the gradient reaches the
embeddings marks no clean boundary, while the cut's two calls are two spans. The gradients are the same:
the LLM reads each module's embeddings once (step.common.decoder_input), so the gradient the cut collects
is the one a single backward would pass across it, and the module's backward runs on it unchanged."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mimo_jobs.trainer.build import TrainState
from mimo_jobs.trainer.step.common import PhaseTimer, Tally, embed, llm_forward, phase
from mimo_jobs.trainer.step.dpsync import backward_of


@dataclass
class Cut:
    """An encoder module's embeddings cut from the LLM's graph: `read` is what the LLM reads (a leaf of its
    own graph when the embeddings carry a graph, else the embeddings themselves); `rows`, the module's
    output, is what the module's backward starts from (None: no graph, as for no rows). A trained module
    times its backward even without rows, as its ranks of their own do."""

    read: torch.Tensor
    rows: torch.Tensor | None
    trains: bool

    @classmethod
    def of(cls, rows: torch.Tensor, trains: bool) -> Cut:
        if not rows.requires_grad:
            return cls(rows, None, trains)
        return cls(rows.detach().requires_grad_(True), rows, trains)

    def backward(self, tm: PhaseTimer, name: str) -> None:
        """The module's backward from the gradient the LLM's backward left at the cut, timed as `name`."""
        if not self.trains:
            return
        a = tm.mark()
        if self.rows is not None and self.read.grad is not None:
            self.rows.backward(self.read.grad)
        tm.add(name, a)


def microbatches(st: TrainState, batches: list[dict], n_tokens: float, tm: PhaseTimer) -> Tally:
    tally = Tally()
    lane = st.role.dp_rank
    for m, mb in enumerate(batches):
        b = mb[lane]
        cuts: dict[str, Cut] = {}
        for mod in st.encoders:
            a = tm.mark()
            rows = embed(st, mod, b.items(mod.label))
            tally.empty_encoder_microbatches += int(rows.shape[0] == 0)
            tm.add(phase(st, mod, "fwd"), a)
            cuts[mod.label] = Cut.of(rows, trains=not mod.frozen)
        tally.consumed(st, b)
        a = tm.mark()
        ls = llm_forward(st, b, {name: c.read for name, c in cuts.items()})
        tally.loss_sum += float(ls.detach())
        tm.add("llm_fwd", a)
        a = tm.mark()
        scaled = ls / max(n_tokens, 1.0)
        with backward_of(st, m):  # every module's gradients only accumulate but under the last microbatch
            if scaled.requires_grad:
                scaled.backward()
            tm.add("llm_bwd", a)
            for mod in st.encoders:
                cuts[mod.label].backward(tm, phase(st, mod, "bwd"))
    return tally

"""The program of an LLM pipeline stage's ranks: 1F1B over the stages (one stage: forward and backward of
each microbatch in turn). The first stage receives each encoder module's embeddings over its bridge and
returns their gradient; the last computes the loss; stages in between pass hidden states and their
gradients (pipeline.py)."""

from __future__ import annotations

import torch

from mimo_jobs.trainer.build import TrainState
from mimo_jobs.trainer.parallel.pipeline import one_f_one_b
from mimo_jobs.trainer.step.common import PhaseTimer, Tally, grads_come_back, llm_forward, timed
from mimo_jobs.trainer.step.dpsync import backward_of


def microbatches(st: TrainState, batches: list[dict], n_tokens: float, tm: PhaseTimer) -> Tally:
    """The compute of each microbatch on this stage under run_stage's schedule and exchanges."""
    tally = Tally()
    run_stage(st, StageWork(st, batches, n_tokens, tm, tally), len(batches), tm)
    return tally


class StageWork:
    """The compute of one LLM stage: forward and backward of a microbatch of its lane."""

    def __init__(self, st: TrainState, batches: list[dict], n_tokens: float, tm: PhaseTimer, tally: Tally):
        self.st, self.batches, self.n_tokens, self.tm, self.tally = st, batches, n_tokens, tm, tally

    def batch(self, m: int):
        return self.batches[m][self.st.role.dp_rank]

    def forward(self, m: int, emb, hidden):
        """Forward of microbatch m from the encoder modules' embeddings (first stage: {module: [rows, H]},
        one entry per bridge) or the previous stage's output. Returns (what its backward needs, the output
        to send to the next stage or None on the last)."""
        st, b = self.st, self.batch(m)
        if emb is not None and grads_come_back(st):
            emb = {k: v.detach().requires_grad_(True) for k, v in emb.items()}
        a = self.tm.mark()
        emb = emb or {}
        out = llm_forward(st, b, emb, hidden)
        to_next = None
        if st.role.is_last_stage:
            self.tally.loss_sum += float(out.detach())
            self.tally.consumed(st, b)
            out = out / max(self.n_tokens, 1.0)
        else:
            to_next = out
        self.tm.add("llm_fwd", a)
        return (out, hidden, emb), to_next

    def backward(self, item: tuple, grad):
        """Backward of a forward's item, from the loss on the last stage, else from the next stage's
        gradient. Returns (the input's gradient for the previous stage, the embeddings' gradients for the
        bridges, {module: [rows, H]}), None where there is no such receiver."""
        out, hidden, emb = item
        a = self.tm.mark()
        if out.requires_grad:
            out.backward(grad)
        self.tm.add("llm_bwd", a)
        to_prev = to_bridge = None
        if hidden is not None:
            to_prev = hidden.grad if hidden.grad is not None else torch.zeros_like(hidden)
        if self.st.role.is_first_stage and grads_come_back(self.st):
            to_bridge = {k: v.grad if v.grad is not None else torch.zeros_like(v) for k, v in emb.items()}
        return to_prev, to_bridge


def run_stage(st, work, microbatches: int, tm: PhaseTimer) -> None:
    """An LLM stage's schedule, 1F1B over the pipeline stages (one stage: forward and backward of each
    microbatch in turn). The first stage receives each encoder module's embeddings over its bridge and returns
    their gradient; the last computes the loss; stages in between pass hidden states and their gradients
    (pipeline.py). Between two actions (and before the first) this rank posts one bridge exchange and one
    pipeline exchange, each sending what the first action produced and receiving what the second needs.
    `work` holds the compute (batch, forward, backward: StageWork)."""
    sched = one_f_one_b(_stage(st), st.llm_shape.pp, microbatches)
    waiting: dict[int, tuple] = {}
    produced: dict = {}
    if st.role.is_first_stage:
        lane = [work.batch(m) for m in range(microbatches)]
        for br in st.bridges:
            br.language_expect(st.iteration, [(b.sample_keys, b.counts(br.module)) for b in lane])
    got = _stage_exchange(st, work, produced, sched[0], tm)
    for i, (kind, m) in enumerate(sched):
        if kind == "F":
            waiting[m], to_next = work.forward(m, got["emb"], got["hidden"])
            produced = {"next": to_next}
        else:
            with backward_of(st, m):
                to_prev, to_bridge = work.backward(waiting.pop(m), got["grad"])
            produced = {"prev": to_prev, "bridge": None if to_bridge is None else (m, to_bridge)}
        got = _stage_exchange(st, work, produced, sched[i + 1] if i + 1 < len(sched) else None, tm)
    if st.link is not None:
        timed(tm, "pipeline_wait", st.link.finish)
    for br in st.bridges:
        timed(tm, "bridge_wait", br.finish)


def _stage_exchange(st, work, produced: dict, nxt, tm: PhaseTimer) -> dict:
    """Send what the last action produced, receive what the next one (`nxt`, or None at the end) needs:
    {"emb": {module: embeddings}, "hidden": the previous stage's output, "grad": the next stage's gradient}."""
    role = st.role
    wants_f, wants_b = nxt is not None and nxt[0] == "F", nxt is not None and nxt[0] == "B"
    got = {"emb": None, "hidden": None, "grad": None}
    if role.is_first_stage:
        got["emb"] = bridge_exchanges(st, work, produced.get("bridge"), nxt[1] if wants_f else None, tm)
    if st.link is not None:
        to_next, to_prev = produced.get("next"), produced.get("prev")
        recv_prev, recv_next = wants_f and not role.is_first_stage, wants_b and not role.is_last_stage
        if to_next is not None or to_prev is not None or recv_prev or recv_next:
            got["hidden"], got["grad"] = timed(
                tm, "pipeline_wait", st.link.exchange, to_next, to_prev, recv_prev, recv_next
            )
    return got


def bridge_exchanges(st, work, grads, m_next: int | None, tm: PhaseTimer) -> dict | None:
    """The first stage's bridge traffic at one boundary, one exchange per encoder module in the model's
    order: each sends its module's gradient of the backward just run (`grads`: (microbatch, {module:
    gradient}) or None) with the receive of its embeddings for the forward to come (`m_next`), in one
    group, as that module's encoder posts them (run_encoder). Returns {module: embeddings} (None when
    nothing is received). Each module's exchange completes before the next module's is posted: a module's
    encoder ranks wait for no other module, so the modules' exchanges cannot wait on each other."""
    got = {}
    for br in st.bridges:
        send = recv = None
        if grads is not None:
            m, g = grads
            b = work.batch(m)
            send = (m, g[br.module], b.sample_keys, b.counts(br.module))
        if m_next is not None:
            b = work.batch(m_next)
            recv = (m_next, b.sample_keys, b.counts(br.module))
        if send is not None or recv is not None:
            got[br.module] = timed(tm, "bridge_wait", br.language_exchange, st.iteration, send, recv)
    return got if m_next is not None else None


def _stage(st) -> int:
    return st.llm_shape.coords(st.role.rank)[1]

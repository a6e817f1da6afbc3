"""Activations and their gradients between adjacent LLM pipeline stages, and the 1F1B order a stage runs.

Each rank talks to the rank with its own TP and DP coordinates one stage up and one down (point-to-point on
the world group, as megatron-core's p2p communication does over the pipeline group). Between two compute
actions a stage posts the sends the first produced and the receives the second needs as one batched group
(p2p.py), as megatron-core's send_forward_recv_backward / send_backward_recv_forward do.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from mimo_jobs.trainer.parallel.p2p import Exchanger, Op


def interleaved(warm: int, microbatches: int) -> list[tuple[str, int]]:
    """("F"|"B", microbatch) in 1F1B order: `warm` forwards, then one forward and one backward
    alternately, then the remaining backwards (oldest first)."""
    warm = min(warm, microbatches)
    out = [("F", m) for m in range(warm)]
    for i in range(microbatches - warm):
        out += [("F", warm + i), ("B", i)]
    out += [("B", m) for m in range(microbatches - warm, microbatches)]
    return out


def one_f_one_b(stage: int, stages: int, microbatches: int) -> list[tuple[str, int]]:
    """The schedule of one stage: warm-up forwards (stages - stage - 1 of them, the forwards the later stages
    need before the first gradient comes back), then 1F1B, then the cool-down backwards. Pure: the trainer
    runs it, tests check it."""
    return interleaved(stages - stage - 1, microbatches)


def boundaries(sched: list) -> list[tuple]:
    """(the action just run, the next action) at every boundary of a schedule: before the first action
    (None, first), between two, after the last (last, None). A rank posts its exchanges there."""
    acts = [None, *sched, None]
    return list(zip(acts, acts[1:]))


def first_stage_bridge(stages: int, microbatches: int, grads_back: bool) -> list[tuple[list, list]]:
    """The first LLM stage's bridge exchanges in posting order, each as (microbatches whose embeddings it
    receives, microbatches whose embedding gradients it sends): at each boundary of its 1F1B schedule,
    the gradient of the backward just run and the embeddings of the forward to come. The encoder posts the
    same messages in this order (step/encoder_rank.run_encoder); messages between two ranks run in posting order under
    NCCL, so any other order can wait forever."""
    out = []
    for done, nxt in boundaries(one_f_one_b(0, stages, microbatches)):
        sends = [done[1]] if grads_back and done is not None and done[0] == "B" else []
        recvs = [nxt[1]] if nxt is not None and nxt[0] == "F" else []
        if sends or recvs:
            out.append((recvs, sends))
    return out


@dataclass
class StageLink:
    """This rank's neighbours in its pipeline: `prev`/`next` are global ranks (None at the ends)."""

    prev: int | None
    next: int | None
    shape: tuple[int, ...]  # the hidden states between stages: [sequence (/TP with SP), mbs, hidden]
    dtype: Any
    device: Any
    p2p: Exchanger = field(default_factory=Exchanger)

    def exchange(self, send_next=None, send_prev=None, recv_prev: bool = False, recv_next: bool = False):
        """One batched group: the given sends and receives together. Returns (from prev, from next): the
        previous stage's output as a leaf whose gradient this stage sends back, and the next stage's
        gradient (None where not asked for)."""
        ops, got_prev, got_next = [], None, None
        if send_next is not None:
            ops.append(Op(True, self._wire(send_next), self.next))
        if send_prev is not None:
            ops.append(Op(True, self._wire(send_prev), self.prev))
        if recv_prev:
            got_prev = torch.empty(self.shape, dtype=self.dtype, device=self.device)
            ops.append(Op(False, got_prev, self.prev))
        if recv_next:
            got_next = torch.empty(self.shape, dtype=self.dtype, device=self.device)
            ops.append(Op(False, got_next, self.next))
        self.p2p.exchange(ops)
        return (got_prev.requires_grad_(True) if got_prev is not None else None), got_next

    def _wire(self, t):
        return t.detach().to(self.dtype).contiguous()

    def finish(self) -> None:
        self.p2p.finish()


def stage_link(
    shape, role, hidden_shape: tuple[int, ...], dtype, device, p2p: Exchanger | None = None
) -> StageLink:
    """The link of `role`'s rank in the module `shape` (a grids.ModuleShape with pp > 1)."""
    tp, pp, dp = shape.coords(role.rank)
    prev = shape.rank_of(tp, pp - 1, dp) if pp > 0 else None
    nxt = shape.rank_of(tp, pp + 1, dp) if pp < shape.pp - 1 else None
    return StageLink(prev, nxt, hidden_shape, dtype, device, p2p or Exchanger())

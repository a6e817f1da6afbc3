"""Activations and their gradients between adjacent LLM pipeline stages, and the 1F1B order a stage runs.

Each rank talks to the rank with its own TP and DP coordinates one stage up and one down (point-to-point on
the world group, as megatron-core's p2p communication does over the pipeline group). Sends are
asynchronous and receives block, so the 1F1B order below cannot deadlock: a stage only ever waits for a
message the other side sends before it waits itself.
"""

from __future__ import annotations

import time
from dataclasses import dataclass


def one_f_one_b(stage: int, stages: int, microbatches: int) -> list[tuple[str, int]]:
    """The schedule of one stage as ("F"|"B", microbatch): warm-up forwards (stages - stage - 1 of them, the
    forwards the later stages need before the first gradient comes back), then one forward and one
    backward alternately, then the cool-down backwards. Pure: the trainer runs it, tests check it."""
    warm = min(stages - stage - 1, microbatches)
    out = [("F", m) for m in range(warm)]
    for i in range(microbatches - warm):
        out += [("F", warm + i), ("B", i)]
    out += [("B", m) for m in range(microbatches - warm, microbatches)]
    return out


@dataclass
class StageLink:
    """This rank's neighbours in its pipeline: `prev`/`next` are global ranks (None at the ends)."""

    prev: int | None
    next: int | None
    shape: tuple[int, ...]  # the hidden states between stages: [sequence (/TP with SP), mbs, hidden]
    dtype: object
    device: object

    def __post_init__(self) -> None:
        self.pending: list = []
        self.wait_s = 0.0

    def _isend(self, t, dst: int) -> None:
        import torch.distributed as dist

        self.pending = [(w, x) for w, x in self.pending if not w.is_completed()]
        t = t.detach().to(self.dtype).contiguous()
        self.pending.append((dist.isend(t, dst), t))

    def _recv(self, src: int):
        import torch
        import torch.distributed as dist

        t = torch.empty(self.shape, dtype=self.dtype, device=self.device)
        t0 = time.perf_counter()
        dist.recv(t, src)
        self.wait_s += time.perf_counter() - t0
        return t

    def send_forward(self, hidden) -> None:
        self._isend(hidden, self.next)

    def recv_forward(self):
        """The previous stage's output, as a leaf whose gradient this stage sends back."""
        return self._recv(self.prev).requires_grad_(True)

    def send_backward(self, grad) -> None:
        self._isend(grad, self.prev)

    def recv_backward(self):
        return self._recv(self.next)

    def finish(self) -> None:
        for work, _t in self.pending:
            work.wait()
        self.pending.clear()


def stage_link(shape, role, hidden_shape: tuple[int, ...], dtype, device) -> StageLink:
    """The link of `role`'s rank in the module `shape` (a grids.ModuleShape with pp > 1)."""
    tp, pp, dp = shape.coords(role.rank)
    prev = shape.rank_of(tp, pp - 1, dp) if pp > 0 else None
    nxt = shape.rank_of(tp, pp + 1, dp) if pp < shape.pp - 1 else None
    return StageLink(prev, nxt, hidden_shape, dtype, device)

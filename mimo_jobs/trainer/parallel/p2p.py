"""Point-to-point exchanges posted as batched groups, the one way the trainer's p2p traffic is posted.

NCCL gives a send no buffer to complete into once a message exceeds its staging buffer (NCCL_BUFFSIZE,
4 MiB by default: https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html), and runs the
operations between two ranks in the order they were posted. Two ranks that each post a send before the
receive of the other's message therefore wait on each other forever; gloo, which buffers, never shows it.
megatron-core's pipeline schedule avoids this by posting the sends and receives of one exchange together
with `torch.distributed.batch_isend_irecv` (megatron/core/pipeline_parallel/p2p_communication.py); so does
this module. The step posts, between two compute actions, the sends the first produced together with the
receives the second needs; tests/trainer/test_p2p_ordering.py proves every schedule the trainer runs free
of deadlock under rendezvous semantics.

A group with receives is waited for before what it receives is used (`exchange` at once, `post` leaves
that to the caller). A send-only group is left in flight, so a sender can run ahead; it is released when
it has completed, and `finish()` waits for the rest.
The communicator is passed in (`TorchComm` in training, a recorder in the ordering test).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import torch.distributed as dist


@dataclass(frozen=True)
class Op:
    """One side of a point-to-point message: send `tensor` to `peer`, or receive into it from `peer`."""

    send: bool
    tensor: Any
    peer: int  # global rank


class Comm(Protocol):
    def post(self, ops: list[Op]) -> list: ...  # one batched group; returns its works (wait/is_completed)

    def broadcast(self, tensor, src: int, group, ranks: tuple[int, ...]) -> None: ...


class TorchComm:
    """torch.distributed on the world group (batch_isend_irecv falls back to separate isend/irecv on gloo)."""

    def post(self, ops: list[Op]) -> list:
        return dist.batch_isend_irecv(
            [dist.P2POp(dist.isend if o.send else dist.irecv, o.tensor, o.peer) for o in ops]
        )

    def broadcast(self, tensor, src: int, group, ranks: tuple[int, ...]) -> None:
        dist.broadcast(tensor, src=src, group=group)


@dataclass
class Exchanger:
    """Posts groups on `comm`, waits for those with receives, keeps send-only groups until they complete."""

    comm: Any = field(default_factory=TorchComm)

    def __post_init__(self) -> None:
        self.pending: list[tuple[list, list]] = []  # (works, tensors kept alive until sent)

    def exchange(self, ops: list[Op]) -> None:
        """Post one group; wait for it when it receives."""
        works = self.post(ops)
        if works is not None:
            wait_all(works)

    def post(self, ops: list[Op]) -> list | None:
        """Post one group without waiting: returns its works when it receives (the caller waits for them
        before using what arrives), else None (kept here until sent)."""
        if not ops:
            return None
        # sends already delivered release their tensors now, not at finish(): with 1F1B the encoder's sent
        # embeddings must not pile up over the iteration's microbatches
        self.pending = [(ws, ts) for ws, ts in self.pending if not all(w.is_completed() for w in ws)]
        works = self.comm.post(ops)
        if any(not o.send for o in ops):
            return works
        self.pending.append((works, [o.tensor for o in ops]))
        return None

    def finish(self) -> None:
        for works, _tensors in self.pending:
            wait_all(works)
        self.pending.clear()


def wait_all(works: list) -> None:
    for w in works:
        w.wait()

"""Our variable-token bridge between the encoder grid and the LLM grid (fan-out, fan-in and 1:1).

Why not megatron-core 0.19's BridgeCommunicator: its fan-out splits a flat [sum N_i, H] tensor by per-sample
token counts, but its fan-in sends the gradient back in equal parts whatever each encoder replica sent, so
with image-token counts that differ between replicas every replica gets the wrong rows
(tests/trainer/test_core_mimo.py measures both; its MimoModel refuses that case). It also sends no
description of what crossed, where ours checks every message against the receiver's own batch.

Model: one LLM microbatch step covers mbs*llm_dp samples in lane order (lane l owns [l*mbs, (l+1)*mbs)).
Encoder replica e embeds the contiguous range [e*S, (e+1)*S), S = mbs*llm_dp/dp (the module's dp). Every (encoder
replica, lane) pair whose ranges overlap exchanges the image tokens of the overlapping samples: fan-out is
one replica -> k lanes, fan-in is k replicas -> one lane. Only replica leaders (TP rank 0) talk; the
receiving leader broadcasts to its TP peers. Each message is a header (step, microbatch, sample count,
hidden size, hash of the sample keys, per-sample token counts) followed by the payload; the receiver
compares the header with what its own batch says and raises `BridgeError` naming both ranks and sizes on
any difference, before it uses the payload. Zero-token pairs (text-only samples, image-less
microbatches) still exchange headers, so both sides always agree on what crossed.

A header travels in the same group as its payload (see `_post`), and each side sizes a payload from its
own batch; NCCL needs equal counts on both sides of a message and hangs rather than errs when they differ.
So the sizes are agreed before any payload moves: at the start of an iteration each first-stage LLM leader
sends every encoder replica it meets the headers it expects for all the iteration's microbatches (it has
drawn them all), and an encoder leader compares each header with that expectation before posting the
payload (`BridgeError` there, naming both ranks). The gradients going back have the same sizes.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any

import torch

from mimo_jobs.errors import MimoJobsError
from mimo_jobs.study.topology import RankLayout
from mimo_jobs.trainer.parallel.grids import ModuleShape
from mimo_jobs.trainer.parallel.p2p import Exchanger, Op, wait_all

MAGIC = 0x4D494D4F  # "MIMO"
HDR = 6  # fixed header fields before the per-sample counts


class BridgeError(MimoJobsError, RuntimeError):
    pass


# ------------------------------------------------------------------------------------- pure helpers


@dataclass(frozen=True)
class Segment:
    """The samples one (encoder replica, lane) pair exchanges, as offsets in each side's own sample list."""

    replica: int  # the encoder module's DP rank
    lane: int
    enc_start: int  # offset into the encoder replica's S samples
    lane_start: int  # offset into the lane's mbs samples
    n: int


def segments(plan: RankLayout) -> list[Segment]:
    """Every overlapping (encoder replica, lane) pair, ordered by global sample position. `plan` is one
    module's (grids.module_plan): its layout holds that module alone."""
    lay = plan.layout
    s = plan.samples_per_encoder_microbatch
    out = []
    for e in range(lay.single.dp):
        e0, e1 = e * s, (e + 1) * s
        for lane in range(lay.llm_dp):
            l0, l1 = lane * lay.mbs, (lane + 1) * lay.mbs
            a, b = max(e0, l0), min(e1, l1)
            if a < b:
                out.append(Segment(e, lane, a - e0, a - l0, b - a))
    return out


def segments_of_encoder(plan: RankLayout, replica: int) -> list[Segment]:
    return [g for g in segments(plan) if g.replica == replica]


def segments_of_lane(plan: RankLayout, lane: int) -> list[Segment]:
    return [g for g in segments(plan) if g.lane == lane]


def token_counts(batch, module: str) -> list[int]:
    """A lane batch's per-sample placeholder counts of one encoder module: what that module's bridge carries."""
    return batch.counts(module)


def keys_hash(keys: list[str]) -> int:
    return zlib.crc32("\x1f".join(keys).encode()) & 0x7FFFFFFF


def split_sizes(counts: list[int], parts: list[tuple[int, int]]) -> list[int]:
    """Token rows per part, parts given as (start, n) over the per-sample `counts`."""
    return [sum(counts[a : a + n]) for a, n in parts]


def check_split(rows: int, sizes: list[int], where: str) -> None:
    """A flat tensor of `rows` rows must split exactly into `sizes`."""
    if any(x < 0 for x in sizes) or sum(sizes) != rows:
        raise BridgeError(
            f"{where}: split sizes {sizes} (sum {sum(sizes)}) do not match the {rows} rows of "
            "the embedding tensor"
        )


def make_header(step: int, mb: int, hidden: int, keys: list[str], counts: list[int]) -> list[int]:
    return [MAGIC, step, mb, len(counts), hidden, keys_hash(keys)] + [int(c) for c in counts]


def check_header(got: list[int], expected: list[int], src: int, dst: int, what: str) -> None:
    """Compare a received header with the receiver's own expectation; raise naming ranks and sizes."""
    if got == expected:
        return
    names = ["magic", "step", "microbatch", "samples", "hidden", "sample-keys hash"]
    diffs = []
    for i, (g, x) in enumerate(zip(got, expected)):
        if g != x:
            diffs.append(
                f"{names[i] if i < HDR else 'tokens of sample ' + str(i - HDR)}: sent {g}, expected {x}"
            )
    if len(got) != len(expected):
        diffs.append(f"header length: sent {len(got)}, expected {len(expected)}")
    sent_sizes, exp_sizes = got[HDR:], expected[HDR:]
    raise BridgeError(
        f"bridge {what} mismatch from rank {src} to rank {dst}: "
        + "; ".join(diffs)
        + f" (per-sample token counts sent {sent_sizes} = {sum(sent_sizes)} rows, "
        f"receiver expects {exp_sizes} = {sum(exp_sizes)} rows)"
    )


# ------------------------------------------------------------------------------------------ runtime


@dataclass
class Incoming:
    """A posted group's receiving side: what `Bridge.collect` waits for, checks and returns."""

    recv: tuple | None  # (microbatch, keys, counts) or None when the group only sends
    own: ModuleShape  # the receiving module
    tp_group: Any
    what: str
    works: list | None = None
    headers: list = field(default_factory=list)
    expected: list = field(default_factory=list)
    payloads: list = field(default_factory=list)


class Bridge:
    """Point-to-point exchange over the world group between replica leaders, TP broadcast on arrival. One
    bridge per encoder module: a model of several, each on ranks of its own, has one from each module into
    the LLM's first stage.

    A posted group holds both directions, headers and payloads (p2p.py); the receiver sizes each payload
    from its own batch and checks the headers on arrival. The first LLM stage calls `language_exchange`
    between two compute actions, with what the first produced (`send`) and what the second needs (`recv`).
    An encoder rank posts the same messages in the same order with `encoder_post` (step/encoder_rank.run_encoder) and
    collects each gradient when its backward needs it."""

    def __init__(
        self,
        plan: RankLayout,
        enc: ModuleShape,
        llm: ModuleShape,
        role,
        enc_tp_group,
        llm_tp_group,
        hidden: int,
        dtype,
        device,
        p2p: Exchanger | None = None,
        module: str = "vision",
    ):
        # plan: as this bridge's encoder module meets the LLM (grids.module_plan); module: the encoder module's
        # name, whose placeholder counts (LaneBatch.inputs) size every message
        self.plan, self.enc, self.llm, self.role = plan, enc, llm, role
        self.module = module
        self.enc_tp_group, self.llm_tp_group = enc_tp_group, llm_tp_group
        self.hidden, self.dtype, self.device = hidden, dtype, device
        self.p2p = p2p or Exchanger()
        self.expected: dict[tuple[int, int], list[int]] = {}  # (LLM leader, microbatch) -> its header

    def language_expect(self, step: int, batches: list[tuple[list[str], list[int]]]) -> None:
        """First LLM stage, before its first exchange of iteration `step`: send each encoder replica this
        lane meets the headers this lane expects from it, for every microbatch (`batches`: [microbatch] ->
        (keys, counts) of the lane). Send-only: nothing waits."""
        if not self.role.is_leader:
            return
        segs = segments_of_lane(self.plan, self.role.dp_rank)
        ops = []
        for g in segs:
            a, n = g.lane_start, g.n
            table = [
                x
                for m, (keys, counts) in enumerate(batches)
                for x in self._header(step, m, keys, counts, a, n)
            ]
            ops.append(
                Op(
                    True,
                    torch.tensor(table, dtype=torch.int64, device=self.device),
                    self.enc.leader_of(g.replica),
                )
            )
        self.p2p.post(ops)

    def encoder_expect(self, step: int) -> None:
        """An encoder replica's leader, before its first post of iteration `step`: receive what each lane
        it meets expects (language_expect), to check every header against before its payload is posted."""
        self.expected = {}
        if not self.role.is_leader:
            return
        mbs = self.plan.num_microbatches
        segs = segments_of_encoder(self.plan, self.role.dp_rank)
        ops = [
            Op(
                False,
                torch.empty(mbs * (HDR + g.n), dtype=torch.int64, device=self.device),
                self.llm.leader_of(g.lane),
            )
            for g in segs
        ]
        self.p2p.exchange(ops)
        for g, op in zip(segs, ops):
            rows = op.tensor.view(mbs, HDR + g.n).tolist()
            for m, row in enumerate(rows):
                self.expected[(op.peer, m)] = row

    def _header(self, step: int, mb: int, keys, counts, a: int, n: int) -> list[int]:
        return make_header(step, mb, self.hidden, keys[a : a + n], counts[a : a + n])

    def encoder_post(self, step: int, send=None, recv=None) -> Incoming:
        """Post one group from an encoder rank without waiting. send: (microbatch, flat [sum counts, H]
        embeddings of this replica's S samples, keys, counts); recv: (microbatch, keys, counts) of a
        gradient, which `collect` returns."""
        segs = segments_of_encoder(self.plan, self.role.dp_rank)
        parts = [(g.enc_start, g.n) for g in segs]
        peers = [self.llm.leader_of(g.lane) for g in segs]
        return self._post(
            step, send, recv, parts, peers, ("forward", "backward"), self.enc, self.enc_tp_group
        )

    def language_exchange(self, step: int, send=None, recv=None):
        """One exchange of the first LLM stage. send: (microbatch, gradient of the lane's image embeddings,
        keys, counts); recv: (microbatch, keys, counts) of the embeddings wanted. Returns them
        [sum counts, H] on every TP rank of the lane (None when nothing is received)."""
        segs = segments_of_lane(self.plan, self.role.dp_rank)
        parts = [(g.lane_start, g.n) for g in segs]
        peers = [self.enc.leader_of(g.replica) for g in segs]
        inc = self._post(step, send, recv, parts, peers, ("backward", "forward"), self.llm, self.llm_tp_group)
        return self.collect(inc)

    def _post(self, step, send, recv, parts, peers, what, own: ModuleShape, tp_group) -> Incoming:
        inc = Incoming(recv, own, tp_group, what[1])
        if not self.role.is_leader:
            return inc
        out_hdr, out_pay = self._outgoing(step, send, parts, peers, what[0]) if send else ([], [])
        if recv:
            inc.headers, inc.expected = self._incoming_headers(step, recv, parts, peers)
            inc.payloads = self._incoming_payloads(recv, parts, peers)
        # one group, both directions, headers and payloads: waiting for the headers before posting the
        # payloads would deadlock whenever the other side's reply needs this side's payload first
        inc.works = self.p2p.post(out_hdr + out_pay + inc.headers + inc.payloads)
        return inc

    def collect(self, inc: Incoming):
        """Wait for a posted group, check its headers, and return what it received on every TP rank."""
        if inc.recv is None:
            return None
        if self.role.is_leader:
            wait_all(inc.works)
            for op, exp in zip(inc.headers, inc.expected):
                # the first host read of what arrived, before the payload is used
                check_header(op.tensor.tolist(), exp, op.peer, self.role.rank, inc.what)
            got = self._joined([op.tensor for op in inc.payloads])
        else:
            got = torch.empty(sum(inc.recv[2]), self.hidden, dtype=self.dtype, device=self.device)
        own = inc.own
        if own.tp > 1 and got.numel() > 0:
            dp = self.role.dp_rank
            ranks = tuple(own.rank_of(t, 0, dp) for t in range(own.tp))
            self.p2p.comm.broadcast(got, own.leader_of(dp), inc.tp_group, ranks)
        return got

    def _outgoing(self, step, send, parts, peers, what) -> tuple[list[Op], list[Op]]:
        mb, flat, keys, counts = send
        sizes = split_sizes(counts, parts)
        check_split(flat.shape[0], sizes, f"{what} on rank {self.role.rank}")
        hdrs, pays, row = [], [], 0
        for (a, n), size, dst in zip(parts, sizes, peers):
            hdr = self._header(step, mb, keys, counts, a, n)
            want = self.expected.get((dst, mb)) if what == "forward" else None
            if want is not None:  # the receiver's sizes, agreed before any payload is posted
                check_header(hdr, want, self.role.rank, dst, what)
            hdrs.append(Op(True, torch.tensor(hdr, dtype=torch.int64, device=self.device), dst))
            if size:
                pays.append(Op(True, flat[row : row + size].detach().to(self.dtype).contiguous(), dst))
            row += size
        return hdrs, pays

    def _incoming_headers(self, step, recv, parts, peers) -> tuple[list[Op], list[list[int]]]:
        mb, keys, counts = recv
        expected = [self._header(step, mb, keys, counts, a, n) for a, n in parts]
        ops = [
            Op(False, torch.empty(len(exp), dtype=torch.int64, device=self.device), src)
            for exp, src in zip(expected, peers)
        ]
        return ops, expected

    def _incoming_payloads(self, recv, parts, peers) -> list[Op]:
        _mb, _keys, counts = recv
        return [
            Op(False, torch.empty(size, self.hidden, dtype=self.dtype, device=self.device), src)
            for size, src in zip(split_sizes(counts, parts), peers)
            if size
        ]

    def _joined(self, chunks: list):
        if not chunks:
            return torch.empty(0, self.hidden, dtype=self.dtype, device=self.device)
        return torch.cat(chunks) if len(chunks) > 1 else chunks[0]

    def finish(self) -> None:
        self.p2p.finish()

"""Our variable-token bridge between the encoder grid and the LLM grid (fan-out, fan-in and 1:1).

Why not mcore's BridgeCommunicator (0.16.1): it splits the batch dimension equally, so a batch that does
not divide, or per-sample token counts that vary, are corrupted silently; it cannot split a
flat [sum N_i, H] tensor by samples at all.

Model: one LLM microbatch step covers mbs*llm_dp samples in lane order (lane l owns [l*mbs, (l+1)*mbs)).
Encoder replica e embeds the contiguous range [e*S, (e+1)*S), S = mbs*llm_dp/enc_dp. Every (encoder
replica, lane) pair whose ranges overlap exchanges the image tokens of the overlapping samples: fan-out is
one replica -> k lanes, fan-in is k replicas -> one lane. Only replica leaders (TP rank 0) talk; the
receiving leader broadcasts to its TP peers. Each message is a header (step, microbatch, sample count,
hidden size, hash of the sample keys, per-sample token counts) followed by the payload; the receiver
compares the header with what its own batch says and raises `BridgeError` naming both ranks and sizes on
any difference, before touching the payload. Zero-token pairs (text-only samples, image-less
microbatches) still exchange headers, so both sides always agree on what crossed.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from mimo_jobs.errors import MimoJobsError
from mimo_jobs.study.topology import RankLayout
from mimo_jobs.trainer.parallel.grids import ModuleShape

MAGIC = 0x4D494D4F  # "MIMO"
HDR = 6  # fixed header fields before the per-sample counts


class BridgeError(MimoJobsError, RuntimeError):
    pass


# ------------------------------------------------------------------------------------- pure helpers


@dataclass(frozen=True)
class Segment:
    """The samples one (encoder replica, lane) pair exchanges, as offsets in each side's own sample list."""

    enc_dp: int
    lane: int
    enc_start: int  # offset into the encoder replica's S samples
    lane_start: int  # offset into the lane's mbs samples
    n: int


def segments(plan: RankLayout) -> list[Segment]:
    """Every overlapping (encoder replica, lane) pair, ordered by global sample position."""
    lay = plan.layout
    s = plan.samples_per_encoder_microbatch
    out = []
    for e in range(lay.enc_dp):
        e0, e1 = e * s, (e + 1) * s
        for lane in range(lay.llm_dp):
            l0, l1 = lane * lay.mbs, (lane + 1) * lay.mbs
            a, b = max(e0, l0), min(e1, l1)
            if a < b:
                out.append(Segment(e, lane, a - e0, a - l0, b - a))
    return out


def segments_of_encoder(plan: RankLayout, enc_dp: int) -> list[Segment]:
    return [g for g in segments(plan) if g.enc_dp == enc_dp]


def segments_of_lane(plan: RankLayout, lane: int) -> list[Segment]:
    return [g for g in segments(plan) if g.lane == lane]


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


class Bridge:
    """Point-to-point exchange over the world group between replica leaders, TP broadcast on arrival.

    Encoder ranks call send_forward / recv_backward; LLM ranks recv_forward / send_backward. Sends are
    asynchronous (isend); `finish()` waits for all of this iteration's sends."""

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
    ):
        self.plan, self.enc, self.llm, self.role = plan, enc, llm, role
        self.enc_tp_group, self.llm_tp_group = enc_tp_group, llm_tp_group
        self.hidden, self.dtype, self.device = hidden, dtype, device
        self.pending: list = []
        self.wait_s = 0.0  # time spent blocked in receives (the "bridge wait" phase)

    # -- plumbing
    def _isend(self, t, dst: int) -> None:
        import torch.distributed as dist

        # sends already delivered release their tensors now, not at finish(): with 1F1B the encoder's sent
        # embeddings must not pile up over the iteration's microbatches
        self.pending = [(w, x) for w, x in self.pending if not w.is_completed()]
        self.pending.append((dist.isend(t, dst), t))

    def _recv(self, t, src: int):
        import time

        import torch.distributed as dist

        t0 = time.perf_counter()
        dist.recv(t, src)
        self.wait_s += time.perf_counter() - t0
        return t

    def _bcast(self, t, leader: int, group, size: int):
        import time

        import torch.distributed as dist

        if size > 1 and t.numel() > 0:
            t0 = time.perf_counter()
            dist.broadcast(t, src=leader, group=group)
            self.wait_s += time.perf_counter() - t0
        return t

    def _send_parts(self, step, mb, flat, keys, counts, parts, dst_ranks, what):
        import torch

        sizes = split_sizes(counts, [(a, n) for a, n in parts])
        check_split(flat.shape[0], sizes, f"{what} on rank {self.role.rank}")
        row = 0
        for (a, n), size, dst in zip(parts, sizes, dst_ranks):
            hdr = torch.tensor(
                make_header(step, mb, self.hidden, keys[a : a + n], counts[a : a + n]),
                dtype=torch.int64,
                device=self.device,
            )
            self._isend(hdr, dst)
            if size:
                self._isend(flat[row : row + size].detach().to(self.dtype).contiguous(), dst)
            row += size

    def _recv_parts(self, step, mb, keys, counts, parts, src_ranks, what):
        import torch

        chunks = []
        for (a, n), src in zip(parts, src_ranks):
            exp = make_header(step, mb, self.hidden, keys[a : a + n], counts[a : a + n])
            hdr = self._recv(torch.empty(len(exp), dtype=torch.int64, device=self.device), src)
            check_header(hdr.tolist(), exp, src, self.role.rank, what)
            size = sum(counts[a : a + n])
            if size:
                chunks.append(
                    self._recv(torch.empty(size, self.hidden, dtype=self.dtype, device=self.device), src)
                )
        if not chunks:
            return torch.empty(0, self.hidden, dtype=self.dtype, device=self.device)
        return torch.cat(chunks) if len(chunks) > 1 else chunks[0]

    # -- encoder side
    def send_forward(self, step: int, mb: int, flat, keys: list[str], counts: list[int]) -> None:
        """flat: [sum counts, H] embeddings of this replica's S samples (keys/counts in sample order)."""
        if not self.role.is_leader:
            return
        segs = segments_of_encoder(self.plan, self.role.dp_rank)
        self._send_parts(
            step,
            mb,
            flat,
            keys,
            counts,
            [(g.enc_start, g.n) for g in segs],
            [self.llm.leader_of(g.lane) for g in segs],
            "forward",
        )

    def recv_backward(self, step: int, mb: int, keys: list[str], counts: list[int]):
        import torch

        total = sum(counts)
        if self.role.is_leader:
            segs = segments_of_encoder(self.plan, self.role.dp_rank)
            g = self._recv_parts(
                step,
                mb,
                keys,
                counts,
                [(s.enc_start, s.n) for s in segs],
                [self.llm.leader_of(s.lane) for s in segs],
                "backward",
            )
        else:
            g = torch.empty(total, self.hidden, dtype=self.dtype, device=self.device)
        return self._bcast(g, self.enc.leader_of(self.role.dp_rank), self.enc_tp_group, self.enc.tp)

    # -- LLM side
    def recv_forward(self, step: int, mb: int, keys: list[str], counts: list[int]):
        """The lane's image embeddings [sum counts, H], on every TP rank of the lane."""
        import torch

        lane = self.role.dp_rank
        if self.role.is_leader:
            segs = segments_of_lane(self.plan, lane)
            x = self._recv_parts(
                step,
                mb,
                keys,
                counts,
                [(s.lane_start, s.n) for s in segs],
                [self.enc.leader_of(s.enc_dp) for s in segs],
                "forward",
            )
        else:
            x = torch.empty(sum(counts), self.hidden, dtype=self.dtype, device=self.device)
        return self._bcast(x, self.llm.leader_of(lane), self.llm_tp_group, self.llm.tp)

    def send_backward(self, step: int, mb: int, grad, keys: list[str], counts: list[int]) -> None:
        if not self.role.is_leader:
            return
        segs = segments_of_lane(self.plan, self.role.dp_rank)
        self._send_parts(
            step,
            mb,
            grad,
            keys,
            counts,
            [(g.lane_start, g.n) for g in segs],
            [self.enc.leader_of(g.enc_dp) for g in segs],
            "backward",
        )

    def finish(self) -> None:
        for work, _t in self.pending:
            work.wait()
        self.pending.clear()

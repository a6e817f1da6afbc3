"""Sequence packing (pure: no energon, no torch): which samples share a row, and where each one sits.

A packed row holds whole samples end to end, then padding. Each sample keeps its own positions (0, 1, ...)
and its own attention (it sees only itself), so a packed row computes exactly what the samples would
unpacked, one per row; `segments` says which sample each position belongs to, the one fact the trainer's
attention mask and position ids are built from.

Selection is first fit in stream order: each sample goes into the first pack (oldest first) with room
for it, a new pack otherwise; within a pack the samples keep their stream order. Deterministic in the
samples' lengths alone, so the encoder replica and its LLM lanes, which both see the same lengths, pack
identically.
"""

from __future__ import annotations

from dataclasses import dataclass

PAD_SEGMENT = -1  # the segment id of padding positions


def select_packs(lengths: list[int], capacity: int) -> list[list[int]]:
    """Indices into `lengths` grouped into packs of total length <= capacity (first fit, stream order);
    every index appears exactly once. A length over capacity is refused (the task encoder cuts or skips
    such samples before they get here)."""
    if capacity < 1:
        raise ValueError(f"capacity={capacity}: a row must hold at least one token")
    packs: list[list[int]] = []
    room: list[int] = []
    for i, n in enumerate(lengths):
        if not 1 <= n <= capacity:
            raise ValueError(f"sample {i} has {n} tokens; a packed row holds 1..{capacity}")
        for p, free in enumerate(room):
            if n <= free:
                packs[p].append(i)
                room[p] -= n
                break
        else:
            packs.append([i])
            room.append(capacity - n)
    return packs


@dataclass(frozen=True)
class RowLayout:
    """Per position of one row: the sample it belongs to (PAD_SEGMENT for padding) and its position id."""

    segments: list[int]
    positions: list[int]


def row_layout(lengths: list[int], seq_length: int) -> RowLayout:
    """Samples of `lengths` laid end to end in a row of seq_length: segment k covers sample k and its
    positions restart at 0; padding positions count on from 0 too (no loss reads them)."""
    total = sum(lengths)
    if total > seq_length:
        raise ValueError(f"samples of {total} tokens do not fit a row of {seq_length}")
    segments: list[int] = []
    positions: list[int] = []
    for k, n in enumerate(lengths):
        segments += [k] * n
        positions += list(range(n))
    pad = seq_length - total
    return RowLayout(segments + [PAD_SEGMENT] * pad, positions + list(range(pad)))


def efficiency(lengths: list[int], packs: list[list[int]], seq_length: int) -> float:
    """Share of the packed rows' positions that hold sample tokens (1.0: no padding)."""
    return sum(lengths) / (len(packs) * seq_length) if packs else 0.0

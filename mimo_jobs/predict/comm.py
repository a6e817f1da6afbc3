"""Collective costs from the ring formulas (Thakur, Rabenseifner and Gropp 2005, "Optimization of
Collective Communication Operations in MPICH"; the same bus-bandwidth factors as NVIDIA's nccl-tests
PERFORMANCE.md): `n` ranks, `nbytes` the buffer each rank holds, `bw` bytes/s one direction per rank.
The latency side of the same formulas (their alpha term): a ring all-reduce takes 2 (n - 1) steps, a
reduce-scatter, all-gather or pairwise all-to-all n - 1, a send one; each step costs the per-call latency."""

from __future__ import annotations


def all_reduce_s(nbytes: float, n: int, bw: float) -> float:
    return 0.0 if n <= 1 else 2 * (n - 1) / n * nbytes / bw


def reduce_scatter_s(nbytes: float, n: int, bw: float) -> float:
    """Also all-gather: each rank sends (n - 1) / n of the whole buffer."""
    return 0.0 if n <= 1 else (n - 1) / n * nbytes / bw


def all_to_all_s(nbytes: float, n: int, bw: float) -> float:
    """Each rank keeps 1/n of its buffer and sends the rest."""
    return 0.0 if n <= 1 else (n - 1) / n * nbytes / bw


def p2p_s(nbytes: float, bw: float) -> float:
    return nbytes / bw


def all_reduce_steps(n: int) -> int:
    return 0 if n <= 1 else 2 * (n - 1)


def ring_steps(n: int) -> int:
    """reduce-scatter, all-gather, all-to-all."""
    return 0 if n <= 1 else n - 1

"""The rule that prices a GEMM or an attention of any shape from a measured operator table
(contract/opstable.py; benchmarks/gpu/ops.py writes it, `cluster.hardware.ops` names it). Pure.

The rule: the achieved rate (FLOP/s) of a shape is the inverse-distance-weighted mean (weights 1 / d^2) of
the rates of its NEAREST measured shapes, d the Euclidean distance in log2 of the shape's dimensions: a
GEMM's (m, n, k), an attention's (s, d) among the rows of its mask (causal or not). Why this rule: a table
is a scatter, not a grid (ops.py skips the shapes past its time budget, and a hand-made table picks its
own), so bilinear interpolation does not apply; in log space a shape twice as large is as far as one half
as large, as GEMM efficiency behaves (tile and wave quantization step with powers of two); the weighted
mean returns a measured rate exactly at a measured shape and never leaves the measured rates' range.
A dimension beyond the table's range is clamped to it first (the rate of the nearest measured size, not an
extrapolation), and the lookup says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mimo_jobs.contract.opstable import OpsTable

NEAREST = 4  # measured shapes a lookup weighs


@dataclass(frozen=True)
class Lookup:
    """A priced shape: its rate (FLOP/s) and whether a dimension lay outside the table's range."""

    rate: float
    clamped: bool


def _interpolate(points: list[tuple[tuple[float, ...], float]], at: tuple[float, ...]) -> Lookup:
    """The module docstring's rule over (log2 coordinates, rate) points at log2 coordinates `at`."""
    lows = [min(p[0][i] for p in points) for i in range(len(at))]
    highs = [max(p[0][i] for p in points) for i in range(len(at))]
    x = tuple(min(max(a, lo), hi) for a, lo, hi in zip(at, lows, highs))
    clamped = any(abs(a - c) > 1e-9 for a, c in zip(at, x))
    near = sorted(points, key=lambda p: math.dist(p[0], x))[:NEAREST]
    weights = []
    for coords, rate in near:
        d = math.dist(coords, x)
        if d < 1e-9:
            return Lookup(rate, clamped)
        weights.append((1.0 / (d * d), rate))
    total = sum(w for w, _ in weights)
    return Lookup(sum(w * r for w, r in weights) / total, clamped)


def _log2(*dims: float) -> tuple[float, ...]:
    return tuple(math.log2(max(v, 1.0)) for v in dims)


def gemm_rate(table: OpsTable, m: float, n: float, k: float, dtype: str) -> Lookup | None:
    """The achieved FLOP/s of an (m x k) @ (k x n) GEMM in `dtype`; None when the table has no row of it."""
    rows = [r for r in table.gemm if r.dtype == dtype]
    if not rows:
        return None
    return _interpolate([(_log2(r.m, r.n, r.k), r.rate) for r in rows], _log2(m, n, k))


def attention_rate(table: OpsTable, s: float, d: float, causal: bool) -> Lookup | None:
    """The achieved forward FLOP/s of a fused attention over `s` tokens at head dim `d`, from the rows of
    its mask (the other mask's rows where the table has none of it: clamped); None without rows."""
    rows = [r for r in table.attention if r.causal == causal]
    other = not rows
    rows = rows or list(table.attention)
    if not rows:
        return None
    got = _interpolate([(_log2(r.s, r.d), r.rate) for r in rows], _log2(s, d))
    return Lookup(got.rate, got.clamped or other)

"""Fit the planner's efficiencies to measured iteration times.

Each predicted iteration splits into encoder compute E, LLM compute L, network N (tp, ep, bridge, dp) and
a fixed part F (the optimizer at HBM bandwidth): t = E + L + N + F, each of E, L, N inversely proportional
to its efficiency. The fit finds scales s so that s_e E + s_l L + s_n N + F matches the measured times,
by least squares on relative errors (each run weighs the same, whatever its length); the efficiencies
are then divided by their scales. Three scales are fitted only from more than three runs, two (one compute
scale and the network's) from more than two, else one ratio for all: a fit with as many unknowns as runs
matches them exactly and says nothing about the next one. A fit that is singular or gives a scale <= 0
falls back to fewer unknowns.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .steptime import Efficiency


@dataclass(frozen=True)
class Point:
    """One run: its predicted seconds per part, and the measured iteration seconds."""

    name: str
    encoder_s: float
    llm_s: float
    network_s: float
    fixed_s: float
    measured_s: float

    @property
    def predicted_s(self) -> float:
        return self.encoder_s + self.llm_s + self.network_s + self.fixed_s


@dataclass(frozen=True)
class Scales:
    """Measured / predicted seconds of each part; `unknowns` says how many were fitted independently."""

    encoder: float = 1.0
    llm: float = 1.0
    network: float = 1.0
    unknowns: int = 0

    def apply(self, p: Point) -> float:
        return self.encoder * p.encoder_s + self.llm * p.llm_s + self.network * p.network_s + p.fixed_s

    def efficiency(self, base: Efficiency) -> Efficiency:
        return replace(
            base,
            encoder=base.encoder / self.encoder,
            llm=base.llm / self.llm,
            network=base.network / self.network,
        )


def _solve(a: list[list[float]], b: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting; None when (nearly) singular."""
    n = len(b)
    m = [row[:] + [b[i]] for i, row in enumerate(a)]
    scale = max((abs(m[i][i]) for i in range(n)), default=0.0)
    for c in range(n):
        piv = max(range(c, n), key=lambda r: abs(m[r][c]))
        if abs(m[piv][c]) <= 1e-12 * scale:
            return None
        m[c], m[piv] = m[piv], m[c]
        for r in range(c + 1, n):
            f = m[r][c] / m[c][c]
            m[r] = [x - f * y for x, y in zip(m[r], m[c])]
    x = [0.0] * n
    for r in reversed(range(n)):
        x[r] = (m[r][n] - sum(m[r][k] * x[k] for k in range(r + 1, n))) / m[r][r]
    return x


def _least_squares(cols: list[list[float]], y: list[float]) -> list[float] | None:
    """argmin |sum_j x_j cols[j] - y|^2 by the normal equations (a handful of unknowns)."""
    a = [[sum(u * v for u, v in zip(ci, cj)) for cj in cols] for ci in cols]
    return _solve(a, [sum(u * v for u, v in zip(ci, y)) for ci in cols])


# The designs tried, most unknowns first: which parts share a scale.
_DESIGNS = (
    (("encoder",), ("llm",), ("network",)),
    (("encoder", "llm"), ("network",)),
    (("encoder", "llm", "network"),),
)


def fit(points: list[Point]) -> Scales:
    """The scales of the largest design the runs support (see the module's docstring)."""
    points = [p for p in points if p.measured_s > 0]
    if not points:
        raise ValueError("no measured run to calibrate against")
    y = [1.0 - p.fixed_s / p.measured_s for p in points]
    for design in _DESIGNS:
        k = len(design)
        if k > 1 and len(points) <= k:
            continue
        cols = [
            [sum(getattr(p, f"{part}_s") for part in group) / p.measured_s for p in points]
            for group in design
        ]
        if any(not any(c) for c in cols):
            continue  # a part no run has (frozen module, no network): its scale is not determined
        x = _least_squares(cols, y)
        if x is None or any(v <= 0 for v in x):
            continue
        found = {part: v for group, v in zip(design, x) for part in group}
        return Scales(found["encoder"], found["llm"], found["network"], k)
    return Scales()


def relative_error(predicted: float, measured: float | None) -> float | None:
    """Signed: (predicted - measured) / measured; None without a measurement."""
    return (predicted - measured) / measured if measured else None


def mean_abs(errors: list[float]) -> float | None:
    return sum(abs(e) for e in errors) / len(errors) if errors else None

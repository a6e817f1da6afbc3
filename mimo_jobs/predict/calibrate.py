"""Fit the planner's efficiencies to measured iteration times.

Each predicted iteration splits into encoder compute E, LLM compute L, network N (tp, ep, bridge, dp), the
per-call latency C (launches and collective steps) and a fixed part F (the optimizer at HBM bandwidth):
t = E + L + N + C + F, each of E, L, N inversely proportional to its efficiency, C proportional to the
latency scale. The fit finds scales s so that s_e E + s_l L + s_n N + s_c C + F matches the measured
times, by least squares on relative errors (each run weighs the same, whatever its length); the
efficiencies are then divided by their scales and the latency multiplied by its own. The designs below
are tried most unknowns first (of those with as many unknowns, the one with the smallest residual wins);
one with k > 1 unknowns needs more than k runs (a fit with as many unknowns
as runs matches them exactly and says nothing about the next one). Bandwidth and latency are kept apart
as long as there are runs for it, since they scale differently with a layout (bytes against calls). A fit
that is singular or gives a scale <= 0 falls back to the next design.
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
    latency_s: float = 0.0

    @property
    def predicted_s(self) -> float:
        return self.encoder_s + self.llm_s + self.network_s + self.latency_s + self.fixed_s


@dataclass(frozen=True)
class Scales:
    """Measured / predicted seconds of each part; `unknowns` says how many were fitted independently."""

    encoder: float = 1.0
    llm: float = 1.0
    network: float = 1.0
    unknowns: int = 0
    latency: float = 1.0

    def apply(self, p: Point) -> float:
        return (
            self.encoder * p.encoder_s
            + self.llm * p.llm_s
            + self.network * p.network_s
            + self.latency * p.latency_s
            + p.fixed_s
        )

    def efficiency(self, base: Efficiency) -> Efficiency:
        return replace(
            base,
            encoder=base.encoder / self.encoder,
            llm=base.llm / self.llm,
            network=base.network / self.network,
            latency=base.latency * self.latency,
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
    (("encoder",), ("llm",), ("network",), ("latency",)),
    (("encoder",), ("llm",), ("network",)),
    (("encoder", "llm"), ("network",), ("latency",)),
    (("encoder", "llm"), ("network",)),
    (("encoder", "llm", "network"), ("latency",)),
    (("encoder", "llm", "network", "latency"),),
)


_PARTS = ("encoder", "llm", "network", "latency")


def _fit_design(design, points: list[Point]) -> tuple[float, dict] | None:
    """(sum of squared relative residuals, scale per part) of one design; None when undetermined."""
    # a part the design does not scale keeps its predicted seconds, like the fixed part
    unscaled = [part for part in _PARTS if not any(part in group for group in design)]
    y = [1.0 - (p.fixed_s + sum(getattr(p, f"{u}_s") for u in unscaled)) / p.measured_s for p in points]
    cols = [
        [sum(getattr(p, f"{part}_s") for part in group) / p.measured_s for p in points] for group in design
    ]
    if any(not any(c) for c in cols):
        return None  # a part no run has (frozen module, no network): its scale is not determined
    x = _least_squares(cols, y)
    if x is None or any(v <= 0 for v in x):
        return None
    residual = sum((sum(xj * c[i] for xj, c in zip(x, cols)) - y[i]) ** 2 for i in range(len(points)))
    return residual, {part: v for group, v in zip(design, x) for part in group}


def fit(points: list[Point]) -> Scales:
    """The scales of the largest design the runs support; of designs with as many unknowns, the one whose
    fit leaves the smallest residual (see the module's docstring)."""
    points = [p for p in points if p.measured_s > 0]
    if not points:
        raise ValueError("no measured run to calibrate against")
    for k in sorted({len(d) for d in _DESIGNS}, reverse=True):
        if k > 1 and len(points) <= k:
            continue
        found = [f for f in (_fit_design(d, points) for d in _DESIGNS if len(d) == k) if f is not None]
        if found:
            scales = min(found, key=lambda f: f[0])[1]
            return Scales(scales["encoder"], scales["llm"], scales["network"], k, scales.get("latency", 1.0))
    return Scales()


def relative_error(predicted: float, measured: float | None) -> float | None:
    """Signed: (predicted - measured) / measured; None without a measurement."""
    return (predicted - measured) / measured if measured else None


def mean_abs(errors: list[float]) -> float | None:
    return sum(abs(e) for e in errors) / len(errors) if errors else None

"""Fit the planner's efficiencies to measured runs, and say how far off it was before and after.

The measured figure is the report's median steady-state iteration time (report/build.py). The model splits
each predicted iteration into its compute time C and the rest R (communication, bubbles, optimizer), and
fits t_measured = alpha C + beta R by least squares on relative errors (two unknowns, closed form); the
compute efficiencies are divided by alpha, the network efficiency by beta. With one run (or runs that cannot
separate the two) one ratio scales both. The hold-out check fits on all node counts but one and predicts
that one, for each node count in turn.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from .steptime import Efficiency


@dataclass(frozen=True)
class Point:
    """One run: its predicted compute and other seconds, and the measured iteration seconds."""

    name: str
    nodes: int
    compute_s: float
    other_s: float
    measured_s: float

    @property
    def predicted_s(self) -> float:
        return self.compute_s + self.other_s


@dataclass(frozen=True)
class Fit:
    alpha: float
    beta: float
    error_before: float  # mean |predicted - measured| / measured, default efficiencies
    error_after: float
    holdout: list[tuple[str, int, float, float]] = field(
        default_factory=list
    )  # name, nodes, predicted, measured
    holdout_error: float | None = None

    def efficiency(self, base: Efficiency) -> Efficiency:
        return replace(
            base,
            encoder=base.encoder / self.alpha,
            llm=base.llm / self.alpha,
            network=base.network / self.beta,
        )


def _scales(points: list[Point]) -> tuple[float, float]:
    """Least squares of 1 = alpha C/t + beta R/t over the points; one ratio when that is singular."""
    rows = [(p.compute_s / p.measured_s, p.other_s / p.measured_s) for p in points]
    a11 = sum(c * c for c, _ in rows)
    a12 = sum(c * r for c, r in rows)
    a22 = sum(r * r for _, r in rows)
    b1, b2 = sum(c for c, _ in rows), sum(r for _, r in rows)
    det = a11 * a22 - a12 * a12
    if len(points) >= 2 and det > 1e-12 * max(a11 * a22, 1e-300):
        alpha, beta = (b1 * a22 - b2 * a12) / det, (a11 * b2 - a12 * b1) / det
        if alpha > 0 and beta > 0:
            return alpha, beta
    ratio = sum(c + r for c, r in rows) / max(sum((c + r) ** 2 for c, r in rows), 1e-300)
    return ratio, ratio


def _error(points: list[Point], alpha: float, beta: float) -> float:
    errs = [abs(alpha * p.compute_s + beta * p.other_s - p.measured_s) / p.measured_s for p in points]
    return sum(errs) / len(errs) if errs else 0.0


def fit(points: list[Point]) -> Fit:
    points = [p for p in points if p.measured_s > 0]
    if not points:
        raise ValueError("no measured run to calibrate against")
    alpha, beta = _scales(points)
    holdout = []
    for n in sorted({p.nodes for p in points}):
        train = [p for p in points if p.nodes != n]
        if not train:
            continue
        a, b = _scales(train)
        holdout += [
            (p.name, n, a * p.compute_s + b * p.other_s, p.measured_s) for p in points if p.nodes == n
        ]
    herr = sum(abs(pr - m) / m for _, _, pr, m in holdout) / len(holdout) if holdout else None
    return Fit(alpha, beta, _error(points, 1.0, 1.0), _error(points, alpha, beta), holdout, herr)

"""Efficiencies fitted per GPU generation from measured step times (`python benchmarks/published.py --fit`
prints what hardware.FITTED_EFFICIENCY stores).

For a fixed layout a run's predicted step time is compute_s / (compute efficiency x GEMM factor) + network_s /
network efficiency + fixed_s (steptime.py: compute scales with 1 / (Efficiency.llm x gemm_factor), the TP,
CP, EP, pipeline and DP transfers with 1 / Efficiency.network, kernel launches and the optimizer pass with
neither; gemm_factor = width / (width + half width)). So each run is priced three times to find the three
terms, and the fit needs no further pricing. (A run whose DP transfers overlap its compute,
RunShape.overlap_dp, is linear only piecewise: the cover clips the transfers at zero; the fit takes the three
prices' linear terms for it.) It minimises the sum of squared log errors (log predicted -
log measured) over one generation's runs by a grid search, coarse then fine.

The ranges are what the quantities can physically be: a compute fraction in (0, 1]; a network fraction of at
least NETWORK_RANGE[0] (NVIDIA's nccl-tests PERFORMANCE.md reports bus bandwidths close to the links' rates:
without the floor the fit trades transfer time for compute time on runs whose transfers are small); a half
width of 0 (no size effect) to 4096. A generation with fewer than MIN_RUNS runs fits its compute fraction
alone, with the network fraction and half width of the pooled fit of all runs (three parameters from one or
two runs would fit them exactly and say nothing); one with no runs takes the pooled fit whole.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from .steptime import Efficiency, gemm_factor

MIN_RUNS = 3
COMPUTE_RANGE = (0.10, 1.00)
NETWORK_RANGE = (0.50, 1.00)
HALF_WIDTHS = tuple(float(w) for w in range(0, 4097, 64))


@dataclass(frozen=True)
class Decomposed:
    """Step time = compute_s / (compute x gemm_factor(width, half_width)) + network_s / network + fixed_s."""

    compute_s: float
    network_s: float
    fixed_s: float
    width: float  # steptime.gemm_width of the run's layout

    def at(self, compute: float, network: float, half_width: float = 0.0) -> float:
        g = gemm_factor(self.width, half_width)
        return self.compute_s / (compute * g) + self.network_s / network + self.fixed_s


def decompose(step_s: Callable[[Efficiency], float], width: float) -> Decomposed:
    """`step_s` (a step time at an Efficiency without the size effect) as its three terms."""
    one = step_s(Efficiency(encoder=1.0, llm=1.0, network=1.0))
    half_c = step_s(Efficiency(encoder=0.5, llm=0.5, network=1.0))
    half_n = step_s(Efficiency(encoder=1.0, llm=1.0, network=0.5))
    a, b = half_c - one, half_n - one
    return Decomposed(a, b, one - a - b, width)


class _Loss:
    """The squared log error of `parts` against `measured` at (compute, network, half width): each part's
    gemm factor is taken once per half width, the same sums Decomposed.at makes (a grid search asks for the
    same few half widths thousands of times)."""

    def __init__(self, parts: list[Decomposed], measured: list[float]):
        if len(parts) != len(measured):
            raise ValueError(f"{len(parts)} runs, {len(measured)} measured times")
        self.parts, self.measured = parts, measured
        self._terms: dict[float, list[tuple[float, float, float, float, float]]] = {}

    def __call__(self, c: float, n: float, w: float) -> float:
        terms = self._terms.get(w)
        if terms is None:
            terms = self._terms[w] = [
                (p.compute_s, gemm_factor(p.width, w), p.network_s, p.fixed_s, m)
                for p, m in zip(self.parts, self.measured, strict=True)
            ]
        return sum(math.log((a / (c * g) + b / n + f) / m) ** 2 for a, g, b, f, m in terms)


def _grid(lo: float, hi: float, step: float) -> list[float]:
    return [lo + i * step for i in range(int(round((hi - lo) / step)) + 1)]


def _near(x: float, step: float, rng: tuple[float, float]) -> list[float]:
    return [v for v in _grid(x - step, x + step, step / 10) if rng[0] - 1e-9 <= v <= rng[1] + 1e-9]


def fit(parts: list[Decomposed], measured: list[float]) -> tuple[float, float, float]:
    """(compute, network, half width) minimising the squared log error of `parts` against `measured` s."""
    if not parts:
        raise ValueError("no runs to fit")
    cands = [
        (c, n, w)
        for c in _grid(*COMPUTE_RANGE, 0.02)
        for n in _grid(*NETWORK_RANGE, 0.05)
        for w in HALF_WIDTHS[::4]
    ]
    loss = _Loss(parts, measured)
    c0, n0, w0 = min(cands, key=lambda x: loss(*x))
    widths = [w for w in HALF_WIDTHS if abs(w - w0) <= 256]
    fine = [
        (c, n, w)
        for c in _near(c0, 0.02, COMPUTE_RANGE)
        for n in _near(n0, 0.05, NETWORK_RANGE)
        for w in widths
    ]
    c, n, w = min(fine, key=lambda x: loss(*x))
    return round(c, 3), round(n, 3), w


def fit_compute(parts: list[Decomposed], measured: list[float], network: float, half_width: float) -> float:
    """The compute fraction alone, the other two given."""
    loss = _Loss(parts, measured)
    c0 = min(_grid(*COMPUTE_RANGE, 0.02), key=lambda c: loss(c, network, half_width))
    c = min(_near(c0, 0.02, COMPUTE_RANGE), key=lambda c: loss(c, network, half_width))
    return round(c, 3)


def fit_generations(
    generations: list[str], parts: list[Decomposed], measured: list[float], wanted: tuple[str, ...] = ()
) -> dict[str, tuple[float, float, float]]:
    """One (compute, network, half width) per generation of the runs and of `wanted` (generations to price
    with no runs of their own: the pooled fit)."""
    pooled = fit(parts, measured)
    out = {}
    for g in sorted(set(generations) | set(wanted)):
        idx = [i for i, x in enumerate(generations) if x == g]
        sub_p, sub_m = [parts[i] for i in idx], [measured[i] for i in idx]
        if len(idx) >= MIN_RUNS:
            out[g] = fit(sub_p, sub_m)
        elif idx:
            out[g] = (fit_compute(sub_p, sub_m, pooled[1], pooled[2]), pooled[1], pooled[2])
        else:
            out[g] = pooled
    return out


def share(step_s: Callable[[float], float], measured: float, lo: float = 1e-3, hi: float = 1.0) -> float:
    """The share s in [lo, hi] of a fitted fraction at which `step_s(s)` (a step time that falls as s grows)
    equals `measured` seconds, to three significant figures: bisection on log s (the bound nearest when the
    measurement lies beyond what [lo, hi] can price). What benchmarks/measured.py fits the local-layer shares
    (hardware.LOCAL_COMPUTE_SHARE, LOCAL_EXPERTS_SHARE) with, one measured run each."""
    if step_s(hi) >= measured:
        return hi
    if step_s(lo) <= measured:
        return lo
    a, b = math.log(lo), math.log(hi)
    for _ in range(60):
        mid = (a + b) / 2
        a, b = (mid, b) if step_s(math.exp(mid)) > measured else (a, mid)
    s = math.exp((a + b) / 2)
    return float(f"{s:.3g}")

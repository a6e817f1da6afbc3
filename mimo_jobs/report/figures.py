"""Report math: pure functions, no database (the SQL in queries.py only aggregates rows).

Conventions:
- steady-state window: iterations from `steady_cutoff` on (skip the first 10% of the logged span, at least
  the first iteration, which carries start-up cost); median/mean/std of the iteration time over it;
- samples/s = gbs / t_iter; tokens/s = samples/s * seq_length; per GPU = / ALL GPUs of the job
  (encoder GPUs included);
- MFU = model FLOPs per sample (mimo_jobs/predict/flops.py) * samples/s / (GPUs * dense BF16 peak), the
  peak the planner's (mimo_jobs/predict/hardware.py, with the study's cluster.hardware figures);
- scaling efficiency E(N) = P(N) / P(N0), P = per-GPU throughput (tokens/s/GPU, or samples/s/GPU when the
  sequence length is unknown), N0 = baseline node count (same formula for strong and weak scaling);
- loss parity: losses interpolated at equal consumed samples.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

EFFICIENCY_FLOOR = 0.80  # below this E(N) is flagged as a slow-down
SPEEDUP_TOLERANCE = 0.05  # E(N) above 1 + this is an unexpected (super-linear) speed-up
NOISE_CV = 0.20  # std/mean of the iteration time above this is flagged as noisy
PARITY_TOLERANCE = 0.05  # relative loss difference at equal samples flagged above this


# A change smaller than this share is never called a regression or a ranking, whatever the window's spread
# says: a chosen floor (CLI: --noise-floor), because a few percent move between jobs of one layout on a
# shared machine are not about the code.
NOISE_FLOOR = 0.03
Z95 = 1.96  # two-sided 95% quantile of the normal distribution


def ci95_rel(std: float | None, mean: float | None, n: int) -> float | None:
    """Half-width of the 95% confidence interval of a mean, relative to the mean (normal approximation)."""
    if std is None or not mean or n < 2:
        return None
    return Z95 * std / abs(mean) / math.sqrt(n)


def noise(rel_cis: list[float | None], floor: float = NOISE_FLOOR) -> float:
    """The relative change two measurements must differ by to count: their 95% intervals combined in
    quadrature, never below `floor`."""
    known = [x for x in rel_cis if x is not None]
    return max(floor, math.sqrt(sum(x * x for x in known)))


def steady_cutoff(first: int, last: int, frac: float = 0.10, min_skip: int = 1) -> int:
    """First iteration of the steady-state window: skip max(min_skip, ceil(frac * span)) iterations of
    the logged span [first, last]; never past `last` (a run with one logged iteration keeps it)."""
    span = last - first + 1
    skip = max(min_skip, math.ceil(frac * span - 1e-9))
    return min(first + skip, last)


@dataclass(frozen=True)
class Stats:
    median: float
    mean: float
    std: float | None  # sample std (n-1); None for one value
    n: int


def stats(values: list[float]) -> Stats:
    v = sorted(values)
    n = len(v)
    if n == 0:
        raise ValueError("no values")
    med = v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2
    mean = sum(v) / n
    std = math.sqrt(sum((x - mean) ** 2 for x in v) / (n - 1)) if n > 1 else None
    return Stats(med, mean, std, n)


@dataclass(frozen=True)
class Throughput:
    samples_per_s: float
    tokens_per_s: float | None
    samples_per_s_per_gpu: float | None
    tokens_per_s_per_gpu: float | None  # over ALL GPUs of the job (encoder GPUs included)


def throughput(gbs: int, t_iter_ms: float, seq_length: int | None, gpus: int | None) -> Throughput:
    sps = gbs / (t_iter_ms / 1000.0)
    tps = sps * seq_length if seq_length else None
    return Throughput(
        sps, tps, sps / gpus if gpus else None, tps / gpus if tps is not None and gpus else None
    )


@dataclass
class TokenRates:
    carried_per_s: float
    carried_per_s_per_gpu: float | None
    loss_per_s_per_gpu: float | None
    padded_share: float | None  # of the gbs * seq_length slots
    carried_per_sample: float
    image_per_sample: float | None


def token_rates(
    ms: float | None,
    carried: float | None,
    loss: float | None,
    image: float | None,
    n: int,
    gbs: int | None,
    seq_length: int | None,
    gpus: int | None,
) -> TokenRates | None:
    """Rates over `n` iterations with counted tokens that took `ms` in all: the sums over their time (not a
    median: a sum of tokens over a sum of times is what a token budget consumes). None when none counted."""
    if not n or not ms or ms <= 0 or not carried or not gbs:
        return None
    secs = ms / 1e3
    slots = gbs * seq_length * n if seq_length else None
    return TokenRates(
        carried / secs,
        carried / secs / gpus if gpus else None,
        loss / secs / gpus if gpus and loss is not None else None,
        1 - carried / slots if slots else None,
        carried / (gbs * n),
        image / (gbs * n) if image is not None else None,
    )


def mfu(flops_per_sample: float, samples_per_s: float, gpus: int, peak: float) -> float:
    return flops_per_sample * samples_per_s / (gpus * peak)


def efficiency(p: float | None, p0: float | None) -> float | None:
    if p is None or not p0:
        return None
    return p / p0


def scaling_flags(
    eff: float | None,
    nodes: int | None,
    base_nodes: int | None,
    t_ms: float | None,
    t0_ms: float | None,
    scaling: str,
    cv: float | None,
    gbs: int | None,
    base_gbs: int | None,
) -> list[str]:
    """Flags a person should look at: an unexpected speed-up is as suspicious as a slow-down."""
    out = []
    if eff is not None and nodes != base_nodes:
        if eff > 1 + SPEEDUP_TOLERANCE:
            out.append(f"unexpected speed-up (E={eff:.2f} > {1 + SPEEDUP_TOLERANCE:.2f})")
        elif eff < EFFICIENCY_FLOOR:
            out.append(f"slow-down (E={eff:.2f} < {EFFICIENCY_FLOOR:.2f})")
    if (
        scaling == "strong"
        and nodes
        and base_nodes
        and nodes > base_nodes
        and t_ms
        and t0_ms
        and t_ms > t0_ms
    ):
        out.append(f"slower per iteration than {base_nodes} nodes ({t_ms:.1f} > {t0_ms:.1f} ms)")
    if cv is not None and cv > NOISE_CV:
        out.append(f"noisy iteration time (std/mean={cv:.2f})")
    if scaling == "strong" and gbs and base_gbs and gbs != base_gbs:
        out.append(f"gbs {gbs} differs from baseline {base_gbs} in a strong-scaling study")
    return out


def interp(curve: list[tuple[float, float]], x: float) -> float | None:
    """Linear interpolation of y at x on a curve sorted by x; None outside its range."""
    if not curve or x < curve[0][0] or x > curve[-1][0]:
        return None
    lo, hi = 0, len(curve) - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if curve[mid][0] <= x:
            lo = mid
        else:
            hi = mid
    (x0, y0), (x1, y1) = curve[lo], curve[hi]
    if x1 == x0 or x == x0:
        return y0
    if x == x1:
        return y1
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


@dataclass(frozen=True)
class Parity:
    samples: list[float]  # consumed-sample points compared
    loss: list[float | None]
    baseline_loss: list[float | None]
    max_abs_diff: float | None
    max_rel_diff: float | None


def parity_points(curves: list[list[tuple[float, float]]], n: int = 4) -> list[float]:
    """n evenly spaced consumed-sample counts inside the range every curve covers (ends included)."""
    curves = [c for c in curves if c]
    if not curves:
        return []
    lo = max(c[0][0] for c in curves)
    hi = min(c[-1][0] for c in curves)
    if hi < lo:
        return []
    if hi == lo:
        return [float(hi)]
    return [lo + (hi - lo) * (i + 1) / n for i in range(n)]


def loss_parity(
    curve: list[tuple[float, float]], base: list[tuple[float, float]], points: list[float]
) -> Parity:
    ys = [interp(curve, s) for s in points]
    bs = [interp(base, s) for s in points]
    diffs = [
        (y - b, (y - b) / abs(b) if b else None) for y, b in zip(ys, bs) if y is not None and b is not None
    ]
    mad = max((abs(d) for d, _ in diffs), default=None)
    mrd = max((abs(r) for _, r in diffs if r is not None), default=None)
    return Parity(points, ys, bs, mad, mrd)


def iteration_s(t_median_ms: float | None) -> float | None:
    """A run's seconds per iteration: its steady-state median (None: it has no steady-state window). What
    a prediction is set beside (report/predicted.py, report/steptimes.py)."""
    return t_median_ms / 1000.0 if t_median_ms else None

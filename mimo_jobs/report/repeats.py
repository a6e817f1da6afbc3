"""Runs that differ only in their repeat index, aggregated: the mean of their steady-state iteration times
and per-GPU throughputs, the spread (max - min) and a 95% confidence interval of each mean; a layout whose
interval overlaps another layout's of the same study and node count cannot be ranked against it. Pure."""

from __future__ import annotations

import math
import re
from collections import defaultdict

from . import fmt
from .model import RepeatRow, RunRow

# Student's t, two-sided 95% (0.975 quantile), by degrees of freedom 1..10; beyond, the normal's 1.96 is
# within 2.5% of it (standard tables, e.g. NIST/SEMATECH e-Handbook of Statistical Methods, 1.3.6.7.2).
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)


def t975(df: int) -> float:
    return _T975[df - 1] if df <= len(_T975) else 1.96


def _mean_ci(vals: list[float]) -> tuple[float, float | None, float]:
    """(mean, 95% half-width (None for one value), spread max - min)."""
    n = len(vals)
    mean = sum(vals) / n
    if n < 2:
        return mean, None, 0.0
    sd = math.sqrt(sum((v - mean) ** 2 for v in vals) / (n - 1))
    return mean, t975(n - 1) * sd / math.sqrt(n), max(vals) - min(vals)


def base_name(r: RunRow) -> str:
    return re.sub(r"-r\d+$", "", r.name) if r.repeat is not None else r.name


def repeat_rows(rows: list[RunRow]) -> list[RepeatRow]:
    groups: dict[tuple, list[RunRow]] = defaultdict(list)
    for r in rows:
        if r.repeat is not None and r.t_median_ms is not None:
            groups[(r.study, base_name(r))].append(r)  # the name holds the layout, GBS, mbs and command
    out = []
    for (study, name), rs in groups.items():
        if len(rs) < 2:
            continue
        metric = fmt.metric_of(rs)
        t = _mean_ci([r.t_median_ms for r in rs])
        perfs = [fmt.per_gpu(r, metric) for r in rs]
        p = _mean_ci(perfs) if None not in perfs else (None, None, None)
        out.append(RepeatRow(study, rs[0].nodes, name, len(rs), *t, metric, *p))
    _flag_overlaps(out)
    return out


def _flag_overlaps(out: list[RepeatRow]) -> None:
    """A layout whose throughput interval overlaps another's (same study, node count, metric) cannot be
    ranked against it: their difference is within the repeats' spread."""
    for a in out:
        for b in out:
            if (
                a is b
                or (a.study, a.nodes, a.metric) != (b.study, b.nodes, b.metric)
                or None in (a.perf_mean, b.perf_mean)
            ):
                continue
            if abs(a.perf_mean - b.perf_mean) < (a.perf_ci95 or 0.0) + (b.perf_ci95 or 0.0):
                a.flags.append(f"cannot rank against {b.name}: 95% intervals overlap")

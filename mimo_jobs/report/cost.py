"""What runs cost: GPU-hours and node-hours from the elapsed times of their jobs (every attempt), GPU-hours
per billion carried tokens, and the time and GPU-hours to a token budget at the measured carried rate. Pure:
rows and sums in, figures set on the rows."""

from __future__ import annotations

import re

from .model import RunRow, StudyInfo

_SUFFIX = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "G": 10**9, "T": 10**12}


def parse_tokens(text: str) -> float:
    """A token count as written by people: 1T, 500B, 2.5e12, 300M. ValueError when it is not one."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([KMBGT]?)\s*", text or "", flags=re.I)
    if not m:
        raise ValueError(f"{text!r} is not a token count (e.g. 1T, 500B, 2.5e12)")
    n = float(m.group(1)) * _SUFFIX[m.group(2).upper()]
    if not 0 < n < 1e18:
        raise ValueError(f"{text!r}: give a positive token count below 1e18")
    return n


def tokens_text(n: float) -> str:
    """A token count the way parse_tokens reads it: 1e12 -> "1T", 5e11 -> "500B"."""
    for suffix, scale in (("T", 10**12), ("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if n >= scale:
            return f"{n / scale:.4g}{suffix}"
    return f"{n:.4g}"


def apply(
    rows: list[RunRow],
    infos: list[StudyInfo],
    jobs: dict[str, tuple[float, int, int]],
    carried: dict[str, int],
    budget: float | None,
) -> None:
    for r in rows:
        secs, _, left = jobs.get(r.run_id, (0.0, 0, 0))
        r.jobs_uncosted = left
        if r.run_id in jobs and r.gpus:
            r.gpu_hours = secs / 3600 * r.gpus
            r.node_hours = secs / 3600 * r.nodes if r.nodes else None
            tok = carried.get(r.run_id)
            if tok:
                r.gpu_hours_per_billion_tokens = r.gpu_hours / (tok / 1e9)
        if budget and r.tokens_per_s:
            r.budget_hours = budget / r.tokens_per_s / 3600
            r.budget_gpu_hours = r.budget_hours * r.gpus if r.gpus else None
    for s in infos:
        mine = [r for r in rows if r.study == s.name and r.gpu_hours is not None]
        if mine:
            s.gpu_hours = sum(r.gpu_hours for r in mine)
            s.node_hours = sum(r.node_hours or 0.0 for r in mine)

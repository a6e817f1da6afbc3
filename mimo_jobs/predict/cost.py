"""What training costs in GPU time: the one rule `predict`, `plan` and `report --tokens` share. Elapsed
seconds times the job's GPUs (GPU-hours) and nodes (node-hours); the time to a token budget is the budget
over the carried tokens per second (tokens the batch really holds, not its padding: the report's
convention). Pure: numbers in, numbers out."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

_SUFFIX = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "G": 10**9, "T": 10**12}


@dataclass(frozen=True)
class Cost:
    hours: float  # wall-clock hours
    gpu_hours: float
    node_hours: float

    def to_json(self) -> dict:
        return {"hours": self.hours, "gpu_hours": self.gpu_hours, "node_hours": self.node_hours}


def cost_of(seconds: float, gpus: int, nodes: float) -> Cost:
    """`seconds` of a job holding `gpus` GPUs on `nodes` nodes."""
    hours = seconds / 3600
    return Cost(hours, hours * gpus, hours * nodes)


def to_budget(tokens: float, carried_tokens_per_s: float, gpus: int, nodes: float) -> Cost | None:
    """The cost of training on `tokens` carried tokens at `carried_tokens_per_s` (None without a rate)."""
    if not carried_tokens_per_s or carried_tokens_per_s <= 0:
        return None
    return cost_of(tokens / carried_tokens_per_s, gpus, nodes)


def iterations_of(train_iters: int | None, train_samples: int | None, gbs: int) -> int:
    """The iterations of a run that trains `train_iters` iterations or `train_samples` samples (the last
    global batch counts whole, as the trainer runs it)."""
    if train_iters is not None:
        return train_iters
    return math.ceil((train_samples or 0) / gbs)


def gpu_hours_text(h: float) -> str:
    """Hours as people read them: whole above 100 (17,509), three significant digits below (0.0132)."""
    return f"{h:,.0f}" if h >= 100 else f"{h:.3g}"


def parse_tokens(text: str) -> float:
    """A token count as written by people: 1T, 500B, 2.5e12, 300M. ValueError when it is not one."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([KMBGT]?)\s*", text or "", flags=re.I)
    if not m:
        raise ValueError(f"{text!r} is not a token count (e.g. 1T, 500B, 2.5e12)")
    n = float(m.group(1)) * _SUFFIX[m.group(2).upper()]
    if not 1 <= n < 1e18:  # a budget is whole tokens: 1e-300 is no budget at all
        raise ValueError(f"{text!r}: give a token count of at least 1 and below 1e18")
    return n


def tokens_text(n: float) -> str:
    """A token count the way parse_tokens reads it: 1e12 -> "1T", 5e11 -> "500B"."""
    for suffix, scale in (("T", 10**12), ("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if n >= scale:
            return f"{n / scale:.4g}{suffix}"
    return f"{n:.4g}"

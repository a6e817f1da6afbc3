"""Learning-rate schedules by consumed samples (pure; no torch).

lr(s) for s = samples consumed before the step:
  warmup   s < W: max * s / W  (linear from 0, as Megatron)
  constant max
  cosine   min + (max-min) * 0.5 * (1 + cos(pi * p)),   p = (s-W)/(D-W) clipped to [0, 1]
  linear   min + (max-min) * (1 - p)
  wsd      max until D - Dw, then decay to min over the last Dw samples with style
           minus_sqrt: 1 - sqrt(q); linear: 1 - q; cosine: 0.5 * (1 + cos(pi q)); exponential: (min/max)^q
where D = decay_samples (default: the run's total samples), Dw = wsd_decay_samples, q the decay progress.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mimo_jobs.study.lr_rules import decay_end, warmup_problem  # the rules validate checks too


@dataclass(frozen=True)
class LRSchedule:
    style: str  # constant | cosine | linear | wsd
    max_lr: float
    min_lr: float
    warmup_samples: int
    decay_samples: int  # end of decay (samples from the start)
    wsd_decay_samples: int = 0
    wsd_decay_style: str = "minus_sqrt"

    def __post_init__(self):
        if self.style not in ("constant", "cosine", "linear", "wsd"):
            raise ValueError(f"unknown lr schedule {self.style!r}")
        if self.style == "wsd" and self.wsd_decay_style not in (
            "minus_sqrt",
            "linear",
            "cosine",
            "exponential",
        ):
            raise ValueError(f"unknown wsd decay style {self.wsd_decay_style!r}")
        bad = warmup_problem(self.style, self.warmup_samples, self.decay_samples)
        if bad:
            raise ValueError(f"{bad[0]}; {bad[1]}")

    def __call__(self, samples: int) -> float:
        mx, mn, w = self.max_lr, self.min_lr, self.warmup_samples
        if w > 0 and samples < w:
            return mx * samples / w
        if self.style == "constant":
            return mx
        d = self.decay_samples
        if samples >= d:
            return mn
        if self.style in ("cosine", "linear"):
            p = (samples - w) / max(1, d - w)
            f = 0.5 * (1 + math.cos(math.pi * p)) if self.style == "cosine" else 1 - p
            return mn + (mx - mn) * f
        # wsd: stable at max, then the final wsd_decay_samples decay
        start = d - self.wsd_decay_samples
        if samples < start:
            return mx
        q = (samples - start) / max(1, self.wsd_decay_samples)
        style = self.wsd_decay_style
        if style == "minus_sqrt":
            f = 1 - math.sqrt(q)
        elif style == "linear":
            f = 1 - q
        elif style == "cosine":
            f = 0.5 * (1 + math.cos(math.pi * q))
        else:  # exponential to min (min must be > 0 to reach it; 0 -> decays to ~0 over the phase)
            ratio = mn / mx if mn > 0 else 1e-8
            return mx * ratio**q
        return mn + (mx - mn) * f


def from_spec(lr, total_samples: int) -> LRSchedule:
    """Build from study.LRSpec; decay defaults to the whole run."""
    return LRSchedule(
        style=lr.schedule,
        max_lr=lr.max,
        min_lr=lr.min,
        warmup_samples=lr.warmup_samples,
        decay_samples=decay_end(lr.decay_samples, total_samples),
        wsd_decay_samples=lr.wsd_decay_samples or 0,
        wsd_decay_style=lr.wsd_decay_style,
    )

"""Benchmark hook: with MIMO_JOBS_TRAINER_PROFILE=<dir>, every rank writes <dir>/<mode>-rank-<r>.json with its
role, per-phase seconds summed over the iterations after the first (warm-up), and its peak RSS. The peaks of
saved activations and in-flight microbatches are kept on every run (the memory facts read them)."""

from __future__ import annotations

import json
import os
import resource
from pathlib import Path

import torch.distributed as dist

PROFILE_ENV = "MIMO_JOBS_TRAINER_PROFILE"


class RankProfile:
    def __init__(self):
        self.dir = os.environ.get(PROFILE_ENV)
        self.n = 0
        self.elapsed = 0.0
        self.phases: dict[str, float] = {}
        self.saved_peak = 0  # over every step, always kept (the memory facts)
        self.inflight_peak = 0

    def add(self, stats) -> None:
        self.saved_peak = max(self.saved_peak, stats.saved_peak_bytes)
        self.inflight_peak = max(self.inflight_peak, stats.inflight_peak)
        if self.dir and stats.iteration > 1:
            self.n += 1
            self.elapsed += stats.elapsed_s
            for k, v in stats.phases_s.items():
                self.phases[k] = self.phases.get(k, 0.0) + v

    def write(self, st, mode: str) -> None:
        """The rank's profile file (`mode`: reference, colocated or hetero)."""
        if not self.dir:
            return
        rank = dist.get_rank()
        out = {
            "rank": rank,
            "mode": mode,
            "modules": list(st.role.modules),
            "iterations": self.n,
            "elapsed_s": self.elapsed,
            "phases_s": self.phases,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "saved_activation_peak_bytes": self.saved_peak,
            "inflight_peak": self.inflight_peak,
        }
        Path(self.dir).mkdir(parents=True, exist_ok=True)
        (Path(self.dir) / f"{mode}-rank-{rank}.json").write_text(json.dumps(out))

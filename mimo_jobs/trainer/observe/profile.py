"""Every rank's own phase timers, kept on every run: per-phase seconds and wall time summed over the iterations
its job runs after its first (the warm-up: graph building, allocator growth), and the peaks of saved
activations and in-flight microbatches. They go into the rank's memory facts (`facts`, read by ingest into
rank_memory). Benchmark hook: with MIMO_JOBS_TRAINER_PROFILE=<dir>, every rank also writes
<dir>/<mode>-rank-<r>.json with its role, those sums and its peak RSS."""

from __future__ import annotations

import json
import os
import resource
from pathlib import Path

import torch.distributed as dist

PROFILE_ENV = "MIMO_JOBS_TRAINER_PROFILE"


def role_of(st) -> str:
    """What this rank runs, as contract.memory.ROLES names it (its stage is the facts' pp_rank)."""
    if st.reference or st.plan.layout.colocated:
        return "colocated"
    return "encoder" if not st.role.is_language else "llm"


class RankProfile:
    def __init__(self):
        self.dir = os.environ.get(PROFILE_ENV)
        self.first: int | None = None  # the job's first iteration (its warm-up, not summed)
        self.n = 0
        self.elapsed = 0.0
        self.phases: dict[str, float] = {}
        self.saved_peak = 0  # over every step (the memory facts)
        self.inflight_peak = 0

    def add(self, stats) -> None:
        self.saved_peak = max(self.saved_peak, stats.saved_peak_bytes)
        self.inflight_peak = max(self.inflight_peak, stats.inflight_peak)
        if self.first is None:
            self.first = stats.iteration
            return
        self.n += 1
        self.elapsed += stats.elapsed_s
        for k, v in stats.phases_s.items():
            self.phases[k] = self.phases.get(k, 0.0) + v

    def facts(self, st) -> dict:
        """The timing fields of the rank's memory facts (contract.memory.MemoryFacts)."""
        return {
            "role": role_of(st),
            "timed_iterations": self.n,
            "elapsed_s": self.elapsed,
            "phases_s": dict(self.phases),
        }

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

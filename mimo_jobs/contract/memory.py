"""The memory-facts record: what one rank measured it holds, written by the trainer to
`<run dir>/memory/rank-<r>.json` (trainer/observe/memory.py) and read by ingest into `rank_memory`. It also
carries the rank's own phase timers (trainer/observe/profile.py): what it runs (ROLES), and its per-phase
seconds and wall time summed over the iterations its job ran after its first (the warm-up), so the report
can show how busy or idle each module's ranks were.

Torch-free. `to_json` and `from_json` are the file's one format; `from_json` names the field that is
missing or not a number.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .iteration import PHASES

MEMORY_DIR = "memory"  # under the run directory
MODULE_FIELDS = ("params", "param_bytes", "grad_buffer_bytes", "optimizer_state_bytes")
# what a rank runs: the encoder only, one LLM pipeline stage only (its pp_rank), or both (colocated layout)
ROLES = ("encoder", "llm", "colocated")
# rank_memory's columns of the timing fields (SQL types): the one list the store's table is created with
# and ingest writes; each phase as `<phase>_s`
PHASE_SECONDS = {p: f"{p}_s" for p in PHASES}
TIMING_COLUMNS: dict[str, str] = {
    "role": "VARCHAR",
    "timed_iterations": "INTEGER",
    "elapsed_s": "DOUBLE",
    **{c: "DOUBLE" for c in PHASE_SECONDS.values()},
}
_OPTIONAL = (
    "cuda_max_allocated_bytes",
    "cuda_max_reserved_bytes",
    "role",
    "timed_iterations",
    "elapsed_s",
    "phases_s",
)


@dataclass(frozen=True)
class ModuleMemory:
    """What one module (an encoder module, language) holds on the rank after sharding."""

    params: int
    param_bytes: int
    grad_buffer_bytes: int
    optimizer_state_bytes: int = 0
    # what autograd kept for backward of this module's forward, at its peak over the run (None: written
    # before the trainer measured it per module; the rank's own figure is MemoryFacts')
    saved_activation_peak_bytes: int | None = None


@dataclass(frozen=True)
class MemoryFacts:
    rank: int
    modules: dict[str, ModuleMemory] = field(default_factory=dict)  # by module name
    saved_activation_peak_bytes: int = 0  # autograd's saved tensors at their peak
    inflight_peak: int = 0  # microbatches awaiting their backward at once, at most
    iteration: int | None = None  # when the facts were taken
    tp_rank: int | None = None
    pp_rank: int | None = None
    dp_rank: int | None = None
    cuda_max_allocated_bytes: int | None = None  # the CUDA allocator's peaks (GPU runs only)
    cuda_max_reserved_bytes: int | None = None
    role: str | None = None  # one of ROLES (None: written before the trainer recorded it)
    timed_iterations: int | None = None  # the iterations the sums below cover (after the job's first)
    elapsed_s: float | None = None  # their wall time, summed
    phases_s: dict[str, float] | None = None  # phase (contract.iteration.PHASES) -> seconds, summed

    def to_json(self) -> dict:
        out = asdict(self)
        for k in _OPTIONAL:
            if out[k] is None:
                del out[k]  # not measured (a CPU run has no CUDA peaks): the file has no such key
        for m in out["modules"].values():
            if m["saved_activation_peak_bytes"] is None:
                del m["saved_activation_peak_bytes"]
        return out

    @classmethod
    def from_json(cls, d: object) -> MemoryFacts:
        """The record of a parsed file; ValueError naming the field that is missing or not a number."""
        if not isinstance(d, dict) or not isinstance(d.get("modules"), dict):
            raise ValueError("expected an object with 'rank' and 'modules'")
        modules = {}
        for name, m in d["modules"].items():
            if not isinstance(m, dict):
                raise ValueError(f"modules.{name}: expected an object")
            modules[str(name)] = ModuleMemory(
                *(
                    _count(m, k, f"modules.{name}.", required=k != "optimizer_state_bytes") or 0
                    for k in MODULE_FIELDS
                ),
                saved_activation_peak_bytes=_count(
                    m, "saved_activation_peak_bytes", f"modules.{name}.", required=False
                ),
            )
        return cls(
            rank=_count(d, "rank"),
            modules=modules,
            saved_activation_peak_bytes=_count(d, "saved_activation_peak_bytes"),
            inflight_peak=_count(d, "inflight_peak", required=False) or 0,
            iteration=_count(d, "iteration", required=False),
            tp_rank=_count(d, "tp_rank", required=False),
            pp_rank=_count(d, "pp_rank", required=False),
            dp_rank=_count(d, "dp_rank", required=False),
            cuda_max_allocated_bytes=_count(d, "cuda_max_allocated_bytes", required=False),
            cuda_max_reserved_bytes=_count(d, "cuda_max_reserved_bytes", required=False),
            role=_role(d.get("role")),
            timed_iterations=_count(d, "timed_iterations", required=False),
            elapsed_s=_seconds(d.get("elapsed_s"), "elapsed_s"),
            phases_s=_phases(d.get("phases_s")),
        )


def rank_phase_seconds(phases: dict[str, float], encoders: Iterable[str]) -> dict[str, float]:
    """The rank's seconds per phase of contract.iteration.PHASES from its timers (`phases_s`). A rank of
    several encoder modules times each module's forward and backward under its name (`vision_fwd`,
    `audio_bwd`: trainer/step); they count to `enc_fwd`/`enc_bwd`, the encoder modules' forward and backward
    on the rank (`encoders`: the study's names of the encoder modules it runs)."""
    out = {p: phases.get(p, 0.0) for p in PHASES}
    for name in encoders:
        for side in ("fwd", "bwd"):
            out[f"enc_{side}"] += phases.get(f"{name}_{side}", 0.0)
    return out


def facts_path(run_dir: Path, rank: int) -> Path:
    """Where a rank's facts live in its run directory."""
    return Path(run_dir) / MEMORY_DIR / f"rank-{rank:05d}.json"


def _count(d: dict, key: str, where: str = "", required: bool = True) -> int | None:
    """A whole, non-negative number field (bool is not one); None when absent and not required."""
    v = d.get(key)
    if v is None:
        if required:
            raise ValueError(f"{where}{key}: missing")
        return None
    whole = isinstance(v, int) or (isinstance(v, float) and math.isfinite(v) and v.is_integer())
    if isinstance(v, bool) or not whole or v < 0:
        raise ValueError(f"{where}{key}: expected a whole number >= 0, got {v!r}")
    return int(v)


def _role(v: object) -> str | None:
    if v is None or v in ROLES:
        return v
    raise ValueError(f"role: expected one of {', '.join(ROLES)}, got {v!r}")


def _seconds(v: object, where: str) -> float | None:
    """A finite number of seconds >= 0 (bool is not one); None when absent."""
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise ValueError(f"{where}: expected a number of seconds >= 0, got {v!r}")
    return float(v)


def _phases(v: object) -> dict[str, float] | None:
    """Phase name -> seconds. Every phase is kept (a newer trainer may time one this version does not know:
    ingest stores the ones it has columns for)."""
    if v is None:
        return None
    if not isinstance(v, dict):
        raise ValueError(f"phases_s: expected an object of phase -> seconds, got {type(v).__name__}")
    return {str(k): _seconds(x, f"phases_s.{k}") for k, x in v.items()}

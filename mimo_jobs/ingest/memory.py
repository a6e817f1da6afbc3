"""Per-rank memory facts (`<run dir>/memory/rank-<r>.json`, written by the trainer) into `rank_memory`.

The record is contract.memory.MemoryFacts. One row per run, rank and module the rank runs (a colocated rank
runs every module), the module under the study's name (`vision`, `audio`, `llm`: contract/modules.py turns
the trainer's slot names into them) with its own activation peak where the trainer measured it; the rank's
own figures (activation peak, role, phase timers) are on each of its rows, a several-encoder rank's
per-module forward and backward counted to the encoder phases (contract.memory.rank_phase_seconds). A file
whose modification time is the one stored is not read again; a file that is not valid JSON of the expected
shape is a problem of the ingest, named with its path, and leaves the run's other rows as they were.
Phases a newer trainer times that contract.iteration.PHASES does not name are not stored.
"""

from __future__ import annotations

import json
from pathlib import Path

from mimo_jobs.contract.memory import (
    MEMORY_DIR,
    PHASE_SECONDS,
    TIMING_COLUMNS,
    MemoryFacts,
    rank_phase_seconds,
)
from mimo_jobs.contract.modules import LLM, study_name

from .discover import IngestError

_COLUMNS = (
    "run_id, rank, module, tp_rank, pp_rank, dp_rank, iteration, params, param_bytes, grad_buffer_bytes, "
    "optimizer_state_bytes, saved_activation_peak_bytes, module_saved_activation_peak_bytes, inflight_peak, "
    "cuda_max_allocated_bytes, cuda_max_reserved_bytes, source_file, mtime, " + ", ".join(TIMING_COLUMNS)
)
_N_COLUMNS = _COLUMNS.count(",") + 1


def memory_files(run_dir: Path) -> list[Path]:
    d = Path(run_dir) / MEMORY_DIR
    return sorted(p for p in d.glob("rank-*.json") if p.is_file()) if d.is_dir() else []


def rows_of(facts: MemoryFacts, run_id: str, source: str, mtime: float) -> list[tuple]:
    """The rank_memory rows of one rank's facts (pure: tested without a store)."""
    modules = {study_name(slot): m for slot, m in facts.modules.items()}
    if facts.phases_s is None:
        phases = dict.fromkeys(PHASE_SECONDS)
    else:
        phases = rank_phase_seconds(facts.phases_s, [n for n in modules if n != LLM])
    timing = (facts.role, facts.timed_iterations, facts.elapsed_s, *(phases[p] for p in PHASE_SECONDS))
    return [
        (
            run_id,
            facts.rank,
            module,
            facts.tp_rank,
            facts.pp_rank,
            facts.dp_rank,
            facts.iteration,
            m.params,
            m.param_bytes,
            m.grad_buffer_bytes,
            m.optimizer_state_bytes,
            facts.saved_activation_peak_bytes,
            m.saved_activation_peak_bytes,
            facts.inflight_peak,
            facts.cuda_max_allocated_bytes,
            facts.cuda_max_reserved_bytes,
            source,
            mtime,
            *timing,
        )
        for module, m in sorted(modules.items())
    ]


def store_memory(con, run_dir: Path, run_id: str) -> tuple[int, list[str]]:
    """Store the run's memory files that changed since the last ingest. Returns (rows written, problems)."""
    known = dict(
        con.execute(
            "SELECT source_file, max(mtime) FROM rank_memory WHERE run_id = ? GROUP BY 1", [run_id]
        ).fetchall()
    )
    written, problems = 0, []
    for path in memory_files(run_dir):
        src, mtime = str(path.resolve()), path.stat().st_mtime
        if known.get(src) == mtime:
            continue
        try:
            rows = rows_of(_read(path), run_id, src, mtime)
        except IngestError as e:
            problems.append(str(e))
            continue
        con.execute("DELETE FROM rank_memory WHERE run_id = ? AND source_file = ?", [run_id, src])
        con.executemany(
            f"INSERT OR REPLACE INTO rank_memory ({_COLUMNS}) VALUES ({', '.join('?' * _N_COLUMNS)})", rows
        )
        written += len(rows)
    return written, problems


def _read(path: Path) -> MemoryFacts:
    try:
        return MemoryFacts.from_json(json.loads(path.read_text()))
    except (OSError, ValueError) as e:
        raise IngestError(f"{path}: not a memory facts file ({e})") from None

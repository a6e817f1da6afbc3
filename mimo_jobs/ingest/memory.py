"""Per-rank memory facts (`<run dir>/memory/rank-<r>.json`, written by the trainer) into `rank_memory`.

One row per run, rank and module the rank runs (a colocated rank runs both). A file whose modification time
is the one stored is not read again; a file that is not valid JSON of the expected shape is a problem of
the ingest, named with its path, and leaves the run's other rows as they were.
"""

from __future__ import annotations

import json
from pathlib import Path

from .discover import IngestError

MEMORY_DIR = "memory"
_COLUMNS = (
    "run_id, rank, module, tp_rank, pp_rank, dp_rank, iteration, params, param_bytes, grad_buffer_bytes, "
    "optimizer_state_bytes, saved_activation_peak_bytes, inflight_peak, cuda_max_allocated_bytes, "
    "cuda_max_reserved_bytes, source_file, mtime"
)


def memory_files(run_dir: Path) -> list[Path]:
    d = Path(run_dir) / MEMORY_DIR
    return sorted(p for p in d.glob("rank-*.json") if p.is_file()) if d.is_dir() else []


def rows_of(facts: dict, run_id: str, source: str, mtime: float) -> list[tuple]:
    """The rank_memory rows of one rank's facts (pure: tested without a store)."""
    rank = int(facts["rank"])
    out = []
    for module, m in sorted(facts["modules"].items()):
        out.append(
            (
                run_id,
                rank,
                module,
                facts.get("tp_rank"),
                facts.get("pp_rank"),
                facts.get("dp_rank"),
                facts.get("iteration"),
                int(m["params"]),
                int(m["param_bytes"]),
                int(m["grad_buffer_bytes"]),
                int(m["optimizer_state_bytes"]),
                int(facts["saved_activation_peak_bytes"]),
                int(facts.get("inflight_peak", 0)),
                facts.get("cuda_max_allocated_bytes"),
                facts.get("cuda_max_reserved_bytes"),
                source,
                mtime,
            )
        )
    return out


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
            f"INSERT OR REPLACE INTO rank_memory ({_COLUMNS}) VALUES ({', '.join('?' * 17)})", rows
        )
        written += len(rows)
    return written, problems


def _read(path: Path) -> dict:
    try:
        facts = json.loads(path.read_text())
        if not isinstance(facts, dict) or not isinstance(facts.get("modules"), dict):
            raise ValueError("expected an object with 'rank' and 'modules'")
        rows_of(facts, "", "", 0.0)  # every field the rows need is there and numeric
        return facts
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise IngestError(f"{path}: not a memory facts file ({e})") from None

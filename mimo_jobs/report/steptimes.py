"""Each run's measured seconds per iteration from a store, as the report measures them (figures.iteration_s:
its steady-state median): what `predict --db` calibrates against and what benchmarks/gpu/ops_check.py sets
beside its predictions."""

from __future__ import annotations

from pathlib import Path

from .build import build
from .figures import iteration_s


def measured_iteration_s(db: Path, study: str) -> dict[str, float]:
    """run_id -> seconds per iteration of each run of `study` that has them, from the store at `db` opened
    read-only (empty without a store: nothing was measured)."""
    if not Path(db).exists():
        return {}
    from mimo_jobs.store.connection import connect

    con = connect(db, read_only=True)
    try:
        runs = build(con, study).runs
    finally:
        con.close()
    return {r.run_id: s for r in runs if (s := iteration_s(r.t_median_ms)) is not None}

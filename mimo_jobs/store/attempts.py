"""Which run of a study's point is its latest attempt, and which earlier runs it supersedes.

A fix-and-resubmit changes the study file, so the resubmitted run gets a new run id (a hash of its config)
under the same name: the store then holds both. The later one supersedes the earlier: status shows the
earlier as superseded, and the exit code of `submit --wait`, the report's tables, `compare` and the
planner's calibration read the latest attempt of each point only. This module is the one rule for that.

Only runs rendered from a study's matrix count (`runs.idx` set): their name encodes the point, so the same
name is the same point. Runs known only from their logs keep a file's name, which says nothing of a point.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

# What the name encodes (study/expand.run_name): a run of another layout is another point, whatever its name.
POINT_COLUMNS = (
    "study",
    "name",
    "nodes",
    "enc_tp",
    "enc_pp",
    "enc_dp",
    "llm_tp",
    "llm_pp",
    "llm_ep",
    "llm_dp",
    "gbs",
    "mbs",
    "colocated",
    "repeat",
)


@dataclass(frozen=True)
class Attempt:
    run_id: str
    point: tuple  # the POINT_COLUMNS values
    at: datetime | None  # when it was last submitted (its newest job), else when the store first saw it


def superseding(attempts: list[Attempt]) -> dict[str, str]:
    """run id -> the run id of the latest attempt of its point, for every run a later one supersedes. The
    latest is the one submitted last (ties: the larger run id, so the answer never depends on row order)."""
    latest: dict[tuple, Attempt] = {}
    for a in attempts:
        cur = latest.get(a.point)
        if cur is None or (a.at or datetime.min, a.run_id) > (cur.at or datetime.min, cur.run_id):
            latest[a.point] = a
    return {a.run_id: latest[a.point].run_id for a in attempts if latest[a.point].run_id != a.run_id}


def superseded(con, study: str | None = None) -> dict[str, str]:
    """The store's superseded runs (of one study, or of all): run id -> the run id that supersedes it."""
    cols = ", ".join(f"r.{c}" for c in ("run_id", *POINT_COLUMNS, "created_at"))
    rows = con.execute(
        f"""SELECT {cols}, max(j.submit_time) FROM runs r LEFT JOIN jobs j ON j.run_id = r.run_id
            WHERE r.idx IS NOT NULL{" AND r.study = ?" if study else ""}
            GROUP BY {cols}""",
        [study] if study else [],
    ).fetchall()
    # a run's newest job says when it was submitted; created_at only when it has none (ingest writes the
    # row when it first reads a run dir, which may be long after the run, in any order)
    return superseding([Attempt(r[0], tuple(r[1:-2]), r[-1] or r[-2]) for r in rows])

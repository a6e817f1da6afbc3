"""Which run of a study's point is its latest attempt, which earlier runs it supersedes, and what a submit
of a run that already completed does. Submit, ingest, status and the report all ask this module.

A fix-and-resubmit changes the study file, so the resubmitted run gets a new run id (a hash of its config)
under the same name: the store then holds both. The one the study named last supersedes the others: status
shows them as superseded, and the exit code of `submit --wait`, the report's tables, `compare` and the
planner's calibration read the latest attempt of each point only.

"Named last" is read from the run directories, never from a store's own clock: every submit of a study
appends to each run it names a line to that run's `submissions.jsonl` (contract/submissions.py), whether it
starts a job of the run or keeps the one it has. So reverting a study to a config that already completed
and submitting it makes the completed run (same config, same run id) the latest again, without running it
twice; and a store rebuilt from the runs root by `ingest` orders the attempts as the store that submitted
them did (`runs.named_at` is a copy of the run directory's record). A run directory written before this
record existed falls back to its newest job's submit time, then to when the store first saw the run.

A completed run is never run again: its job would resume at its last iteration, train nothing, and replace
the memory and phase timings it measured. To measure a point again, the study must say so (another repeat,
or a changed config: a new run id, a directory of its own); `submit --force` says so.

Only runs rendered from a study's matrix count (`runs.idx` set): their name encodes the point, so the same
name is the same point. Runs known only from their logs keep a file's name, which says nothing of a point.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from mimo_jobs.contract import submissions

# What the name encodes (study/expand.run_name): a run of another layout is another point, whatever its name.
# enc_*: the runs table's columns of a one-encoder run (the older form; NULL for several modules, whose
# sizes run_modules keeps and the name encodes).
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
    at: datetime | None  # when a submit last named it (named_at; fallbacks: see the module doc)


def superseding(attempts: list[Attempt]) -> dict[str, str]:
    """run id -> the run id of the latest attempt of its point, for every run a later one supersedes. The
    latest is the one named last (ties: the larger run id, so the answer never depends on row order)."""
    latest: dict[tuple, Attempt] = {}
    for a in attempts:
        cur = latest.get(a.point)
        if cur is None or (a.at or datetime.min, a.run_id) > (cur.at or datetime.min, cur.run_id):
            latest[a.point] = a
    return {a.run_id: latest[a.point].run_id for a in attempts if latest[a.point].run_id != a.run_id}


def superseded(con, study: str | None = None) -> dict[str, str]:
    """The store's superseded runs (of one study, or of all): run id -> the run id that supersedes it."""
    cols = ", ".join(f"r.{c}" for c in ("run_id", *POINT_COLUMNS, "named_at", "created_at"))
    rows = con.execute(
        f"""SELECT {cols}, max(j.submit_time) FROM runs r LEFT JOIN jobs j ON j.run_id = r.run_id
            WHERE r.idx IS NOT NULL{" AND r.study = ?" if study else ""}
            GROUP BY {cols}""",
        [study] if study else [],
    ).fetchall()
    # named_at comes from the run dir; a run dir from before that record: its newest job, then created_at
    # (ingest writes the row when it first reads a run dir, which may be long after the run, in any order)
    return superseding([Attempt(r[0], tuple(r[1:-3]), r[-3] or r[-1] or r[-2]) for r in rows])


def name_run(con, run_id: str, run_dir: str | Path, event: str, job=None) -> submissions.Entry:
    """A submit of the study named this run (`event` "submitted": with a new job; "kept": its job kept as it
    is; `job` a jobs_table.JobRow or None): the run directory's record gets the line first (it is the
    record), then the store its copy. The caller holds the run directory's lock for a submission."""
    entry = submissions.Entry(
        time.time(),
        event,
        getattr(job, "executor", None),
        getattr(job, "job_id", None),
        getattr(job, "attempt", None),
    )
    submissions.append(Path(run_dir), entry)
    if event in submissions.NAMED:
        con.execute("UPDATE runs SET named_at = ? WHERE run_id = ?", [submissions.as_utc(entry.time), run_id])
    return entry


def copy_named(con, run_id: str, run_dir: str | Path) -> None:
    """Ingest: the store's copy of when a submit last named the run, from its run directory (nothing when the
    directory has no record: a run dir from before it, or logs without one)."""
    at = submissions.named_at(submissions.read(Path(run_dir)))
    if at is not None:
        con.execute(
            "UPDATE runs SET named_at = ? WHERE run_id = ? AND named_at IS DISTINCT FROM ?", [at, run_id, at]
        )


def rerun_refused(name: str, run_id: str, job_id: str) -> str:
    """Why a completed run is not submitted again (--force), and what to do instead."""
    return (
        f"{name} ({run_id}) completed (job {job_id}) and is not run again: its job would resume at its last "
        "iteration, train nothing and replace the memory and phase timings it measured. To measure this "
        "point again, give it another repeat (the point's `repeats`) or change the study (a changed config is a "
        "new run id with a directory of its own); a failed or cancelled run is submitted again without --force"
    )

"""The jobs table: one row per scheduler job (a submission, a retry or a requeue of a run), its state as
the scheduler reports it, and what the policy decided when it ended. Its DDL is the store's (store/schema.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone

from mimo_jobs.contract import jobstates

ACTIVE_STATES = jobstates.ACTIVE
# Runs whose latest job is in one of these are not submitted again (unless --force).
KEEP_STATES = ACTIVE_STATES | jobstates.SUCCESS


def utcnow() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


@dataclass
class JobFacts:
    """A job as its executor reports it. Times are naive UTC."""

    job_id: str
    state: str
    exit_code: int | None = None
    submit_time: datetime | None = None
    start_time: datetime | None = None
    end_time: datetime | None = None
    node_list: str | None = None
    reason: str | None = None  # scheduler's reason (sacct Reason / local runner note)

    @property
    def active(self) -> bool:
        return jobstates.is_active(self.state)


@dataclass
class JobRow:
    run_id: str
    job_id: str
    executor: str
    attempt: int
    state: str
    reason: str | None
    exit_code: int | None
    submit_time: datetime | None
    start_time: datetime | None
    end_time: datetime | None
    node_list: str | None
    script_sha256: str | None
    action: str | None = None
    next_job_id: str | None = None
    first_error: str | None = None
    log_path: str | None = None
    extra: dict = field(default_factory=dict)

    @property
    def active(self) -> bool:
        return jobstates.is_active(self.state)

    def elapsed_s(self, now: datetime | None = None) -> float | None:
        if self.start_time is None:
            return None
        end = self.end_time or (now or utcnow())
        return max(0.0, (end - self.start_time).total_seconds())


_COLS = (
    "run_id, job_id, executor, attempt, state, reason, exit_code, submit_time, start_time, end_time, "
    "node_list, script_sha256, action, next_job_id, first_error, log_path"
)


def insert_job(
    con,
    run_id: str,
    job_id: str,
    executor: str,
    attempt: int,
    script_sha256: str | None,
    log_path: str | None,
    submit_time: datetime | None = None,
    state: str = "SUBMITTED",
) -> None:
    con.execute(
        f"INSERT INTO jobs ({_COLS}, updated_at) VALUES (?, ?, ?, ?, ?, NULL, NULL, ?, NULL, NULL, NULL, ?, "
        "NULL, NULL, NULL, ?, ?)",
        [
            run_id,
            job_id,
            executor,
            attempt,
            state,
            submit_time or utcnow(),
            script_sha256,
            log_path,
            utcnow(),
        ],
    )


def update_facts(con, run_id: str, f: JobFacts) -> None:
    """Record what the executor reports. The reason is its current one, replaced (a pending job's reason,
    such as SLURM's `Priority` or Kueue's quota, no longer holds once it runs); the policy writes the
    reason of an ended job when it settles it."""
    con.execute(
        """UPDATE jobs SET state = ?, exit_code = coalesce(?, exit_code), submit_time = coalesce(?, submit_time),
             start_time = coalesce(?, start_time), end_time = coalesce(?, end_time),
             node_list = coalesce(?, node_list), reason = ?, updated_at = ?
           WHERE run_id = ? AND job_id = ?""",
        [
            f.state,
            f.exit_code,
            f.submit_time,
            f.start_time,
            f.end_time,
            f.node_list,
            f.reason,
            utcnow(),
            run_id,
            f.job_id,
        ],
    )


def set_outcome(
    con,
    run_id: str,
    job_id: str,
    action: str,
    reason: str,
    first_err: str | None,
    next_job_id: str | None = None,
) -> None:
    con.execute(
        "UPDATE jobs SET action = ?, reason = ?, first_error = ?, next_job_id = ?, updated_at = ? "
        "WHERE run_id = ? AND job_id = ?",
        [action, reason, first_err, next_job_id, utcnow(), run_id, job_id],
    )


def _rows(con, where: str, params: list) -> list[JobRow]:
    cur = con.execute(f"SELECT {_COLS} FROM jobs WHERE {where} ORDER BY run_id, attempt, submit_time", params)
    return [JobRow(*r) for r in cur.fetchall()]


def jobs_of_run(con, run_id: str) -> list[JobRow]:
    return _rows(con, "run_id = ?", [run_id])


def latest_jobs(con, run_ids: list[str]) -> dict[str, JobRow]:
    """The newest job of each run (highest attempt)."""
    if not run_ids:
        return {}
    out: dict[str, JobRow] = {}
    for r in _rows(con, "run_id IN (SELECT unnest(?))", [run_ids]):
        out[r.run_id] = r  # ordered by attempt: the last one wins
    return out


def active_jobs(con) -> list[JobRow]:
    states = sorted(ACTIVE_STATES)
    return _rows(con, "state IN (SELECT unnest(?))", [states])


def unsettled_jobs(con) -> list[JobRow]:
    """Ended jobs the policy has not looked at yet (action IS NULL), e.g. after a crash mid-poll."""
    states = sorted(ACTIVE_STATES)
    return _rows(con, "action IS NULL AND state NOT IN (SELECT unnest(?))", [states])

"""What a sacct dump given to `mimo-jobs ingest` adds to the store: each job's row of the jobs table, and an
event for a scheduler verdict. The dump is read by the one sacct parser (mimo_jobs/submit/executors/sacct.py).
"""

from __future__ import annotations

from mimo_jobs.contract import jobstates
from mimo_jobs.submit.executors.slurm.sacct import SacctRecord

from .timestamps import store_text

_UPSERT_JOB = """
    INSERT INTO jobs (run_id, job_id, executor, attempt, state, reason, exit_code, start_time, end_time,
                      node_list, updated_at)
    VALUES (?, ?, 'slurm', ?, ?, ?, ?, ?, ?, ?, now())
    ON CONFLICT (run_id, job_id) DO UPDATE SET state = excluded.state,
      exit_code = coalesce(excluded.exit_code, jobs.exit_code),
      start_time = coalesce(excluded.start_time, jobs.start_time),
      end_time = coalesce(excluded.end_time, jobs.end_time),
      node_list = coalesce(excluded.node_list, jobs.node_list),
      reason = coalesce(jobs.reason, excluded.reason), updated_at = now()"""


def store_dump(con, records: list[SacctRecord], run_id: str, src: str, stage) -> None:
    """Each record becomes its job's row of the jobs table; a scheduler verdict (jobstates.EVENTS) is also staged
    as an event at the record's line of the dump (`src`)."""
    for i, r in enumerate(records):
        con.execute(
            _UPSERT_JOB,
            [run_id, r.job_id, r.restarts or 0, r.state, r.reason, r.exit_code, r.start, r.end, r.node_list],
        )
        kind = jobstates.EVENTS.get(r.state)
        if kind:
            msg = f"sacct: job {r.job_id} {r.state}" + (f" ({r.reason})" if r.reason else "")
            stage.event([run_id, r.job_id, None, None, store_text(r.end or r.start), kind, msg, src, i + 2])

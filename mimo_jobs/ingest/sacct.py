"""sacct output (`--parsable2`/`-P`: '|'-separated fields), for both of its readers:

- `parse_poll`: what the SLURM executor polls, `sacct -X -n -P -o <POLL_COLUMNS>` (no header). sacct ran
  here, so its local times are converted to UTC; a signal death's exit code reads as a shell's (128+signal).
- `parse_dump`: a sacct dump given to `mimo-jobs ingest` (`sacct -P` with its header row, any columns, or
  `--parsable` with a trailing '|'). It may come from another machine: times are kept as written; the exit
  code is the code part of "code:signal".
- `store_dump`: what a dump adds to the store (the jobs table, and an event for a scheduler verdict).

Both skip job steps (123.batch, 123.0): the allocation's own row carries the job's state. Light on purpose
(the SLURM executor imports it): nothing beyond the standard library.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

from .timestamps import find_time, store_text

POLL_COLUMNS = ("JobID", "State", "ExitCode", "Submit", "Start", "End", "NodeList", "Reason", "WorkDir")

# a job's final sacct state -> the event ingest records for it
SACCT_EVENT = {
    "TIMEOUT": "time_limit",
    "PREEMPTED": "preemption",
    "NODE_FAIL": "node_fail",
    "OUT_OF_MEMORY": "oom",
    "REQUEUED": "requeue",
}


@dataclass
class SacctRecord:
    job_id: str
    state: str  # the first word ("CANCELLED by 0" -> CANCELLED)
    exit_code: int | None
    start: datetime | None
    end: datetime | None
    node_list: str | None
    reason: str | None
    restarts: int | None
    submit: datetime | None = None
    work_dir: str | None = None


def _rows(lines, columns: list[str] | tuple[str, ...]):
    """{column: field text} of each allocation row (job steps and rows with too few fields skipped)."""
    for s in lines:
        f = s.rstrip("\n").split("|")
        if len(f) < len(columns):
            continue
        row = dict(zip(columns, f))
        jid = row["JobID"].strip()
        if not jid or "." in jid:
            continue
        row["JobID"] = jid
        yield row


def _state(text: str, default: str) -> str:
    return text.split()[0] if text.strip() else default


def _value(text: str, nulls: tuple[str, ...]) -> str | None:
    v = text.strip()
    return v if v and v not in nulls else None


# ----------------------------------------------------------------------------------------- polled


def controller_time(s: str) -> datetime | None:
    """A time printed by sacct/squeue on this machine (the controller's local time) as naive UTC."""
    s = s.strip()
    if not s or s in ("Unknown", "None", "N/A") or not s[0].isdigit():
        return None
    try:
        return datetime.fromisoformat(s).astimezone(timezone.utc).replace(tzinfo=None)
    except ValueError:
        return None


def _shell_exit_code(s: str) -> int | None:
    """sacct ExitCode is "code:signal"; a signal death is reported like a shell would (128 + signal)."""
    if ":" not in s:
        return None
    code, sig = s.split(":", 1)
    try:
        c, g = int(code), int(sig)
    except ValueError:
        return None
    return 128 + g if c == 0 and g else c


def parse_poll(text: str) -> list[SacctRecord]:
    """`sacct -X -n -P -o <POLL_COLUMNS>` output, in its order (with requeues a job id may appear twice: the
    later line is the newer)."""
    out = []
    for r in _rows(text.splitlines(), POLL_COLUMNS):
        out.append(
            SacctRecord(
                r["JobID"],
                _state(r["State"], "UNKNOWN"),
                _shell_exit_code(r["ExitCode"]),
                controller_time(r["Start"]),
                controller_time(r["End"]),
                _value(r["NodeList"], ("None assigned",)),
                _value(r["Reason"], ("None",)),
                None,
                submit=controller_time(r["Submit"]),
                work_dir=r["WorkDir"].strip(),
            )
        )
    return out


# ----------------------------------------------------------------------------------------- dumps


def parse_dump(lines: list[str]) -> list[SacctRecord]:
    """A sacct dump with its header row; unknown columns are ignored. ValueError when the header lacks
    JobID or State (not sacct output)."""
    if not lines:
        return []
    header = [h.strip() for h in lines[0].rstrip("\n").rstrip("|").split("|")]
    if "JobID" not in header or "State" not in header:
        raise ValueError(f"not sacct --parsable2 output: header {lines[0].strip()[:80]!r} lacks JobID/State")
    out = []
    for r in _rows(lines[1:], header):

        def get(name: str, r: dict = r) -> str | None:
            return _value(r.get(name, ""), ("Unknown", "None"))

        ec, st, en, rs = get("ExitCode"), get("Start"), get("End"), get("Restarts")
        code = ec.split(":")[0] if ec else ""
        out.append(
            SacctRecord(
                r["JobID"],
                _state(r["State"], ""),
                int(code) if code.lstrip("-").isdigit() else None,
                find_time(st) if st else None,
                find_time(en) if en else None,
                get("NodeList"),
                get("Reason"),
                int(rs) if rs and rs.isdigit() else None,
            )
        )
    return out


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
    """Each record becomes its job's row of the jobs table; a scheduler verdict (SACCT_EVENT) is also staged
    as an event at the record's line of the dump (`src`)."""
    for i, r in enumerate(records):
        con.execute(
            _UPSERT_JOB,
            [run_id, r.job_id, r.restarts or 0, r.state, r.reason, r.exit_code, r.start, r.end, r.node_list],
        )
        kind = SACCT_EVENT.get(r.state)
        if kind:
            msg = f"sacct: job {r.job_id} {r.state}" + (f" ({r.reason})" if r.reason else "")
            stage.event([run_id, r.job_id, None, None, store_text(r.end or r.start), kind, msg, src, i + 2])

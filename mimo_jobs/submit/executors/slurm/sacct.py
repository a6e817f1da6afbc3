"""The one sacct parser (`--parsable2`/`-P`: '|'-separated fields), for both of its readers:

- `parse_poll`: what the SLURM executor polls, `sacct -X -n -P -o <POLL_COLUMNS>` (no header). sacct ran
  here, so its local times are converted to UTC; a signal death's exit code reads as a shell's (128+signal).
- `parse_dump`: a sacct dump given to `mimo-jobs ingest` (`sacct -P` with its header row, any columns, or
  `--parsable` with a trailing '|'). It may come from another machine: times are kept as written; the exit
  code is the code part of "code:signal".

Both skip job steps (123.batch, 123.0): the allocation's own row carries the job's state. Light on purpose
(the SLURM executor polls with it, ingest reads dumps with it): nothing beyond the standard library. What a dump adds to the store is ingest's (mimo_jobs/ingest/sacct.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

POLL_COLUMNS = ("JobID", "State", "ExitCode", "Submit", "Start", "End", "NodeList", "Reason", "WorkDir")


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


def written_time(s: str) -> datetime | None:
    """A dump's time as written (sacct prints ISO 8601, e.g. 2026-03-02T09:59:00), naive; None if it is
    not one."""
    try:
        t = datetime.fromisoformat(s.strip())
    except ValueError:
        return None
    return t.replace(tzinfo=None)


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
                written_time(st) if st else None,
                written_time(en) if en else None,
                get("NodeList"),
                get("Reason"),
                int(rs) if rs and rs.isdigit() else None,
            )
        )
    return out

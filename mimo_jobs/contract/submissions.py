"""A run directory's own record of its submissions: `submissions.jsonl`, one JSON object a line, appended by
`submit` (never rewritten), and the lock that makes a submission of the run one at a time across every
store that shares the runs root.

Each line is one `Entry`:
- `submitted`: a submit of the study named this run and started a job of it (`job_id`);
- `kept`: a submit of the study named this run and kept its job (pending, running or completed) as it is;
- `retry` / `requeue`: the submit policy started another job of the same attempt after one ended.

The runs root is the record and a store its cache: the order of a point's attempts (store/attempts.py) and
whether a run has a live job somewhere (submit/service.py) are read from here, so two stores of one runs
root, and a store rebuilt by `ingest`, agree with the store that submitted.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

from mimo_jobs.errors import MimoJobsError

from .rundir import RunDir

NAMED = ("submitted", "kept")  # what a submit of the study did: the user named this run then
EVENTS = (*NAMED, "retry", "requeue")


@dataclass(frozen=True)
class Entry:
    time: float  # seconds since the epoch (UTC), when the line was written
    event: str  # one of EVENTS
    executor: str | None = None
    job_id: str | None = None
    attempt: int | None = None


def path_of(run_dir: Path) -> Path:
    return RunDir(Path(run_dir)).submissions


def append(run_dir: Path, entry: Entry) -> None:
    """One line, written with one write(2) on a file opened for appending (a reader never sees half of
    it), and synced: the line is what later stores rebuild the order of attempts from."""
    if entry.event not in EVENTS:
        raise ValueError(f"submission event {entry.event!r} is not one of {EVENTS}")
    line = (json.dumps(asdict(entry), sort_keys=True) + "\n").encode()
    fd = os.open(path_of(run_dir), os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            line = b"\n" + line  # a line cut short (a crash mid-write) stays alone, this one whole
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)


def read(run_dir: Path) -> list[Entry]:
    """The entries in the order written. A line that is not an entry (cut short by a crash, edited by hand)
    is skipped: it names no submission, and one bad line must not hide the others."""
    try:
        text = path_of(run_dir).read_text(errors="replace")
    except (FileNotFoundError, NotADirectoryError):
        return []
    out = []
    for line in text.splitlines():
        entry = _entry(line)
        if entry is not None:
            out.append(entry)
    return out


def _entry(line: str) -> Entry | None:
    try:
        d = json.loads(line)
    except ValueError:
        return None
    if not isinstance(d, dict) or d.get("event") not in EVENTS:
        return None
    t = d.get("time")
    if not isinstance(t, (int, float)) or isinstance(t, bool) or not 0 <= t < 1e11:
        return None
    job, ex, att = d.get("job_id"), d.get("executor"), d.get("attempt")
    return Entry(
        float(t),
        d["event"],
        ex if isinstance(ex, str) else None,
        job if isinstance(job, str) else None,
        att if isinstance(att, int) and not isinstance(att, bool) else None,
    )


def named_at(entries: list[Entry]) -> datetime | None:
    """When a submit of the study last named this run (naive UTC; None: never, e.g. a run dir written before
    this record existed). A retry or requeue continues an attempt and does not make it newer."""
    times = [e.time for e in entries if e.event in NAMED]
    return as_utc(max(times)) if times else None


def as_utc(t: float) -> datetime:
    """Seconds since the epoch as the store's naive UTC timestamp (the one conversion, so a store that
    submitted and one rebuilt from the run directory hold the same value)."""
    return datetime.fromtimestamp(t, timezone.utc).replace(tzinfo=None)


def last_job(entries: list[Entry]) -> Entry | None:
    """The newest entry that started a job (a submission, retry or requeue)."""
    return next((e for e in reversed(entries) if e.job_id and e.event != "kept"), None)


class SubmissionBusy(MimoJobsError):
    """Another process held the run directory's submission lock for longer than this one waited."""

    exit_code = 1


LOCK_WAIT_S = (
    120.0  # far above a submission's own time (an sbatch call); the bound keeps a command from hanging
)


@contextmanager
def locked(run_dir: Path, wait_s: float = LOCK_WAIT_S) -> Iterator[None]:
    """Hold the run directory's exclusive submission lock (flock(2) on `.submit.lock`): a second submit of
    the run, from this store or another sharing the runs root, waits here until the first has recorded its
    job (SubmissionBusy after `wait_s`). The kernel drops the lock when the process ends, so a crashed
    submit never leaves it held (a lock file created with O_EXCL would stay behind and need a staleness
    guess)."""
    path = RunDir(Path(run_dir)).submit_lock
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise SubmissionBusy(
                        f"another process has been submitting this run for {wait_s:.0f} s (it holds the "
                        "lock); try again when it has finished",
                        str(path),
                    ) from None
                time.sleep(0.1)
        yield
    finally:
        os.close(fd)

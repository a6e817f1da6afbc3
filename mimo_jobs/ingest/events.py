"""Failure and lifecycle events in log text.

What it recognizes: Python tracebacks (exception type + message), NCCL/gloo watchdog timeouts, CUDA/host
OOM, SLURM `DUE TO TIME LIMIT`/preemption/requeue/node failure, checkpoints saved/loaded, torchrun's
"Root Cause" summary, segfaults, srun task exits. Ingest finds candidate lines by substring search
(`ALL_TRIGGERS`) and hands each to these functions; `first_error` applies the same rules to a whole log
(the submit policy's one-line reason for a failed job).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

from .iterline import ITERATION_TRIGGER
from .origin import split_origin
from .timestamps import find_time

ROOT_KINDS = ("traceback", "oom", "segfault", "node_fail")  # a rank's own failure
SUMMARY_KINDS = ("child_failed", "task_exit")  # launcher summaries of a failure seen elsewhere
VICTIM_KINDS = ("nccl_timeout", "gloo_timeout", "peer_lost")  # waited on a peer that failed or hung
SCHEDULER_KINDS = ("time_limit", "preemption", "requeue", "cancelled")
INFO_KINDS = ("checkpoint_saved", "checkpoint_loaded", "end")

# Substrings that make a line worth classifying (ingest searches whole blocks for them, so keep them
# few and specific). Order does not matter.
TRIGGERS = (
    "Traceback (most recent call last)",
    "Watchdog caught collective",
    "gloo/transport",
    "out of memory",
    "oom-kill",
    "OutOfMemoryError",
    "CANCELLED AT",
    "Node failure",
    "NODE_FAIL",
    "equeue",  # requeue / Requeued
    "REQUEUE",
    "reempt",  # preempted / Preemption
    "PREEMPT",
    "saved checkpoint",
    "loaded checkpoint",
    "checkpoint saved",
    "checkpoint loaded",
    "from checkpoint",
    "Root Cause (first observed failure)",
    "Segmentation fault",
    "Exited with exit code",
)
# A traceback's last line names the exception; ingest only sees candidate lines, so these make the
# exception lines of tracebacks candidates too (a custom exception without these words is reported as a
# traceback without its exception line).
EXCEPTION_TRIGGERS = ("Error", "Exception", "Interrupt", "SystemExit", "StopIteration")
# Every substring that makes a line a candidate (iteration lines included): what both scanners search for.
ALL_TRIGGERS = (ITERATION_TRIGGER, *TRIGGERS, *EXCEPTION_TRIGGERS)

_VICTIM_MSG_RE = re.compile(
    r"Timed out waiting|Connection closed by peer|Connection reset by peer|Watchdog caught|"
    r"collective operation timeout|DistNetworkError|NCCL communicator was aborted|"
    r"remote process exited|Broken pipe|failed to recv|ncclRemoteError",
    re.I,
)
_SLURM_CANCEL_RE = re.compile(
    r"\*\*\* (?:JOB|STEP) ([\w.\[\]+-]+) ON (\S+) CANCELLED AT (\S+)(?: DUE TO ([A-Z ]+?))?"
    r"(?:,.*)? \*\*\*"
)


@dataclass
class Event:
    kind: str
    message: str
    time: datetime | None = None


def is_victim_message(msg: str) -> bool:
    """A failure that only says a peer went away or a collective timed out (a consequence, not a cause)."""
    return bool(_VICTIM_MSG_RE.search(msg))


# ----------------------------------------------------------------------------------------- one line


def classify_line(text: str, year_hint: int | None = None) -> list[Event]:
    """Events in one line (prefixes stripped), in a fixed order: a peer or memory failure, then what the
    scheduler says, then checkpoints and process ends. Tracebacks are handled by `TracebackTracker`."""
    low = text.lower()
    early = _peer_and_memory(text)
    scheduler, cancel_time = _scheduler(text, low)
    late = _checkpoint(text, low) + _process_end(text)
    if not (early or scheduler or late):
        return []
    t = find_time(text, year_hint)
    msg = text.strip()[:500]
    # SLURM's cancel line carries its own time: it and what follows it are dated by it
    return [Event(k, msg, t) for k in early] + [Event(k, msg, cancel_time or t) for k in scheduler + late]


def _peer_and_memory(text: str) -> list[str]:
    out = []
    if "Watchdog caught collective" in text:
        out.append("nccl_timeout")
    if "gloo/transport" in text:
        out.append("gloo_timeout" if "Timed out" in text else "peer_lost")
    cuda_oom = ("out of memory" in text or "OutOfMemoryError" in text) and "CUDA" in text
    if cuda_oom or "oom-kill" in text or "Out Of Memory" in text or "OutOfMemoryError" in text:
        out.append("oom")
    return out


def _scheduler(text: str, low: str) -> tuple[list[str], datetime | None]:
    """Cancellation, time limit, node failure, requeue and preemption (each once), and the cancel time."""
    out, when = [], None
    if "CANCELLED AT" in text:
        m = _SLURM_CANCEL_RE.search(text)
        when = find_time(m.group(3)) if m else None
        out.append(_cancel_kind((m.group(4) or "") if m else ""))
    elif "DUE TO TIME LIMIT" in text:
        out.append("time_limit")
    if ("Node failure" in text or "NODE_FAIL" in text) and "node_fail" not in out:
        out.append("node_fail")
    if ("requeued" in low or "requeuing" in low or "job requeue" in low) and "requeue" not in out:
        out.append("requeue")
    if ("preempted" in low or "preemption" in low) and "preemption" not in out:
        out.append("preemption")
    return out, when


def _checkpoint(text: str, low: str) -> list[str]:
    if "checkpoint" not in text:
        return []
    if "saved checkpoint" in low or "checkpoint saved" in low:
        return ["checkpoint_saved"]
    if "loaded checkpoint" in low or "checkpoint loaded" in low or "resumed from checkpoint" in low:
        return ["checkpoint_loaded"]
    return []


def _process_end(text: str) -> list[str]:
    return [k for k, word in (("segfault", "Segmentation fault"), ("task_exit", "Exited with exit code"))
            if word in text]


def _cancel_kind(reason: str) -> str:
    """The event of SLURM's `*** JOB n ON node CANCELLED AT time DUE TO <reason> ***`."""
    if "TIME LIMIT" in reason:
        return "time_limit"
    if "PREEMPT" in reason:
        return "preemption"
    if "NODE FAIL" in reason:
        return "node_fail"
    if "REQUEUE" in reason:
        return "requeue"
    return "cancelled"


# ----------------------------------------------------------------------------------------- tracebacks


@dataclass
class _Pending:
    start_line: int
    time: datetime | None
    seen: int = 0


class TracebackTracker:
    """Follows Python tracebacks per writer (interleaved multi-rank output keeps one state per origin).

    feed() gets every line of an origin after its traceback header; it returns the finished event (at the
    exception line: "Type: message") or None. Chained tracebacks ("During handling ...") continue the same
    event and report the last exception, which is the one that ended the process.
    """

    MAX_LINES = 400  # a traceback longer than this is cut off and reported with what we have

    def __init__(self) -> None:
        self.pending: dict[object, _Pending] = {}

    def start(self, key: object, line_no: int, time: datetime | None) -> None:
        if key not in self.pending:
            self.pending[key] = _Pending(line_no, time)

    def active(self, key: object) -> bool:
        return key in self.pending

    def feed(self, key: object, text: str) -> tuple[int, Event] | None:
        p = self.pending.get(key)
        if p is None:
            return None
        p.seen += 1
        s = text.rstrip("\r\n")
        if not s.strip() or s.startswith((" ", "\t")) or s.startswith("Traceback (most recent call last)"):
            if p.seen > self.MAX_LINES:
                del self.pending[key]
                return p.start_line, Event("traceback", "traceback cut off (no exception line)", p.time)
            return None
        if s.startswith(
            ("During handling of the above exception", "The above exception was the direct cause")
        ):
            return None
        if s.startswith("^") or s.lstrip().startswith("~"):
            return None
        del self.pending[key]
        return p.start_line, Event("traceback", s.strip()[:500], p.time)

    def flush(self) -> list[tuple[int, Event]]:
        """Tracebacks still open at end of input (file truncated mid-traceback)."""
        out = [
            (p.start_line, Event("traceback", "traceback truncated (no exception line)", p.time))
            for p in self.pending.values()
        ]
        self.pending.clear()
        return out


# ----------------------------------------------------------------------------------------- torchrun summary

_ROOT_RANK_RE = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*(\d+)\)")
_ROOT_EXIT_RE = re.compile(r"exitcode\s*:\s*(-?\d+)")
_ROOT_TIME_RE = re.compile(r"time\s*:\s*(\d{4}-\d{2}-\d{2}_\d{2}:\d{2}:\d{2})")


def parse_root_cause(lines: list[str]) -> tuple[int | None, Event] | None:
    """torchrun's ChildFailedError summary: the lines after "Root Cause (first observed failure):"."""
    rank = None
    exitcode = None
    t = None
    for s in lines[:12]:
        if rank is None and (m := _ROOT_RANK_RE.search(s)):
            rank = int(m.group(1))
        if exitcode is None and (m := _ROOT_EXIT_RE.search(s)):
            exitcode = int(m.group(1))
        if t is None and (m := _ROOT_TIME_RE.search(s)):
            t = find_time(m.group(1))
    if rank is None:
        return None
    return rank, Event("child_failed", f"torchrun root cause: rank {rank} exitcode {exitcode}", t)


# ----------------------------------------------------------------------------------------- a whole log

_ERROR_LINE = re.compile(r"^\s*(?:\[?rank\d+\]?:\s*)?([A-Za-z_][\w.]*(?:Error|Exception)|error|Error|ERROR|FATAL|"
                         r"fatal|Killed|Segmentation fault)\b")
_FIRST_ERROR_KINDS = ("oom", "segfault", "time_limit", "node_fail", "preemption")


def first_error(text: str) -> str | None:
    """The first line of a log that says what went wrong: a traceback's exception line (not a victim's:
    a peer timeout is a consequence) or an OOM/segfault/scheduler event line, by the rules of the events
    table; else the first error-looking line; None when there is none."""
    lines = text.splitlines()
    tracker = TracebackTracker()
    for i, raw in enumerate(lines):
        origin, s = split_origin(raw)
        key = (origin.task, origin.local_rank, origin.rank)
        if s.startswith("Traceback (most recent call last)"):
            tracker.start(key, i, None)
            continue
        done = tracker.feed(key, s) if tracker.active(key) else None
        if done is not None and not is_victim_message(done[1].message):
            return done[1].message
        for ev in classify_line(s):
            if ev.kind in _FIRST_ERROR_KINDS:
                return ev.message
    for s in lines:
        if _ERROR_LINE.match(s) and "Traceback" not in s:
            return s.strip()[:500]
    return None

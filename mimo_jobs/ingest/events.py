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

from mimo_jobs.contract import events as K
from mimo_jobs.contract.events import is_launcher_exception, is_victim_message

from .iterline import ITERATION_TRIGGER, iteration_head
from .origin import split_origin
from .timestamps import find_time

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
    "(local_rank:",  # the fields of torchrun's summary that read_root_cause reads
    "exitcode",
    "error_file:",
    "traceback :",
    "Segmentation fault",
    "Exited with exit code",
    # The failure lines below, by a few of their words each. The compiled scan's cost grows with how often
    # a trigger's fingerprint (or one sharing its bucket) occurs in ordinary output, and not additively:
    # this set scans the benchmark log (benchmarks/ingest.py) as fast as the set without it, where
    # "closed by remote" for NCCL's lost peer, srun's "f Memory" and ": Killed", or the summary's padded
    # "host      :" and "time      :" fields each cost 10-30%. So torchrun's host is not read, and the
    # summary's time is the log's last one before it.
    "oom_kill",  # slurmstepd: "Detected 1 oom_kill event in StepId=..." (newer SLURM; older: oom-kill)
    "srun: error",  # "srun: error: node3: task 3: Out Of Memory" / "...: Killed"
    "NCCL WARN",  # "... NCCL WARN ... Connection closed by remote peer ...", "Cuda failure 'out of memory'"
    "illegal memory access",
    "Xid (",  # the driver's "NVRM: Xid (PCI:0000:3b:00): 79, ..." (triggers are 4+ bytes)
    "CC error",  # "uncorrectable ECC error"
    K.TRAINER_ERROR,  # the trainer's own error line (no traceback follows it)
)
# A traceback's last line names the exception; ingest only sees candidate lines, so these make the
# exception lines of tracebacks candidates too (a custom exception without these words is reported as a
# traceback without its exception line).
EXCEPTION_TRIGGERS = ("Error", "Exception", "Interrupt", "SystemExit", "StopIteration")
# Every substring that makes a line a candidate (iteration lines included): what both scanners search for.
ALL_TRIGGERS = (ITERATION_TRIGGER, *TRIGGERS, *EXCEPTION_TRIGGERS)


def holds_trigger(line: str) -> bool:
    """Whether a line is a candidate (holds one of ALL_TRIGGERS)."""
    return any(t in line for t in ALL_TRIGGERS)


_SLURM_CANCEL_RE = re.compile(
    r"\*\*\* (?:JOB|STEP) ([\w.\[\]+-]+) ON (\S+) CANCELLED AT (\S+)(?: DUE TO ([A-Z ]+?))?"
    r"(?:,.*)? \*\*\*"
)


@dataclass
class Event:
    kind: str
    message: str
    time: datetime | None = None
    # who the text itself names, when a line prefix does not: "[Rank 5] Watchdog ...", srun's "task 3:",
    # the "[local rank]" of NCCL's "host:pid:tid [3] NCCL WARN" header
    rank: int | None = None
    task: int | None = None
    local_rank: int | None = None


# "[Rank 5] Watchdog caught ..." and "[PG ID 0 PG GUID 0(default_pg) Rank 5] ..." (torch's ProcessGroupNCCL)
_MSG_RANK_RE = re.compile(r"\[(?:PG [^\]]*?)?Rank (\d+)\]")
# "srun: error: nid001234: task 3: Out Of Memory", "srun: error: node1: tasks 0-3: Killed"
_SRUN_TASK_RE = re.compile(r"srun: error: \S+: tasks? (\d+)")
# "ng30903:3063028:3066152 [3] include/alloc.h:178 NCCL WARN ..." (host:pid:tid [local rank]), with
# NCCL_DEBUG_TIMESTAMP_FORMAT's "[2025-09-24 16:15:28] " before it (NCCL >= 2.23 prints one by default)
_NCCL_HEADER_RE = re.compile(r"^\s*(?:\[[^\]]{8,40}\]\s*)?\S+:\d+:\d+ \[(\d+)\] .*NCCL (?:WARN|INFO)")


def named_identity(text: str) -> tuple[int | None, int | None, int | None]:
    """(rank, srun task, local rank) the text of a line names (None where it names none)."""
    m = _MSG_RANK_RE.search(text)
    rank = int(m.group(1)) if m else None
    m = _SRUN_TASK_RE.search(text)
    task = int(m.group(1)) if m else None
    m = _NCCL_HEADER_RE.search(text)
    local = int(m.group(1)) if m else None
    return rank, task, local


# ----------------------------------------------------------------------------------------- one line


def classify_line(text: str, year_hint: int | None = None) -> list[Event]:
    """Events in one line (prefixes stripped), in a fixed order: a peer or memory failure, then what the
    scheduler says, then checkpoints and process ends. Tracebacks are handled by `TracebackTracker`."""
    low = text.lower()
    early = _peer_and_memory(text, low)
    scheduler, cancel_time = _scheduler(text, low)
    late = _checkpoint(text, low) + _process_end(text)
    if not (early or scheduler or late):
        return []
    t = find_time(text, year_hint)
    msg = text.strip()[:500]
    who = named_identity(text)
    # SLURM's cancel line carries its own time: it and what follows it are dated by it
    return [Event(k, msg, t, *who) for k in early] + [
        Event(k, msg, cancel_time or t, *who) for k in scheduler + late
    ]


def _peer_and_memory(text: str, low: str) -> list[str]:
    out = []
    if "Watchdog caught collective" in text:
        out.append(K.NCCL_TIMEOUT)
    if "gloo/transport" in text:
        out.append(K.GLOO_TIMEOUT if "Timed out" in text else K.PEER_LOST)
    if _nccl_peer_lost(text):
        out.append(K.PEER_LOST)
    # CUDA's allocator ("CUDA out of memory"), NCCL's ("Cuda failure 'out of memory'"), SLURM's cgroup OOM
    # killer ("oom-kill event(s)", newer "oom_kill event"; srun's "task N: Out Of Memory")
    cuda_oom = ("out of memory" in low or "OutOfMemoryError" in text) and "cuda" in low
    if (
        cuda_oom
        or "oom-kill" in text
        or "oom_kill" in text
        or "Out Of Memory" in text
        or "OutOfMemoryError" in text
    ):
        out.append(K.OOM)
    out += _gpu_faults(text)
    return out


def _nccl_peer_lost(text: str) -> bool:
    """NCCL's socket/IB failures: a peer's process or link went away (a consequence, like a timeout)."""
    return "NCCL WARN" in text and any(
        w in text for w in ("Connection closed by remote peer", "unhandled system error", "ncclRemoteError")
    )


_XID_RE = re.compile(r"\bXid \(PCI:")


def _gpu_faults(text: str) -> list[str]:
    if "illegal memory access" in text:
        return [K.CUDA_ERROR]
    if "Xid (" in text and _XID_RE.search(text):
        return [K.GPU_XID]
    if "ECC error" in text and ("uncorrectable" in text or "double bit" in text):
        return [K.GPU_ECC]
    return []


def _scheduler(text: str, low: str) -> tuple[list[str], datetime | None]:
    """Cancellation, time limit, node failure, requeue and preemption (each once), and the cancel time."""
    out, when = [], None
    if "CANCELLED AT" in text:
        m = _SLURM_CANCEL_RE.search(text)
        when = find_time(m.group(3)) if m else None
        out.append(_cancel_kind((m.group(4) or "") if m else ""))
    elif "DUE TO TIME LIMIT" in text:
        out.append(K.TIME_LIMIT)
    if ("Node failure" in text or "NODE_FAIL" in text) and K.NODE_FAIL not in out:
        out.append(K.NODE_FAIL)
    if ("requeued" in low or "requeuing" in low or "job requeue" in low) and K.REQUEUE not in out:
        out.append(K.REQUEUE)
    if ("preempted" in low or "preemption" in low) and K.PREEMPTION not in out:
        out.append(K.PREEMPTION)
    return out, when


def _checkpoint(text: str, low: str) -> list[str]:
    if "checkpoint" not in text:
        return []
    if "saved checkpoint" in low or "checkpoint saved" in low:
        return [K.CHECKPOINT_SAVED]
    if "loaded checkpoint" in low or "checkpoint loaded" in low or "resumed from checkpoint" in low:
        return [K.CHECKPOINT_LOADED]
    return []


def _process_end(text: str) -> list[str]:
    if K.TRAINER_ERROR in text:  # the rank's own failure, worded by the trainer instead of a traceback
        return [K.TRACEBACK]
    out = [
        k
        for k, word in ((K.SEGFAULT, "Segmentation fault"), (K.TASK_EXIT, "Exited with exit code"))
        if word in text
    ]
    if not out and ": Killed" in text and _SRUN_TASK_RE.search(text):
        out.append(K.TASK_EXIT)  # srun: "task 3: Killed" (SIGKILL from outside: the OOM killer, a cancel)
    return out


def _cancel_kind(reason: str) -> str:
    """The event of SLURM's `*** JOB n ON node CANCELLED AT time DUE TO <reason> ***`."""
    if "TIME LIMIT" in reason:
        return K.TIME_LIMIT
    if "PREEMPT" in reason:
        return K.PREEMPTION
    if "NODE FAIL" in reason:
        return K.NODE_FAIL
    if "REQUEUE" in reason:
        return K.REQUEUE
    return K.CANCELLED


# ----------------------------------------------------------------------------------------- tracebacks


@dataclass
class _Pending:
    start_line: int
    time: datetime | None
    seen: int = 0


_OWN_EXCEPTION = re.compile(r"^mimo_jobs(?:\.\w+)+\.(\w+(?:Error|Exception)\b)")


def shown_exception(line: str) -> str:
    """A traceback's exception line as people read it: this package's own exception classes by their name
    alone (`ArchError: ...`, not `mimo_jobs.model.fields.ArchError: ...`, a path inside the package);
    others' as Python prints them (`torch.OutOfMemoryError: ...` says where it came from)."""
    return _OWN_EXCEPTION.sub(r"\1", line, count=1)


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
        # Megatron's iteration lines start with a blank, like a frame: an iteration line is never a frame,
        # the writer went on without printing the exception
        if ITERATION_TRIGGER in s and iteration_head(s) is not None:
            return self.cut(key, "an iteration line came first")
        if not s.strip() or s.startswith((" ", "\t")) or s.startswith("Traceback (most recent call last)"):
            if p.seen > self.MAX_LINES:
                return self.cut(key, f"over {self.MAX_LINES} lines")
            return None
        if s.startswith(
            ("During handling of the above exception", "The above exception was the direct cause")
        ):
            return None
        if s.startswith("^") or s.lstrip().startswith("~"):
            return None
        del self.pending[key]
        return p.start_line, Event(K.TRACEBACK, shown_exception(s.strip())[:500], p.time)

    def cut(self, key: object, why: str) -> tuple[int, Event] | None:
        """End the writer's open traceback without its exception line (None when none is open)."""
        p = self.pending.pop(key, None)
        if p is None:
            return None
        return p.start_line, Event(K.TRACEBACK, f"traceback cut off (no exception line: {why})", p.time)

    def state(self) -> list[list]:
        """The open tracebacks as JSON values ([writer key, start line, time, lines seen]): a growing log's
        next ingest goes on with them (see restore)."""
        return [
            [list(k) if isinstance(k, tuple) else k, p.start_line, p.time and p.time.isoformat(), p.seen]
            for k, p in self.pending.items()
        ]

    def restore(self, state: list[list]) -> None:
        for key, line, time, seen in state:
            t = datetime.fromisoformat(time) if time else None
            self.pending[tuple(key) if isinstance(key, list) else key] = _Pending(line, t, seen)

    def flush(self) -> list[tuple[object, int, Event]]:
        """Tracebacks still open at end of input (file truncated mid-traceback): (writer key, start line,
        event) each, so that the event keeps who wrote it."""
        out = [
            (k, p.start_line, Event(K.TRACEBACK, "traceback truncated (no exception line)", p.time))
            for k, p in self.pending.items()
        ]
        self.pending.clear()
        return out


# ----------------------------------------------------------------------------------------- torchrun summary
# torchrun's ChildFailedError message (torch/distributed/elastic/multiprocessing/errors/__init__.py):
#   Root Cause (first observed failure):
#   [0]:
#     time      : 2026-01-01_00:00:00
#     host      : node1
#     rank      : 0 (local_rank: 0)
#     exitcode  : -9 (pid: 1234)  (SIGKILL)        <- older torch prints no signal name here
#     error_file: <N/A>
#     traceback : Signal 9 (SIGKILL) received by PID 1234
# The summary (who died, how) outranks the launcher's own exception line ("...ChildFailedError:"), which
# says only that some child failed: `root_cause_message` words it once for ingest, first_error and triage.

ROOT_CAUSE_LINE = "Root Cause (first observed failure)"
ROOT_CAUSE_SPAN = 12  # lines of one failure entry read after the "Root Cause" line

_ROOT_RANK_RE = re.compile(r"\brank\s*:\s*(\d+)\s*\(local_rank:\s*(\d+)\)")
_ROOT_EXIT_RE = re.compile(r"exitcode\s*:\s*(-?\d+)")
_ROOT_SIGNAL_RE = re.compile(r"\((SIG[A-Z0-9]+)\)")  # after the exit code (newer torch)
_ROOT_SIGNAL_MSG_RE = re.compile(r"Signal \d+ \((SIG[A-Z0-9]+)\) received")  # the traceback field
_ROOT_TIME_RE = re.compile(r"time\s*:\s*(\d{4}-\d{2}-\d{2}_\d{2}:\d{2}:\d{2})")
_ROOT_FILE_RE = re.compile(r"^\s*error_file\s*:\s*(\S.*?)\s*$")
ROOT_FIELD_LAST = "traceback"  # an entry's last field: a block read line by line ends with it
_ROOT_FIELD_RE = re.compile(r"^\s*(?:rank|exitcode|error_file|traceback)\s*:")  # those ingest sees


def is_summary_field(s: str) -> bool:
    """A line of a torchrun summary entry ("  rank      : 1 (local_rank: 1)"), prefixes stripped."""
    return bool(_ROOT_FIELD_RE.match(s))


_ROOT_END_RE = re.compile(r"^\s*(?:={5,}|-{5,}|\[\d+\]:)\s*$")  # the border, or the next failure entry


def signal_name(signum: int) -> str | None:
    import signal

    try:
        return signal.Signals(signum).name
    except ValueError:
        return None


def root_cause_message(rank: int | None, exitcode: int | None, signame: str | None = None) -> str:
    """How a failed rank ended, in the words every failure summary uses (ingest events, the jobs table's
    first error, report triage): "rank 0 killed by SIGKILL (exit -9; often the kernel's OOM killer)"."""
    who = "a rank" if rank is None else f"rank {rank}"
    if signame is None and exitcode is not None and exitcode < 0:
        signame = signal_name(-exitcode)
    if signame is None and exitcode is not None and 128 < exitcode < 160:
        by = signal_name(exitcode - 128)  # a shell reports its child's signal N as 128+N
        if by:
            hint = "; often the kernel's OOM killer" if by == "SIGKILL" else ""
            return f"{who} exited with code {exitcode} (128+{by}: killed by a signal{hint})"
    if signame is not None:
        hint = "; often the kernel's OOM killer" if signame == "SIGKILL" else ""
        code = f"exit {exitcode}" if exitcode is not None else "no exit code"
        return f"{who} killed by {signame} ({code}{hint})"
    if exitcode is None:
        return f"{who} failed (torchrun's root cause names no exit code)"
    return f"{who} exited with code {exitcode}"


@dataclass(frozen=True)
class RootCause:
    """One failure entry of torchrun's summary: who (rank, local rank), how it ended (exit code, signal),
    when, and where the child wrote its error (error_file, None for "<N/A>")."""

    rank: int
    exitcode: int | None
    signame: str | None
    time: datetime | None
    local_rank: int | None = None
    error_file: str | None = None

    @property
    def signalled(self) -> bool:
        return self.signame is not None or (self.exitcode is not None and self.exitcode < 0)

    @property
    def message(self) -> str:
        msg = root_cause_message(self.rank, self.exitcode, self.signame)
        return f"{msg}; error file {self.error_file}" if self.error_file else msg


def read_root_cause(lines: list[str]) -> RootCause | None:
    """The first failure entry of `lines` (prefixes stripped: those after "Root Cause (first observed
    failure):", or one entry of its "Failures:" list): its fields; None without a rank."""
    f: dict = {}
    for i, s in enumerate(lines[:ROOT_CAUSE_SPAN]):
        if i and _ROOT_END_RE.match(s):
            break
        _read_root_field(s, f)
    if "rank" not in f:
        return None
    return RootCause(
        f["rank"], f.get("exitcode"), f.get("signame"), f.get("time"), f.get("local"), f.get("file")
    )


def _read_root_field(s: str, f: dict) -> None:
    """Whichever field of a summary entry the line `s` holds, into `f` (the first of each wins)."""
    if "rank" not in f and (m := _ROOT_RANK_RE.search(s)):
        f["rank"], f["local"] = int(m.group(1)), int(m.group(2))
    elif "exitcode" not in f and (m := _ROOT_EXIT_RE.search(s)):
        f["exitcode"] = int(m.group(1))
        if sm := _ROOT_SIGNAL_RE.search(s, m.end()):
            f["signame"] = sm.group(1)
    elif "signame" not in f and (m := _ROOT_SIGNAL_MSG_RE.search(s)):
        f["signame"] = m.group(1)
    elif "time" not in f and (m := _ROOT_TIME_RE.search(s)):
        f["time"] = find_time(m.group(1))
    elif "file" not in f and (m := _ROOT_FILE_RE.match(s)):
        f["file"] = None if m.group(1) == "<N/A>" else m.group(1)[:200]


def parse_root_cause(lines: list[str], kind: str = K.CHILD_FAILED) -> tuple[int | None, Event] | None:
    """torchrun's ChildFailedError summary: the lines after "Root Cause (first observed failure):" (or,
    kind child_failed_other, one entry of its "Failures:" list: a rank that also failed)."""
    rc = read_root_cause(lines)
    if rc is None:
        return None
    msg = rc.message if kind == K.CHILD_FAILED else f"also failed: {rc.message}"
    return rc.rank, Event(kind, msg, rc.time, rc.rank, local_rank=rc.local_rank)


# ----------------------------------------------------------------------------------------- a whole log

_ERROR_LINE = re.compile(
    r"^\s*(?:\[?rank\d+\]?:\s*)?([A-Za-z_][\w.]*(?:Error|Exception)|error|Error|ERROR|FATAL|"
    r"fatal|Killed|Segmentation fault)\b"
)
_FIRST_ERROR_KINDS = (K.TRACEBACK, K.OOM, K.SEGFAULT, K.TIME_LIMIT, K.NODE_FAIL, K.PREEMPTION)


def first_error(text: str) -> str | None:
    """What went wrong in a log, in one line, by the order of evidence triage uses too:
    1. a traceback's exception line (not a victim's: a peer timeout is a consequence; not the launcher's
       ChildFailedError, which only says a child failed), the trainer's own error line, or an
       OOM/segfault/scheduler event line;
    2. a signal death in torchrun's root-cause summary (it leaves no traceback), where it appears;
    3. else torchrun's root cause with an exit code, then the first error-looking line, then the launcher's
       bare exception line; None when there is none."""
    lines = text.splitlines()
    tracker = TracebackTracker()
    exited: str | None = None  # a root cause without a signal: a rank's traceback found later says more
    launcher: str | None = None
    for i, raw in enumerate(lines):
        origin, s = split_origin(raw)
        key = (origin.task, origin.local_rank, origin.rank)
        if s.startswith("Traceback (most recent call last)"):
            tracker.start(key, i, None)
            continue
        done = tracker.feed(key, s) if tracker.active(key) else None
        if done is not None:
            msg = done[1].message
            if is_launcher_exception(msg):
                launcher = launcher or msg
            elif not is_victim_message(msg):
                return msg
        if ROOT_CAUSE_LINE in s:
            rc = read_root_cause([split_origin(x)[1] for x in lines[i + 1 : i + 1 + ROOT_CAUSE_SPAN]])
            if rc is not None and rc.signalled:
                return rc.message
            if rc is not None:
                exited = exited or rc.message
            continue
        for ev in classify_line(s):
            if ev.kind in _FIRST_ERROR_KINDS:
                return ev.message
    if exited:
        return exited
    for s in lines:
        if _ERROR_LINE.match(s) and "Traceback" not in s and not is_launcher_exception(s):
            return s.strip()[:500]
    return launcher

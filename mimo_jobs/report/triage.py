"""Failure triage: from a failed or hung job's events, the first rank that failed or went silent, and why.

Pure: events in, verdict out. Order of evidence (a peer's timeout is a consequence, never the cause):
1. a rank's own failure (traceback that is not a timeout, OOM, segfault, node failure), earliest first;
   one no rank or node is known for yields to torchrun's "Root Cause", which names the rank;
2. launcher summaries (torchrun "Root Cause", worded by events.root_cause_message like the jobs table's
   first error; an srun task exit, or the launcher's bare ChildFailedError line, only after the timeouts of 4);
3. scheduler ends (time limit, preemption, requeue, cancel);
4. timeouts only: the ranks that did NOT report a timeout went silent (they never joined the collective
   the others waited in); if every rank timed out, the earliest;
5. nothing at all: the run went silent after its last iteration.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class EventRow:
    rank: int | None
    node: int | None
    time: datetime | None
    kind: str
    message: str
    source_file: str
    line_no: int


@dataclass(frozen=True)
class Verdict:
    rank: int | None
    node: int | None
    kind: str  # failed | silent | scheduler | unknown
    reason: str
    time: datetime | None
    evidence: str  # file:line of the event used


def _order(e: EventRow):
    # Earliest first; events without a time sort after timed ones, then by file position.
    return (e.time is None, e.time or datetime.min, e.source_file, e.line_no)


def _where(e: EventRow) -> str:
    return f"{e.source_file}:{e.line_no}"


def _who(rank: int | None, node: int | None) -> str:
    if rank is not None:
        return f"rank {rank}"
    if node is not None:
        return f"node {node}"
    return "an unknown rank"


def triage(
    events: list[EventRow],
    world: int | None = None,
    last_iteration: int | None = None,
    last_time: datetime | None = None,
) -> Verdict:
    """The verdict on a failed or hung job: the first level of evidence (module docstring) its events hold."""
    from mimo_jobs.contract.events import (
        ROOT_KINDS,
        SCHEDULER_KINDS,
        SUMMARY_KINDS,
        VICTIM_KINDS,
        is_launcher_exception,
        is_victim_message,
    )

    def launcher(e: EventRow) -> bool:  # torchrun's own ChildFailedError: a summary, not a rank's failure
        return e.kind == "traceback" and is_launcher_exception(e.message)

    root = [
        e
        for e in events
        if e.kind in ROOT_KINDS
        and not (e.kind == "traceback" and is_victim_message(e.message))
        and not launcher(e)
    ]
    victims = [
        e
        for e in events
        if e.kind in VICTIM_KINDS
        or (e.kind == "traceback" and is_victim_message(e.message) and not launcher(e))
    ]
    summary = [e for e in events if e.kind in SUMMARY_KINDS or launcher(e)]
    sched = [e for e in events if e.kind in SCHEDULER_KINDS]
    n_victim_ranks = len({e.rank for e in victims if e.rank is not None})
    tail = f"; {n_victim_ranks} other rank(s) then timed out waiting" if n_victim_ranks else ""
    return (
        _own_failure(root, tail, summary)
        or _launcher_failure(summary, tail)
        or _scheduler_end(sched)
        or _timeouts(victims, world)
        or _summary(summary)
        or _went_silent(last_iteration, last_time)
    )


def _failed(e: EventRow, reason: str) -> Verdict:
    return Verdict(e.rank, e.node, "failed", reason, e.time, _where(e))


def _own_failure(root: list[EventRow], tail: str, summary: list[EventRow]) -> Verdict | None:
    """1. The earliest rank's own failure (`tail`: how many ranks then timed out). One that names no rank
    or node yields to torchrun's root cause, which does (its line is kept as further evidence)."""
    if not root:
        return None
    # Prefer a rank-attributed event at the earliest time; a traceback beats an OOM line of the
    # same rank only for its message (the OOM line names the allocation).
    first = min(root, key=lambda e: (e.rank is None and e.node is None, *_order(e)))
    if first.rank is None and first.node is None:
        named = _launcher_failure(summary, tail)
        if named is not None:
            return Verdict(
                named.rank,
                named.node,
                named.kind,
                f"{named.reason} (also: {first.message})",
                named.time,
                named.evidence,
            )
    others = [e for e in root if e.rank == first.rank and e.kind == "traceback"]
    msg = others[0].message if others and first.kind != "traceback" else first.message
    return _failed(first, f"{_who(first.rank, first.node)} failed: {msg}{tail}")


def _launcher_failure(summary: list[EventRow], tail: str) -> Verdict | None:
    """2. The earliest child the launcher reports failed (torchrun's "Root Cause"), in the words of its
    event (events.root_cause_message: "rank 0 killed by SIGKILL (exit -9; ...)")."""
    child = [e for e in summary if e.kind == "child_failed"]
    if not child:
        return None
    first = min(child, key=_order)
    return _failed(first, f"{first.message}{tail}")


def _scheduler_end(sched: list[EventRow]) -> Verdict | None:
    """3. The earliest scheduler end: time limit, preemption, requeue or cancel."""
    if not sched:
        return None
    first = min(sched, key=_order)
    label = {
        "time_limit": "time limit reached",
        "preemption": "preempted",
        "requeue": "requeued",
        "cancelled": "cancelled",
    }[first.kind]
    return Verdict(None, None, "scheduler", f"{label}: {first.message}", first.time, _where(first))


def _timeouts(victims: list[EventRow], world: int | None) -> Verdict | None:
    """4. Timeouts only: the ranks of `world` that reported none went silent; if none did, the earliest."""
    if not victims:
        return None
    reporters = {e.rank for e in victims if e.rank is not None}
    if world and reporters:
        silent = sorted(set(range(world)) - reporters)
        if silent and len(silent) < world:
            first_to = min(victims, key=_order)
            return Verdict(
                silent[0],
                None,
                "silent",
                f"rank(s) {', '.join(map(str, silent))} went silent: the other "
                f"{len(reporters)} rank(s) timed out waiting in a collective "
                f"({first_to.kind})",
                first_to.time,
                _where(first_to),
            )
    first = min(victims, key=_order)
    return _failed(first, f"{_who(first.rank, first.node)} timed out first: {first.message}")


def _summary(summary: list[EventRow]) -> Verdict | None:
    """After the timeouts: another launcher summary (srun task exit, torchrun's bare ChildFailedError
    line), the earliest."""
    if not summary:
        return None
    first = min(summary, key=_order)
    if first.kind == "traceback":
        return _failed(first, f"torchrun reports a failed child but no root cause: {first.message}")
    return _failed(first, first.message)


def _went_silent(last_iteration: int | None, last_time: datetime | None) -> Verdict:
    """5. Nothing at all: the job went silent after its last iteration (or before its first)."""
    it = f" after iteration {last_iteration}" if last_iteration is not None else " before its first iteration"
    at = f" (last output {last_time:%Y-%m-%d %H:%M:%S})" if last_time else ""
    return Verdict(None, None, "silent", f"no error in the logs: the job went silent{it}{at}", last_time, "")

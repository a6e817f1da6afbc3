"""The retry/requeue policy applied when a job ends. Pure: every input is given (the job table lives in
`jobs_table`; what the job's logs say comes as the event kinds ingest stored for it, so the policy and
ingest never read one log line two ways).

Policy (classify):
- COMPLETED                                   -> done
- exit 75 (REQUEUE_EXIT_CODE), or a requeue event (not CANCELLED): the trainer
  stopped on a signal or near its deadline after saving a checkpoint -> requeue (up to MAX_REQUEUES; resumes
  from `latest`), also when the limit's TERM came while it was exiting (TIMEOUT exit 75)
- PREEMPTED                                   -> requeue (the run resumes from its checkpoints)
- TIMEOUT                                     -> requeue while checkpoints exist and timeouts < MAX_TIMEOUTS
                                                 (no checkpoint: the next attempt would redo the same work)
- a retryable state (NODE_FAIL, BOOT_FAIL), or FAILED with an event of a kind worth a retry
  (contract/events.py: NCCL/gloo watchdog timeouts, lost peers, node failure)
                                              -> retry while retries < cluster.max_retries
- anything else (a traceback, exit code 1, OOM, CANCELLED) -> final: deterministic failures are not retried
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from mimo_jobs.contract import events as K
from mimo_jobs.contract import jobstates as S
from mimo_jobs.contract.requeue import REQUEUE_EXIT_CODE

MAX_TIMEOUTS = 3  # like submitit's max_num_timeout
# Every requeued attempt advances at least one iteration, but a run that keeps stopping is bounded anyway.
MAX_REQUEUES = 20


@dataclass(frozen=True)
class Decision:
    action: str  # done | final | retry | requeue
    reason: str


@dataclass
class History:
    """What earlier jobs of the same run used up (for the limits)."""

    retries: int = 0
    timeouts: int = 0
    preemptions: int = 0


def flaky_signature(kinds: Iterable[str]) -> str | None:
    """The first event kind (in the event table's order) that makes a failed job worth another attempt."""
    have = set(kinds)
    return next((k for k in K.RETRY_KINDS if k in have), None)


def classify(
    state: str,
    exit_code: int | None,
    kinds: Iterable[str],
    history: History,
    max_retries: int,
    has_checkpoint: bool,
) -> Decision:
    """What to do with a job that ended (`kinds`: the kinds of the events ingest stored for it)."""
    kinds = set(kinds)
    if S.is_success(state):
        return Decision("done", "completed")
    if state != S.CANCELLED and (exit_code == REQUEUE_EXIT_CODE or K.REQUEUE in kinds):
        # The trainer checkpointed and asked for another attempt (its marker was handled by the launch script).
        if not has_checkpoint:
            return Decision(
                "final",
                f"exit {exit_code}: the trainer asked for a requeue but no complete "
                "checkpoint exists: not requeued",
            )
        if history.preemptions >= MAX_REQUEUES:
            return Decision("final", f"requeued {history.preemptions} times already: not requeued again")
        return Decision(
            "requeue",
            "trainer checkpointed and asked for a requeue (signal or time limit): "
            "requeued, resumes from checkpoint",
        )
    if state == S.PREEMPTED:
        return Decision(
            "requeue", "preempted: requeued" + (" (resumes from checkpoint)" if has_checkpoint else "")
        )
    if state == S.TIMEOUT:
        if not has_checkpoint:
            return Decision(
                "final",
                "time limit reached with no checkpoint: not requeued (it would redo the "
                "same work); raise time_limit or set trainer.save_interval",
            )
        if history.timeouts >= MAX_TIMEOUTS:
            return Decision("final", f"time limit reached {history.timeouts + 1} times: not requeued again")
        return Decision("requeue", "time limit reached: requeued, resumes from checkpoint")
    if state == S.CANCELLED:
        return Decision("final", "cancelled")
    sig = state.lower() if S.is_retryable(state) else flaky_signature(kinds)
    if sig is not None:
        if history.retries < max_retries:
            return Decision("retry", f"flaky failure ({sig}): retry {history.retries + 1}/{max_retries}")
        return Decision(
            "final",
            f"flaky failure ({sig}) after {history.retries} retries (cluster.max_retries={max_retries})",
        )
    return Decision("final", "deterministic failure: not retried")


def history_of(rows: list) -> History:
    """What the earlier jobs of a run (jobs_table.JobRow, oldest first) used up."""
    h = History()
    for r in rows:
        if r.action == "retry":
            h.retries += 1
        elif r.action == "requeue" and r.state == S.TIMEOUT and r.exit_code != REQUEUE_EXIT_CODE:
            h.timeouts += 1
        elif r.action == "requeue":
            h.preemptions += 1
    return h

"""Job states: the one table of what each scheduler state means (like submitit's state handling of SLURM's
documented job state codes: https://slurm.schedmd.com/sacct.html#SECTION_JOB-STATE-CODES and
https://slurm.schedmd.com/squeue.html#SECTION_JOB-STATE-CODES), plus the two states mimo-jobs adds
(SUBMITTED: recorded, not yet seen by the scheduler; UNKNOWN: the scheduler does not say).

Torch-free and pure: the jobs table, the executors, the policy, status, ingest and report ask it.
"""

from __future__ import annotations

from dataclasses import dataclass

SUBMITTED = "SUBMITTED"
UNKNOWN = "UNKNOWN"
PENDING = "PENDING"
RUNNING = "RUNNING"
COMPLETED = "COMPLETED"
FAILED = "FAILED"
CANCELLED = "CANCELLED"
TIMEOUT = "TIMEOUT"
PREEMPTED = "PREEMPTED"
NODE_FAIL = "NODE_FAIL"
BOOT_FAIL = "BOOT_FAIL"
OUT_OF_MEMORY = "OUT_OF_MEMORY"
REQUEUED = "REQUEUED"


@dataclass(frozen=True)
class JobState:
    name: str
    terminal: bool  # the job has ended: nothing of it runs or waits to run
    success: bool = False  # it ended well
    # It ended through the infrastructure, not the program: another attempt may well pass (SLURM itself
    # requeues a `--requeue` job after a node failure or a preemption).
    retryable: bool = False
    event: str | None = None  # the event kind (contract/events.py) this final state stands for

    @property
    def failed(self) -> bool:
        return self.terminal and not self.success


STATES: tuple[JobState, ...] = (
    JobState(SUBMITTED, False),
    JobState(UNKNOWN, False),
    JobState(PENDING, False),
    JobState("CONFIGURING", False),
    JobState(RUNNING, False),
    JobState("COMPLETING", False),
    JobState(REQUEUED, False, event="requeue"),
    JobState("REQUEUE_HOLD", False),
    JobState("REQUEUE_FED", False),
    JobState("RESIZING", False),
    JobState("SUSPENDED", False),
    JobState("STOPPED", False),
    JobState("SIGNALING", False),
    JobState("STAGE_OUT", False),
    JobState("RESV_DEL_HOLD", False),
    JobState(COMPLETED, True, success=True),
    JobState(FAILED, True),
    JobState(CANCELLED, True),
    JobState(TIMEOUT, True, event="time_limit"),
    JobState(PREEMPTED, True, retryable=True, event="preemption"),
    JobState(NODE_FAIL, True, retryable=True, event="node_fail"),
    JobState(BOOT_FAIL, True, retryable=True),
    JobState(OUT_OF_MEMORY, True, event="oom"),
    JobState("DEADLINE", True),
    JobState("REVOKED", True),
    JobState("SPECIAL_EXIT", True),
)
BY_NAME: dict[str, JobState] = {s.name: s for s in STATES}

ACTIVE = frozenset(s.name for s in STATES if not s.terminal)
SUCCESS = frozenset(s.name for s in STATES if s.success)
# sacct's final states that ingest records as an event of the job (state -> event kind)
EVENTS: dict[str, str] = {s.name: s.event for s in STATES if s.event}


def state(name: str) -> JobState:
    """The state of that name; a name no scheduler documents counts as ended and failed (never waited on)."""
    return BY_NAME.get(name) or JobState(name, True)


def is_active(name: str) -> bool:
    return not state(name).terminal


def is_success(name: str) -> bool:
    return state(name).success


def is_failed(name: str) -> bool:
    return state(name).failed


def is_retryable(name: str) -> bool:
    return state(name).retryable

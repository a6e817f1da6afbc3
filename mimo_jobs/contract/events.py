"""Event kinds: the names ingest stores in the events table, with each kind's family and role.

Torch-free and pure: ingest (which finds the events), report (triage, run state) and the submit policy
(what is worth another attempt) all read the kinds from here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# a rank's own failure
TRACEBACK = "traceback"
OOM = "oom"
SEGFAULT = "segfault"
NODE_FAIL = "node_fail"
CUDA_ERROR = "cuda_error"  # illegal memory access and other CUDA faults
GPU_XID = "gpu_xid"  # an NVIDIA driver Xid event
GPU_ECC = "gpu_ecc"  # an uncorrectable ECC error
# launcher summaries of a failure seen elsewhere
CHILD_FAILED = "child_failed"  # torchrun's "Root Cause (first observed failure)"
CHILD_FAILED_OTHER = "child_failed_other"  # an entry of torchrun's "Failures:" list
TASK_EXIT = "task_exit"  # srun's "task N: Exited with exit code" / "task N: Killed"
# a rank that waited on a peer that failed or hung
NCCL_TIMEOUT = "nccl_timeout"
GLOO_TIMEOUT = "gloo_timeout"
PEER_LOST = "peer_lost"
# what the scheduler did
TIME_LIMIT = "time_limit"
PREEMPTION = "preemption"
REQUEUE = "requeue"
CANCELLED = "cancelled"
# lifecycle
CHECKPOINT_SAVED = "checkpoint_saved"
CHECKPOINT_LOADED = "checkpoint_loaded"
END = "end"

# roles (report/triage.py's order of evidence)
ROOT = "root"
SUMMARY = "summary"
VICTIM = "victim"
SCHEDULER = "scheduler"
INFO = "info"


@dataclass(frozen=True)
class Kind:
    name: str
    role: str  # root | summary | victim | scheduler | info
    family: str  # what failed: program, memory, gpu, node, network, launcher, scheduler, checkpoint, run
    # A job that failed with it may well pass on another attempt (infrastructure, not the program): the
    # submit policy retries such a job within cluster.max_retries; the rest are deterministic or the
    # scheduler's own decision (requeue, time limit: handled by their SLURM state).
    retry: bool = False


KINDS: tuple[Kind, ...] = (
    Kind(TRACEBACK, ROOT, "program"),
    Kind(OOM, ROOT, "memory"),
    Kind(SEGFAULT, ROOT, "program"),
    Kind(NODE_FAIL, ROOT, "node", retry=True),
    Kind(CUDA_ERROR, ROOT, "gpu"),
    Kind(GPU_XID, ROOT, "gpu"),
    Kind(GPU_ECC, ROOT, "gpu"),
    Kind(CHILD_FAILED, SUMMARY, "launcher"),
    Kind(CHILD_FAILED_OTHER, SUMMARY, "launcher"),
    Kind(TASK_EXIT, SUMMARY, "launcher"),
    Kind(NCCL_TIMEOUT, VICTIM, "nccl", retry=True),
    Kind(GLOO_TIMEOUT, VICTIM, "gloo", retry=True),
    Kind(PEER_LOST, VICTIM, "network", retry=True),
    Kind(TIME_LIMIT, SCHEDULER, "scheduler"),
    Kind(PREEMPTION, SCHEDULER, "scheduler"),
    Kind(REQUEUE, SCHEDULER, "scheduler"),
    Kind(CANCELLED, SCHEDULER, "scheduler"),
    Kind(CHECKPOINT_SAVED, INFO, "checkpoint"),
    Kind(CHECKPOINT_LOADED, INFO, "checkpoint"),
    Kind(END, INFO, "run"),
)
BY_NAME: dict[str, Kind] = {k.name: k for k in KINDS}


def kinds_of(role: str) -> tuple[str, ...]:
    """The kind names of one role, in table order."""
    return tuple(k.name for k in KINDS if k.role == role)


ROOT_KINDS = kinds_of(ROOT)
SUMMARY_KINDS = kinds_of(SUMMARY)
VICTIM_KINDS = kinds_of(VICTIM)
SCHEDULER_KINDS = kinds_of(SCHEDULER)
INFO_KINDS = kinds_of(INFO)
FAILURE_KINDS = ROOT_KINDS + SUMMARY_KINDS + VICTIM_KINDS  # a job with one of these failed
RETRY_KINDS = tuple(k.name for k in KINDS if k.retry)


def family(kind: str) -> str:
    """The family of an event kind (a clear error for a name not in the table)."""
    try:
        return BY_NAME[kind].family
    except KeyError:
        raise ValueError(f"unknown event kind {kind!r} (known: {', '.join(BY_NAME)})") from None


def worth_retry(kind: str) -> bool:
    """Whether a job that failed with this kind of event may pass on another attempt."""
    try:
        return BY_NAME[kind].retry
    except KeyError:
        raise ValueError(f"unknown event kind {kind!r} (known: {', '.join(BY_NAME)})") from None


# What a failure message says about its cause: both ingest (which event is the root) and the report's
# triage (which rank failed first) decide with these.
_VICTIM_MSG_RE = re.compile(
    r"Timed out waiting|Connection closed by peer|Connection reset by peer|Watchdog caught|"
    r"collective operation timeout|DistNetworkError|NCCL communicator was aborted|"
    r"remote process exited|Broken pipe|failed to recv|ncclRemoteError",
    re.I,
)
# How the trainer says why it stopped without a traceback (a bad run.yaml, a refused checkpoint: an error
# meant for a person, main.py's exit 2 or 1): ingest reads such a line as the rank's own failure.
TRAINER_ERROR = "mimo-jobs trainer: error: "

_LAUNCHER_EXCEPTION_RE = re.compile(r"\bChildFailedError\b")


def is_victim_message(msg: str) -> bool:
    """A failure that only says a peer went away or a collective timed out (a consequence, not a cause)."""
    return bool(_VICTIM_MSG_RE.search(msg))


def is_launcher_exception(msg: str) -> bool:
    """The launcher's own exception (torchrun's ChildFailedError): it only says that a child failed; the
    summary after it names the rank and how it ended."""
    return bool(_LAUNCHER_EXCEPTION_RE.search(msg))

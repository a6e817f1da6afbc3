"""A TrainJob's conditions and its pods as the facts every executor reports (`JobFacts`: a state of
contract/jobstates.py, exit code, times, nodes, reason). Pure: the objects come as the API's JSON.

TrainJob conditions (Kubeflow Trainer, pkg/apis/trainer/v1alpha1/trainjob_types.go): `Suspended` (reason
`Suspended`, or `Resumed` once it is False again), `Complete`, `Failed` (reasons such as
`DeadlineExceeded`). Kueue holds a TrainJob suspended until it admits it, and suspends it again when it
evicts it (preemption by a higher priority, a lost node): its pods are deleted and recreated on
readmission, where the trainer resumes from its last checkpoint.

How the facts map onto the states the SLURM path reports (and so onto the same policy and triage):

| what Kubernetes says                                        | state          | why                            |
|-------------------------------------------------------------|----------------|--------------------------------|
| condition Complete                                          | COMPLETED      |                                |
| Failed, a pod disrupted by preemption (DisruptionTarget     | PREEMPTED      | requeued; resumes from its     |
|   PreemptionByScheduler, or a Kueue eviction)               |                | checkpoint                     |
| Failed, a container terminated OOMKilled                    | OUT_OF_MEMORY  | the `oom` failure class        |
| Failed, a pod Evicted (node pressure, drain)                | NODE_FAIL      | retried like a node failure    |
| Failed with reason DeadlineExceeded                         | TIMEOUT        | the time limit                 |
| Failed, otherwise                                           | FAILED         | with the node container's exit |
|                                                             |                | code (75: the trainer asked    |
|                                                             |                | for a requeue)                 |
| Suspended (waiting for Kueue admission, or evicted by it)   | PENDING        | reason: Kueue's (its Workload) |
| a container waiting ErrImagePull/ImagePullBackOff           | PENDING        | reason says so (may clear)     |
| InvalidImageName, ErrImageNeverPull                         | BOOT_FAIL      | the pod can never start        |
| a container in CrashLoopBackOff                             | RUNNING        | reason says so (restarting)    |
| a pod Running                                               | RUNNING        |                                |
| no pods yet, or pods Pending                                | PENDING        | reason: unschedulable etc.     |
| the TrainJob is gone (deleted by `cancel` or by hand)       | CANCELLED      |                                |

A suspended TrainJob's own condition says only that it is suspended ("TrainJob is suspended", Kubeflow
Trainer pkg/constants); why it waits is on the Workload Kueue made for it: its `QuotaReserved` condition,
False while it waits (reason `Pending` or `Inadmissible`, message e.g. "couldn't assign flavors to pod set
node: insufficient unused quota for nvidia.com/gpu in flavor h100, 8 more needed"), and `Evicted`, True
when Kueue took its quota back (message e.g. "Preempted to accommodate a higher priority Workload").
"""

from __future__ import annotations

from datetime import datetime, timezone

from mimo_jobs.contract import jobstates as S
from mimo_jobs.submit.jobs_table import JobFacts

from .manifest import COMPLETION_INDEX_LABEL, NODE, RESTART_ATTEMPT_LABEL

PREEMPTION_REASONS = ("PreemptionByScheduler", "PreemptionByKubeScheduler", "TerminationByKueue")
EVICTION_REASONS = ("Evicted", "EvictionByEvictionAPI", "TerminationByKubelet", "DeletionByTaintManager")
NEVER_STARTS = ("InvalidImageName", "ErrImageNeverPull")
PULL_WAITS = ("ErrImagePull", "ImagePullBackOff")


def api_time(s: str | None) -> datetime | None:
    """An API timestamp (RFC 3339, UTC) as naive UTC, the jobs table's convention."""
    if not s:
        return None
    return datetime.fromisoformat(s.replace("Z", "+00:00")).astimezone(timezone.utc).replace(tzinfo=None)


def condition(obj: dict | None, kind: str) -> dict | None:
    """The object's condition of that type when its status is True."""
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == kind and c.get("status") == "True":
            return c
    return None


def ended(trainjob: dict | None) -> bool:
    """Whether the TrainJob has finished (its Complete or Failed condition is set)."""
    return condition(trainjob, "Complete") is not None or condition(trainjob, "Failed") is not None


def held(trainjob: dict | None) -> bool:
    """Whether the TrainJob is suspended and not ended: Kueue's Workload says why (kueue_reason)."""
    return condition(trainjob, "Suspended") is not None and not ended(trainjob)


def kueue_reason(workload: dict | None) -> str | None:
    """Why Kueue holds the job: its Workload's eviction, then what its quota reservation waits for."""
    parts = []
    evicted = condition(workload, "Evicted")
    if evicted:
        parts.append(f"evicted: {evicted.get('message') or evicted.get('reason')}")
    for c in ((workload or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == "QuotaReserved" and c.get("status") == "False":
            parts.append(c.get("message") or c.get("reason") or "waiting for quota")
    return "; ".join(p for p in parts if p) or None


def node_rank(pod: dict) -> int:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    v = labels.get(COMPLETION_INDEX_LABEL, "")
    return int(v) if str(v).isdigit() else 0


def latest_pods(pods: list[dict]) -> list[dict]:
    """The pods of the JobSet's latest restart attempt, by node rank."""

    def attempt(p: dict) -> int:
        v = ((p.get("metadata") or {}).get("labels") or {}).get(RESTART_ATTEMPT_LABEL, "0")
        return int(v) if str(v).isdigit() else 0

    top = max((attempt(p) for p in pods), default=0)
    return sorted((p for p in pods if attempt(p) == top), key=node_rank)


def _containers(pod: dict) -> list[dict]:
    st = pod.get("status") or {}
    return [c for c in st.get("containerStatuses") or [] if c.get("name") == NODE] or list(
        st.get("containerStatuses") or []
    )


def _terminated(c: dict) -> dict | None:
    """The container's termination: its current one, else the last (a restarted container)."""
    return ((c.get("state") or {}).get("terminated")) or ((c.get("lastState") or {}).get("terminated"))


def _waiting(pods: list[dict]) -> tuple[str, str] | None:
    for p in pods:
        for c in _containers(p):
            w = (c.get("state") or {}).get("waiting")
            if w and w.get("reason"):
                return w["reason"], w.get("message") or ""
    return None


def _disruption(pod: dict) -> str | None:
    """The reason of the pod's DisruptionTarget condition (set when it is preempted or evicted)."""
    c = condition(pod, "DisruptionTarget")
    return c.get("reason") if c else None


def _where(pod: dict) -> str:
    return f"node rank {node_rank(pod)} ({(pod.get('metadata') or {}).get('name', '?')})"


def failure(pods: list[dict], failed: dict) -> tuple[str, int | None, str]:
    """(state, exit code, reason) of a TrainJob whose Failed condition is set."""
    if failed.get("reason") == "DeadlineExceeded":
        return S.TIMEOUT, None, f"time limit reached (TrainJob {failed.get('message') or 'DeadlineExceeded'})"
    for p in pods:
        if _disruption(p) in PREEMPTION_REASONS:
            return S.PREEMPTED, None, f"{_where(p)} preempted ({_disruption(p)})"
    for p in pods:
        for c in _containers(p):
            t = _terminated(c)
            if t and t.get("reason") == "OOMKilled":
                return S.OUT_OF_MEMORY, t.get("exitCode"), f"{_where(p)}: container OOMKilled"
    for p in pods:
        reason = (p.get("status") or {}).get("reason") or _disruption(p)
        if reason in EVICTION_REASONS:
            msg = (p.get("status") or {}).get("message") or reason
            return S.NODE_FAIL, None, f"{_where(p)} evicted: {msg}"
    codes = [
        (t.get("exitCode"), p)
        for p in pods
        for c in _containers(p)
        if (t := _terminated(c)) and t.get("exitCode") not in (None, 0)
    ]
    if codes:
        code, p = codes[0]
        return S.FAILED, code, f"{_where(p)} exited {code}: {failed.get('message') or failed.get('reason')}"
    return (
        S.FAILED,
        None,
        f"TrainJob failed: {failed.get('reason')}: {failed.get('message') or ''}".rstrip(": "),
    )


def facts(job_id: str, trainjob: dict | None, pods: list[dict], workload: dict | None = None) -> JobFacts:
    """The job's facts from its TrainJob (None: gone), the pods JobSet made for it and, for a suspended
    one, the Workload Kueue gates it with (None: none, or not readable)."""
    if trainjob is None:  # created before submit returned, so gone means deleted: by `cancel`, or by hand
        return JobFacts(
            job_id,
            S.CANCELLED,
            end_time=datetime.now(timezone.utc).replace(tzinfo=None),
            reason="TrainJob deleted (mimo-jobs cancel, or kubectl delete)",
        )
    pods = latest_pods(pods)
    meta = trainjob.get("metadata") or {}
    submitted = api_time(meta.get("creationTimestamp"))
    started = min(
        (t for p in pods if (t := api_time((p.get("status") or {}).get("startTime")))), default=None
    )
    nodes = ",".join(n for p in pods if (n := (p.get("spec") or {}).get("nodeName"))) or None

    def out(state: str, code: int | None = None, end: datetime | None = None, reason: str | None = None):
        return JobFacts(job_id, state, code, submitted, started, end, nodes, reason)

    done = condition(trainjob, "Complete")
    if done:
        return out(S.COMPLETED, 0, api_time(done.get("lastTransitionTime")))
    failed = condition(trainjob, "Failed")
    if failed:
        state, code, why = failure(pods, failed)
        return out(state, code, api_time(failed.get("lastTransitionTime")), why)
    if held(trainjob):
        suspended = condition(trainjob, "Suspended") or {}
        why = kueue_reason(workload)
        if why:
            return out(S.PENDING, reason=f"suspended by Kueue: {why}")
        return out(
            S.PENDING, reason=f"suspended: {suspended.get('message') or 'waiting for admission by Kueue'}"
        )
    waiting = _waiting(pods)
    if waiting and waiting[0] in NEVER_STARTS:
        return out(S.BOOT_FAIL, reason=f"{waiting[0]}: {waiting[1]}".rstrip(": "))
    phases = [(p.get("status") or {}).get("phase") for p in pods]
    if "Running" in phases:
        why = f"{waiting[0]}: {waiting[1]}".rstrip(": ") if waiting else None
        return out(S.RUNNING, reason=why)
    if waiting:
        return out(S.PENDING, reason=f"{waiting[0]}: {waiting[1]}".rstrip(": "))
    for p in pods:
        c = next(
            (c for c in (p.get("status") or {}).get("conditions") or [] if c.get("type") == "PodScheduled"),
            None,
        )
        if c and c.get("status") == "False":
            return out(S.PENDING, reason=f"{c.get('reason')}: {c.get('message') or ''}".rstrip(": "))
    if pods and all(ph in ("Succeeded", "Failed") for ph in phases):
        return out("COMPLETING", reason="pods ended; waiting for the TrainJob's condition")
    return out(S.PENDING, reason=None if pods else "no pods yet (waiting for admission and JobSet)")

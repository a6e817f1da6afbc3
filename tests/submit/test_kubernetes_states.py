"""TrainJob conditions and pod states as the job states and failure classes the SLURM path reports, and
what the retry/requeue policy then does with them (submit/policy.py, the one policy for every executor).
The objects are written as the API server returns them (core/v1 Pod status, metav1 Condition)."""

from __future__ import annotations

import pytest

from mimo_jobs.contract import jobstates
from mimo_jobs.submit import policy
from mimo_jobs.submit.executors.kubernetes.states import facts

JOB = "mj-0123456789ab-a0"


def trainjob(*conditions: tuple[str, str, str]) -> dict:
    return {
        "metadata": {"name": JOB, "creationTimestamp": "2026-11-28T10:00:00Z"},
        "status": {
            "conditions": [
                {
                    "type": t,
                    "status": "True",
                    "reason": r,
                    "message": m,
                    "lastTransitionTime": "2026-11-28T11:00:00Z",
                }
                for t, r, m in conditions
            ]
        },
    }


def pod(rank: int = 0, phase: str = "Running", state: dict | None = None, restart: int = 0, **status) -> dict:
    return {
        "metadata": {
            "name": f"{JOB}-node-0-{rank}-abcde",
            "labels": {
                "jobset.sigs.k8s.io/jobset-name": JOB,
                "jobset.sigs.k8s.io/restart-attempt": str(restart),
                "batch.kubernetes.io/job-completion-index": str(rank),
            },
        },
        "spec": {"nodeName": f"node-{rank}"},
        "status": {
            "phase": phase,
            "startTime": "2026-11-28T10:05:00Z",
            "containerStatuses": [{"name": "node", "state": state or {"running": {}}}],
            **status,
        },
    }


FAILED = ("Failed", "FailedJobs", "jobset failed")
TERMINATED = {"terminated": {"exitCode": 1, "reason": "Error"}}


@pytest.mark.parametrize(
    "tj, pods, state, code, reason_has, action",
    [
        (trainjob(("Complete", "JobsCompleted", "")), [pod(phase="Succeeded")], "COMPLETED", 0, None, "done"),
        (  # preempted by the scheduler: requeued, the next attempt resumes from the checkpoint
            trainjob(FAILED),
            [
                pod(
                    1,
                    "Failed",
                    TERMINATED,
                    conditions=[
                        {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}
                    ],
                )
            ],
            "PREEMPTED",
            None,
            "preempted (PreemptionByScheduler)",
            "requeue",
        ),  # fmt: skip
        (
            trainjob(FAILED),
            [pod(0, "Running"), pod(1, "Failed", {"terminated": {"exitCode": 137, "reason": "OOMKilled"}})],
            "OUT_OF_MEMORY",
            137,
            "node rank 1",
            "final",
        ),  # fmt: skip
        (  # a node under memory pressure evicts the pod: retried like a node failure
            trainjob(FAILED),
            [pod(0, "Failed", reason="Evicted", message="The node was low on resource: memory.")],
            "NODE_FAIL",
            None,
            "low on resource",
            "retry",
        ),  # fmt: skip
        (
            trainjob(("Failed", "DeadlineExceeded", "")),
            [pod(0, "Failed", TERMINATED)],
            "TIMEOUT",
            None,
            "time limit",
            "requeue",
        ),
        (  # the trainer saved and asked for a requeue (launch.sh's exit 75)
            trainjob(FAILED),
            [pod(0, "Failed", {"terminated": {"exitCode": 75, "reason": "Error"}})],
            "FAILED",
            75,
            "exited 75",
            "requeue",
        ),  # fmt: skip
        (trainjob(FAILED), [pod(0, "Failed", TERMINATED)], "FAILED", 1, "exited 1", "final"),
        (
            trainjob(("Suspended", "Suspended", "Workload evicted: Preempted")),
            [],
            "PENDING",
            None,
            "Preempted",
            None,
        ),
        (
            trainjob(),
            [pod(0, "Pending", {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling"}})],
            "PENDING",
            None,
            "ImagePullBackOff",
            None,
        ),  # fmt: skip
        (
            trainjob(),
            [pod(0, "Pending", {"waiting": {"reason": "InvalidImageName", "message": "bad ref"}})],
            "BOOT_FAIL",
            None,
            "InvalidImageName",
            "retry",
        ),  # fmt: skip
        (
            trainjob(),
            [pod(0, "Running", {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 5m"}})],
            "RUNNING",
            None,
            "CrashLoopBackOff",
            None,
        ),  # fmt: skip
        (trainjob(), [], "PENDING", None, "no pods yet", None),
        (None, [], "CANCELLED", None, "deleted", "final"),
    ],
)
def test_trainjob_and_pods_map_onto_the_slurm_states(tj, pods, state, code, reason_has, action):
    f = facts(JOB, tj, pods)
    assert (f.state, f.exit_code) == (state, code)
    if reason_has:
        assert reason_has in (f.reason or ""), f.reason
    if action is None:
        assert jobstates.is_active(f.state)
        return
    assert not jobstates.is_active(f.state)
    d = policy.classify(f.state, f.exit_code, set(), policy.History(), max_retries=2, has_checkpoint=True)
    assert d.action == action, d


def test_only_the_latest_jobset_restart_counts():
    """JobSet restarts its pods with the next restart-attempt label; a failed pod of an earlier attempt
    does not make the running job a failure."""
    old = pod(0, "Failed", {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}, restart=0)
    new = pod(0, "Running", restart=1)
    assert facts(JOB, trainjob(), [old, new]).state == "RUNNING"
    f = facts(JOB, trainjob(FAILED), [old, pod(0, "Failed", TERMINATED, restart=1)])
    assert (f.state, f.exit_code) == ("FAILED", 1)

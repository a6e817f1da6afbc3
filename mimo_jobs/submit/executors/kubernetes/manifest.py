"""The TrainJob of a run (trainer.kubeflow.org/v1alpha1, Kubeflow Trainer v2.3), pure: no client, no I/O.

A run's job on Kubernetes is a TrainJob on the runtime the study names (default: the `torch-distributed`
ClusterTrainingRuntime, whose one replicated job and its container are both called `node`):

- `spec.trainer`: numNodes (the run's nodes), numProcPerNode and resourcesPerNode (its GPUs), the image,
  and the command `<run dir>/launch.sh` (under POD_SHELL): the same torchrun launch SLURM starts on every
  node. The
  runtime's torch plugin sets PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK (the pod's completion index),
  PET_MASTER_ADDR and PET_MASTER_PORT; launch.sh passes them to torchrun with `--node-rank`, so global
  rank = node rank x GPUs per node + local rank, the layout SLURM gives.
- `spec.runtimePatches` (the v2.2+ place for per-job pod settings; `podTemplateOverrides` is gone): the PVC
  holding the runs root, mounted at the runs root's own path so every path in run.yaml and launch.sh holds
  in the pod; a memory-backed /dev/shm; node selector, tolerations, pull secrets, service account and the
  grace period the trainer needs to checkpoint after SIGTERM.
- `spec.activeDeadlineSeconds`: the run's time limit plus the grace period. launch.sh sets the trainer's
  own deadline (MIMO_JOB_DEADLINE, as sbatch.sh does under SLURM) to the time limit from the node's start,
  so the trainer saves and stops before Kubernetes ends the job.
- labels: the Kueue queue (`kueue.x-k8s.io/queue-name`) and priority (`kueue.x-k8s.io/priority-class`), the
  run id and attempt; annotations: study, run and run directory.

The job id is the TrainJob's name, `mj-<run id>-a<attempt>`: an RFC 1035 label well under the 63
characters the names JobSet derives from it may take.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

API_VERSION = "trainer.kubeflow.org/v1alpha1"
GROUP, VERSION, PLURAL, KIND = "trainer.kubeflow.org", "v1alpha1", "trainjobs", "TrainJob"
NODE = "node"  # the torch-distributed runtime's replicated job and its trainer container
MANAGER = "mimo-jobs"  # runtimePatches are keyed by who wrote them
RUNS_VOLUME = "mimo-jobs-runs"
SHM_VOLUME = "mimo-jobs-shm"
LABEL_RUN_ID = "mimo-jobs.io/run-id"
LABEL_ATTEMPT = "mimo-jobs.io/attempt"
ANNOTATION_STUDY = "mimo-jobs.io/study"
ANNOTATION_RUN = "mimo-jobs.io/run"
ANNOTATION_RUN_DIR = "mimo-jobs.io/run-dir"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
# Kueue gates a TrainJob through a Workload it labels with the TrainJob's uid (sigs.k8s.io/kueue
# pkg/controller/constants: JobUIDLabel); v1beta2 is its current API, v1beta1 the one before
KUEUE_GROUP, KUEUE_VERSIONS, KUEUE_PLURAL = "kueue.x-k8s.io", ("v1beta2", "v1beta1"), "workloads"
KUEUE_JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
# Labels JobSet puts on every pod it creates (sigs.k8s.io/jobset), and the Job controller's index label
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
RESTART_ATTEMPT_LABEL = "jobset.sigs.k8s.io/restart-attempt"
COMPLETION_INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
# Variables the Trainer's torch plugin owns: its webhook refuses a TrainJob whose env sets them
RESERVED_ENV_PREFIX = "PET_"


# The container's command: launch.sh under a shell that passes the kubelet's SIGTERM on. In a pod only the
# main process gets it (SLURM signals every process of the step); launch.sh runs in a session of its own
# and gets TERM on its whole group, so torchrun forwards it to the trainer, which saves a checkpoint.
POD_SHELL = (
    'setsid bash "$1" & pid=$!; trap \'kill -TERM -- "-$pid" 2>/dev/null\' TERM; '
    'while :; do wait "$pid"; rc=$?; kill -0 "$pid" 2>/dev/null || exit "$rc"; done'
)


def job_name(run_id: str, attempt: int) -> str:
    return f"mj-{run_id}-a{attempt}"


def attempt_of(name: str) -> int | None:
    head, sep, tail = name.rpartition("-a")
    return int(tail) if sep and head.startswith("mj-") and tail.isdigit() else None


def runs_root_of(rd_root: Path) -> Path:
    """The runs root a run directory lies in (<runs root>/<study>/<run dir>): the PVC's mount path."""
    return rd_root.parent.parent


def trainjob(spec, rd, attempt: int = 0) -> dict[str, Any]:
    """The TrainJob of attempt `attempt` of the run (`spec`: RunSpec, `rd`: its RunDir)."""
    k = spec.cluster.section("kubernetes")
    name = job_name(spec.run_id, attempt)
    labels = {LABEL_RUN_ID: spec.run_id, LABEL_ATTEMPT: str(attempt)}
    if k.queue:
        labels[QUEUE_LABEL] = k.queue
    if k.priority_class:
        labels[PRIORITY_LABEL] = k.priority_class
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {
            "name": name,
            "namespace": k.namespace,
            "labels": labels,
            "annotations": {
                ANNOTATION_STUDY: spec.study,
                ANNOTATION_RUN: spec.name,
                ANNOTATION_RUN_DIR: str(rd.root),
            },
        },
        "spec": {
            "runtimeRef": {"apiGroup": GROUP, "kind": k.runtime_kind, "name": k.runtime},
            "activeDeadlineSeconds": _time_limit_s(spec) + k.termination_grace_s,
            "trainer": _trainer(spec, rd, name, attempt),
            "runtimePatches": [_pod_patch(k, runs_root_of(rd.root)), *k.runtime_patches],
        },
    }


def _time_limit_s(spec) -> int:
    return spec.cluster.model_copy(update={"time_limit": spec.time_limit}).time_limit_seconds()


def _trainer(spec, rd, name: str, attempt: int) -> dict[str, Any]:
    c, k = spec.cluster, spec.cluster.section("kubernetes")
    if c.accelerator == "gpu":
        per_node = {k.gpu_resource: str(c.gpus_per_node), **k.resources}
    else:  # CPU: one core per process
        per_node = {"cpu": str(c.gpus_per_node), **k.resources}
    return {
        "numNodes": spec.layout.nodes,
        "numProcPerNode": c.gpus_per_node,
        "image": k.image,
        "command": ["bash", "-c", POD_SHELL, "mimo-jobs-node", str(rd.launch_sh)],
        "env": [
            {"name": "MIMO_JOBS_JOB_ID", "value": name},
            {"name": "MIMO_JOBS_ATTEMPT", "value": str(attempt)},
        ],
        "resourcesPerNode": {"limits": per_node, "requests": dict(per_node)},
    }


def _pod_patch(k, runs_root: Path) -> dict[str, Any]:
    pod: dict[str, Any] = {
        "volumes": [
            {"name": RUNS_VOLUME, "persistentVolumeClaim": {"claimName": k.pvc}},
            {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory"}},  # NCCL and data loaders use /dev/shm
        ],
        "containers": [
            {
                "name": NODE,
                "volumeMounts": [
                    {"name": RUNS_VOLUME, "mountPath": str(runs_root)},
                    {"name": SHM_VOLUME, "mountPath": "/dev/shm"},
                ],
            }
        ],
        "terminationGracePeriodSeconds": k.termination_grace_s,
    }
    if k.node_selector:
        pod["nodeSelector"] = dict(k.node_selector)
    if k.tolerations:
        pod["tolerations"] = list(k.tolerations)
    if k.image_pull_secrets:
        pod["imagePullSecrets"] = [{"name": s} for s in k.image_pull_secrets]
    if k.service_account:
        pod["serviceAccountName"] = k.service_account
    job = {"name": NODE, "template": {"spec": {"template": {"spec": pod}}}}
    return {"manager": MANAGER, "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [job]}}}}


def for_attempt(manifest: dict[str, Any], attempt: int) -> dict[str, Any]:
    """The rendered manifest (attempt 0, as trainjob.yaml holds it) for another attempt: its name, attempt
    label and the MIMO_JOBS_* variables launch.sh reads; the rest as rendered."""
    import copy

    m = copy.deepcopy(manifest)
    run_id = m["metadata"]["labels"][LABEL_RUN_ID]
    name = job_name(run_id, attempt)
    m["metadata"]["name"] = name
    m["metadata"]["labels"][LABEL_ATTEMPT] = str(attempt)
    for e in m["spec"]["trainer"]["env"]:
        if e["name"] == "MIMO_JOBS_JOB_ID":
            e["value"] = name
        elif e["name"] == "MIMO_JOBS_ATTEMPT":
            e["value"] = str(attempt)
    return m

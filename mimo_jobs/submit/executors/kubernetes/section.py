"""`cluster.kubernetes`: where and how a study's runs become TrainJobs. Pydantic only (the study schema
imports it); the manifest is built from it in manifest.py."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# Kubernetes object names (RFC 1123 labels: namespaces, PVCs, queues, runtimes) and label values
DNS_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\Z")
DNS_SUBDOMAIN_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?\Z")
IMAGE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_./@:+-]{0,511}\Z")
RESOURCE_RE = re.compile(r"^([a-z0-9.-]+/)?[A-Za-z0-9][A-Za-z0-9_.-]{0,62}\Z")
QUANTITY_RE = re.compile(r"^[0-9]+(\.[0-9]+)?([eE][0-9]+|[numkMGTPE]|[KMGTPE]i)?\Z")
# The image the project's Dockerfile builds (`docker build -t mimo-jobs .`, docs/container.md); a cluster
# pulls it from a registry, so a study names the pushed reference.
DEFAULT_IMAGE = "mimo-jobs:latest"
# TrainJob spec fields that Kubeflow Trainer removed: podTemplateOverrides went in v2.2 (replaced by
# runtimePatches, kubeflow/trainer PR #3309). The API server would drop them silently where it prunes.
REMOVED_FIELDS = {"podTemplateOverrides": "runtimePatches", "pod_template_overrides": "runtime_patches"}


def removed_field_message(key: str, where: str) -> str:
    return (
        f"{where}{key}: removed from the TrainJob API in Kubeflow Trainer v2.2 (replaced by "
        f"{REMOVED_FIELDS[key]}); per-job volumes, tolerations and node selectors go in runtimePatches "
        "(docs/kubernetes.md)"
    )


class KubernetesSection(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    pvc: str  # the PersistentVolumeClaim that holds the runs root (mounted at the same path in every pod)
    namespace: str = "default"
    context: str | None = None  # kubeconfig context (default: the kubeconfig's current one)
    runtime: str = "torch-distributed"
    runtime_kind: Literal["ClusterTrainingRuntime", "TrainingRuntime"] = "ClusterTrainingRuntime"
    image: str = DEFAULT_IMAGE
    queue: str | None = None  # Kueue LocalQueue (label kueue.x-k8s.io/queue-name)
    priority_class: str | None = None  # Kueue WorkloadPriorityClass (label kueue.x-k8s.io/priority-class)
    gpu_resource: str = "nvidia.com/gpu"  # the extended resource a node's GPUs are requested as
    resources: dict[str, str] = Field(default_factory=dict)  # more per node, e.g. {memory: 1600Gi}
    service_account: str | None = None
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[dict[str, Any]] = Field(default_factory=list)  # core/v1 Toleration objects
    image_pull_secrets: list[str] = Field(default_factory=list)
    termination_grace_s: int = Field(180, ge=0, le=86_400)  # time to checkpoint after SIGTERM (preemption)
    runtime_patches: list[dict[str, Any]] = Field(default_factory=list)  # more TrainJob runtimePatches

    @model_validator(mode="before")
    @classmethod
    def _removed(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key in REMOVED_FIELDS:
                if key in data:
                    raise ValueError(removed_field_message(key, "cluster.kubernetes."))
        return data

    @field_validator("pvc", "namespace", "runtime", "queue", "priority_class", "service_account")
    @classmethod
    def _name(cls, v: str | None, info) -> str | None:
        rule = DNS_LABEL_RE if info.field_name in ("namespace", "queue") else DNS_SUBDOMAIN_RE
        if v is not None and not rule.match(v):
            raise ValueError(
                f"{v!r} is not a Kubernetes name (lower-case letters, digits and '-', starting and ending "
                "with a letter or digit)"
            )
        return v

    @field_validator("image")
    @classmethod
    def _image(cls, v: str) -> str:
        if not IMAGE_RE.match(v):
            raise ValueError(
                f"{v!r} is not an image reference (e.g. registry.example.com/team/mimo-jobs:0.1)"
            )
        return v

    @field_validator("gpu_resource")
    @classmethod
    def _resource_name(cls, v: str) -> str:
        if not RESOURCE_RE.match(v):
            raise ValueError(f"{v!r} is not a resource name (e.g. nvidia.com/gpu)")
        return v

    @field_validator("resources")
    @classmethod
    def _resources(cls, v: dict[str, str]) -> dict[str, str]:
        for k, q in v.items():
            if not RESOURCE_RE.match(k) or not QUANTITY_RE.match(str(q)):
                raise ValueError(
                    f"resources.{k}: {q!r} is not a resource name and quantity (e.g. memory: 64Gi)"
                )
        return v

    @field_validator("node_selector")
    @classmethod
    def _labels(cls, v: dict[str, str]) -> dict[str, str]:
        for k, x in v.items():
            if not RESOURCE_RE.match(k) or (
                x and not re.match(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?\Z", x)
            ):
                raise ValueError(f"node_selector {k}={x!r} is not a label key and value")
        return v

    @field_validator("image_pull_secrets")
    @classmethod
    def _secrets(cls, v: list[str]) -> list[str]:
        for s in v:
            if not DNS_SUBDOMAIN_RE.match(s):
                raise ValueError(f"image_pull_secrets: {s!r} is not a Secret name")
        return v

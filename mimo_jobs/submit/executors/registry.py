"""The executor registry: every executor by name, with its job side (imported on first use) and its study
section (`cluster.<name>`). Adding an executor is one package under executors/ and one entry here.

Light on purpose: the study schema imports this module (and through it the section models, pydantic
only), never an executor's job side, so `validate` and `render` load no scheduler client.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from .kubernetes.section import KubernetesSection
from .slurm.section import SlurmSection


@dataclass(frozen=True)
class Entry:
    executor: str  # "module:Class" of its job side
    section: type[BaseModel] | None = None  # its study section, cluster.<name>
    # Its section's keys were written flat under `cluster:` before executors had sections: still read there,
    # and hashed there into run ids.
    flat: bool = False
    section_required: bool = False  # a study with `executor: <name>` must give the section
    doc: str = "submit.md"  # the page that describes it


REGISTRY: dict[str, Entry] = {
    "slurm": Entry("mimo_jobs.submit.executors.slurm.executor:SlurmExecutor", SlurmSection, flat=True),
    "local": Entry("mimo_jobs.submit.executors.local.executor:LocalExecutor"),
    "kubernetes": Entry(
        "mimo_jobs.submit.executors.kubernetes.executor:KubernetesExecutor",
        KubernetesSection,
        section_required=True,
        doc="kubernetes.md",
    ),
}


def names() -> str:
    return ", ".join(REGISTRY)


def load(name: str):
    """A new instance of the named executor's job side (its module imported now)."""
    entry = REGISTRY.get(name)
    if entry is None:
        raise ValueError(f"unknown executor {name!r}: use one of {names()}")
    module, _, cls = entry.executor.partition(":")
    return getattr(importlib.import_module(module), cls)()


def section_fields() -> dict[str, tuple[Any, Any]]:
    """The cluster schema's field of each executor section: a flat one always there (its keys had defaults
    before it was a section), the others unset unless a study gives them."""
    from pydantic import Field

    out: dict[str, tuple[Any, Any]] = {}
    for name, e in REGISTRY.items():
        if e.section is None:
            continue
        out[name] = (e.section, Field(default_factory=e.section)) if e.flat else (e.section | None, None)
    return out


def _flat_sections() -> dict[str, type[BaseModel]]:
    return {n: e.section for n, e in REGISTRY.items() if e.flat and e.section is not None}


def nest_flat_keys(data: Any) -> Any:
    """A `cluster:` mapping with a section's keys written flat (the form before sections) moved into its
    section; a key given both flat and in the section is an error naming both."""
    if not isinstance(data, Mapping):
        return data
    out = dict(data)
    for name, model in _flat_sections().items():
        flat = {k: out.pop(k) for k in list(out) if k in model.model_fields}
        if not flat:
            continue
        section = out.get(name)
        if section is None:
            out[name] = flat
        elif isinstance(section, Mapping):
            both = sorted(set(flat) & set(section))
            if both:
                raise ValueError(
                    f"{', '.join(both)} given both flat under cluster and in cluster.{name}: keep one "
                    f"(cluster.{name}.{both[0]})"
                )
            out[name] = {**section, **flat}
    return out


def written_path(loc: tuple, data: Any) -> tuple:
    """A problem's location as the study wrote it: `cluster.slurm.qos` is `cluster.qos` in a study that gave
    the key flat."""
    if len(loc) < 3 or loc[0] != "cluster" or loc[1] not in _flat_sections():
        return loc
    cluster = data.get("cluster") if isinstance(data, Mapping) else None
    if isinstance(cluster, Mapping) and loc[2] in cluster:
        return ("cluster", *loc[2:])
    return loc


def flat_payload(cluster: dict) -> dict:
    """A dumped cluster in the form run ids hash: flat sections' keys at the top (with their defaults, as
    they always were), other sections only when set."""
    out = dict(cluster)
    for name, model in _flat_sections().items():
        out.update(out.pop(name, None) or model().model_dump(mode="json"))
    for name, entry in REGISTRY.items():
        if entry.section is not None and not entry.flat and out.get(name) is None:
            out.pop(name, None)
    return out

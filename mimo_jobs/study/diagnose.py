"""Everything wrong with a study file at once: unset variables, schema errors with their YAML paths, and
every topology rule every point breaks (what `validate` prints)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from mimo_jobs.model.arch import ArchError, ModelArch
from mimo_jobs.model.resolve import arch_of
from mimo_jobs.study.expand import expand_matrix
from mimo_jobs.study.load import interpolate, pydantic_problems, read_yaml
from mimo_jobs.study.runspec import PointResult, RunSpec
from mimo_jobs.study.spec import (
    ClusterSpec,
    MatrixSpec,
    StudyError,
    StudySpec,
    TrainerSpec,
    validation_context,
)


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a study: where (YAML path or point label), which rule, what, and what would fit."""

    path: str
    rule: str  # "yaml", "env", "schema" or a topology rule id (topology.Violation.rule)
    message: str
    fit: str | None = None

    def __str__(self) -> str:
        return f"{self.path}: [{self.rule}] {self.message}" + (f"; {self.fit}" if self.fit else "")


@dataclass
class Diagnosis:
    """Everything `validate` reports: the spec when it parsed, every point, and every problem found."""

    source: str
    study: StudySpec | None
    points: list[PointResult]
    problems: list[Problem]

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def runs(self) -> list[RunSpec]:
        return [p.run for p in self.points if p.run is not None]


def _partial(model: type[BaseModel], data: Any) -> Any:
    try:
        return model.model_validate(data if data is not None else {})
    except ValidationError:
        return None


def _partial_arch(model: Any, source: str) -> ModelArch | None:
    """The model of a study whose other sections are broken, when its own description resolves."""
    try:
        return arch_of(model, validation_context(source)["base_dir"])
    except (ArchError, TypeError):
        return None


def diagnose_data(data: Any, source: str = "<study>", env: dict[str, str] | None = None) -> Diagnosis:
    """Check a study document and report ALL its problems at once: unset ${ENV}, schema errors with their
    YAML paths, and the topology rules every point breaks. When the top level does not validate, the matrix
    is still checked against whatever cluster/trainer parts did (gpus_per_node, the model's experts)."""
    if not isinstance(data, dict):
        return Diagnosis(
            source,
            None,
            [],
            [Problem("<root>", "schema", f"a study is a mapping, got {type(data).__name__}")],
        )
    env_problems: list[tuple[str, str]] = []
    data = interpolate(data, (), dict(os.environ) if env is None else env, env_problems)
    problems = [Problem(p, "env", m) for p, m in env_problems]
    study: StudySpec | None = None
    try:
        study = StudySpec.model_validate(data, context=validation_context(source))
    except ValidationError as e:
        problems += [Problem(p, "schema", m) for p, m in pydantic_problems(e, data=data)]
    if problems and study is not None:
        study = None  # an unset variable was replaced by "": the spec is not what the user meant
    if study is not None:
        matrix, gpn, arch = study.matrix, study.cluster.gpus_per_node, arch_of(study.trainer.model)
    else:
        # Only the two facts the topology needs are taken from the raw cluster/trainer sections.
        matrix = _partial(MatrixSpec, data.get("matrix"))
        cluster = data.get("cluster") if isinstance(data.get("cluster"), dict) else {}
        trainer = data.get("trainer") if isinstance(data.get("trainer"), dict) else {}
        gpn = cluster.get("gpus_per_node", ClusterSpec.model_fields["gpus_per_node"].default)
        gpn = gpn if isinstance(gpn, int) and not isinstance(gpn, bool) and 1 <= gpn <= 64 else None
        arch = _partial_arch(trainer.get("model", TrainerSpec.model_fields["model"].default), source)
        if matrix is None or gpn is None or arch is None:
            return Diagnosis(source, None, [], problems)
    points, point_problems = expand_matrix(
        matrix, gpn, arch.llm.num_experts, study, arch.llm.num_layers, arch
    )
    problems += [Problem(p, "schema", m) for p, m in point_problems]
    for pr in points:
        problems += [Problem(pr.label, v.rule, v.message, v.fit) for v in pr.violations]
    return Diagnosis(source, study, points, problems)


def diagnose(path: str | Path, env: dict[str, str] | None = None) -> Diagnosis:
    """diagnose_data for a study file; unreadable files and YAML syntax errors are problems too."""
    try:
        data = read_yaml(path)
    except StudyError as e:
        where, msg = e.problems[0]
        rule = "file" if where == "<file>" else "yaml"
        return Diagnosis(str(path), None, [], [Problem(where, rule, msg)])
    return diagnose_data(data, str(path), env)

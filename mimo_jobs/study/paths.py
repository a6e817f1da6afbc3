"""The one path rule of a study file: every path it names (data, tokenizer, stats, `trainer.init`, a model's
`hf_config`, and a command's scripts through `{{ study_dir }}`) is taken from the study file's directory
when relative, recorded absolute in run.yaml (spec.absolute_path makes them so), and checked here before any
job is queued: it exists and is the right kind (file or directory). Run ids name these paths relative to the
study, so a study moved with its files keeps its ids.

Pure apart from looking at the file system; `validate` (cli/study.py) reports what `path_problems` finds, and
study/command.py what `script_problems` finds in a rendered command.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Literal

from mimo_jobs.study.spec import MegatronCheckpoint, StudySpec

Kind = Literal["file", "dir", "any"]
RULE = "path"


@dataclass(frozen=True)
class PathProblem:
    """A path that is not there or not of its kind (the shape of diagnose.Problem, which validate prints)."""

    path: str  # the YAML path of the field, or the run whose command names the file
    rule: str
    message: str
    fit: str


@dataclass(frozen=True)
class StudyPath:
    """One path a study names: its YAML path, the absolute path, and what must be there."""

    field: str
    path: str
    kind: Kind
    what: str  # what the file is, for the message


def study_paths(study: StudySpec) -> list[StudyPath]:
    """Every input path of a study's trainer section (a model's hf_config is read, and so checked, when the
    study is; `trainer.checkpoint_dir` is an output, inside the run directory unless absolute)."""
    t, out = study.trainer, []
    if t.data.path:
        out.append(StudyPath("trainer.data.path", t.data.path, "any", "an energon dataset or blend file"))
    if t.data.tokenizer:
        out.append(
            StudyPath("trainer.data.tokenizer", t.data.tokenizer, "dir", "a HuggingFace tokenizer directory")
        )
    if t.data.stats:
        out.append(StudyPath("trainer.data.stats", t.data.stats, "file", "a dataset statistics file"))
    init = t.init
    if init is not None:
        if isinstance(init.llm, MegatronCheckpoint):
            out.append(
                StudyPath("trainer.init.llm.megatron", init.llm.megatron, "dir", "a Megatron checkpoint")
            )
        elif init.llm is not None:
            out.append(StudyPath("trainer.init.llm", init.llm, "dir", "a HuggingFace model directory"))
        if init.encoder is not None:
            out.append(
                StudyPath("trainer.init.encoder", init.encoder, "dir", "a HuggingFace model directory")
            )
        for name, d in (init.encoders or {}).items():
            out.append(StudyPath(f"trainer.init.encoders.{name}", d, "dir", "a HuggingFace model directory"))
        if init.checkpoint is not None:
            out.append(
                StudyPath(
                    "trainer.init.checkpoint", init.checkpoint, "dir", "a mimo-jobs checkpoint directory"
                )
            )
    return out


def on_this_host(study: StudySpec, path: str) -> Path | None:
    """Where this machine sees `path` as the trainer will: the path itself without a container; with one,
    the path at its mount's source when a mount covers it and this machine has that source (a login node
    without the cluster's file systems cannot judge it), else None (inside the image: not judged here)."""
    c = study.cluster.container
    if c is None:
        return Path(path)
    p = PurePosixPath(path)
    mounts = [(m.split(":") + [m])[:2] for m in c.mounts]  # "src:dst[:flags]", or "path" for both
    for src, dst in sorted(mounts, key=lambda sd: -len(sd[1])):  # the deepest mount covering it
        if p == PurePosixPath(dst) or PurePosixPath(dst) in p.parents:
            return Path(src) / p.relative_to(dst) if Path(src).exists() else None
    return None


def path_problems(study: StudySpec) -> list[PathProblem]:
    """One problem per path that is missing or of the wrong kind, naming the field, the path and what must
    be there."""
    out = []
    for sp in study_paths(study):
        host = on_this_host(study, sp.path)
        if host is None:
            continue
        shown = sp.path if str(host) == sp.path else f"{sp.path} (on this host {host})"
        where = _where(study)
        if not host.exists():
            out.append(PathProblem(sp.field, RULE, f"{shown} does not exist{where}", f"give {sp.what}"))
        elif sp.kind == "dir" and not host.is_dir():
            out.append(PathProblem(sp.field, RULE, f"{shown} is a file, not a directory", f"give {sp.what}"))
        elif sp.kind == "file" and not host.is_file():
            out.append(PathProblem(sp.field, RULE, f"{shown} is a directory, not a file", f"give {sp.what}"))
    return out


def _where(study: StudySpec) -> str:
    """How a relative path was read, for the message of a missing one."""
    base = study.study_dir
    return f" (relative paths start at the study file's directory {base})" if base else ""


def script_problems(
    study_dir: str | None, words: list[str], where: str, run_dir: str | None = None
) -> list[PathProblem]:
    """The words of a rendered command that name a file of the study (`{{ study_dir }}/...`, alone or as the
    value of `--flag=`): each must exist. Paths in the run's own directory (its checkpoints, logs: made when
    the run is rendered or runs) are the run's, not the study's, wherever the runs root lies."""
    if not study_dir:
        return []
    out = []
    for w in words:
        value = w.split("=", 1)[1] if w.startswith("-") and "=" in w else w
        if run_dir and any(value == d or value.startswith(d.rstrip("/") + "/") for d in _forms(run_dir)):
            continue
        if value == study_dir or value.startswith(study_dir.rstrip("/") + "/"):
            if not Path(value).exists():
                out.append(
                    PathProblem(where, RULE, f"{value} does not exist", "give a file beside the study file")
                )
    return out


def _forms(path: str) -> set[str]:
    """A directory as a rendered command may write it: absolute as given, and with its links resolved."""
    return {os.path.abspath(path), os.path.realpath(path)}


def id_path(path: str, study_dir: str | None, inside_only: bool) -> str:
    """A path as a run id names it: relative to the study's directory, so that a study moved with its files
    keeps its ids. With `inside_only`, a path outside that directory stays absolute (the form ids of those
    fields always had)."""
    if not study_dir:
        return path
    # the study's directory as written and with its links resolved (init sources are resolved, data paths
    # not): the form that finds the path inside it
    rels = [os.path.relpath(path, d) for d in dict.fromkeys((study_dir, os.path.realpath(study_dir)))]
    inside = [r for r in rels if not (r == ".." or r.startswith("../"))]
    if inside_only and not inside:
        return path
    return PurePosixPath((inside or rels)[0]).as_posix()


def id_paths(trainer_payload: dict, study_dir: str | None) -> dict:
    """A trainer section's id payload (expand.id_payload) with its paths as ids name them: `trainer.init`'s
    sources relative to the study; data and tokenizer relative when inside the study's directory (absolute
    ones keep the ids they had when these paths were not yet resolved)."""
    data = trainer_payload.get("data")
    if isinstance(data, dict):
        for k in ("path", "tokenizer"):
            if isinstance(data.get(k), str):
                data[k] = id_path(data[k], study_dir, inside_only=True)
    init = trainer_payload.get("init")
    if isinstance(init, dict):
        for k in ("llm", "encoder", "checkpoint"):
            v = init.get(k)
            if isinstance(v, str):
                init[k] = id_path(v, study_dir, inside_only=False)
            elif isinstance(v, dict) and isinstance(v.get("megatron"), str):
                v["megatron"] = id_path(v["megatron"], study_dir, inside_only=False)
        mods = init.get("encoders")
        if isinstance(mods, dict):
            init["encoders"] = {n: id_path(d, study_dir, inside_only=False) for n, d in mods.items()}
    return trainer_payload

"""The matrix of a study expanded into runs: every point merged over the defaults, its LLM DP derived, its
topology checked, and a readable name and a stable id (hash of the resolved config) given to each run."""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import math
from typing import Any

from pydantic import BaseModel, ValidationError

import mimo_jobs.study.topology as topology
from mimo_jobs.model.arch import ModelArch
from mimo_jobs.model.resolve import arch_of
from mimo_jobs.model.splits import tp_problems
from mimo_jobs.study import lr_rules, modules
from mimo_jobs.study.load import pydantic_problems
from mimo_jobs.study.paths import id_paths
from mimo_jobs.study.runspec import PointResult, RunSpec
from mimo_jobs.study.spec import MatrixSpec, PointSpec, StudyError, StudySpec


def _deep_merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def _set_dotted(d: dict, dotted: str, value: Any) -> dict:
    out = copy.deepcopy(d)
    cur = out
    parts = dotted.split(".")
    for p in parts[:-1]:
        cur = cur.setdefault(p, {})
        if not isinstance(cur, dict):
            raise ValueError(f"axis {dotted!r} goes through a non-mapping at {p!r}")
    cur[parts[-1]] = value
    return out


def _derived_dp(p: PointSpec, gpn: int, encoder_gpus: int) -> int | None:
    return topology.derive_llm_dp_after(p.nodes, gpn, encoder_gpus, p.llm.tp, p.llm.pp, p.llm.cp)


def run_name(p: PointSpec, repeat: int, repeats: int, shapes: tuple[topology.ModuleShape, ...] = ()) -> str:
    """Readable name, e.g. 33n-e1x8-l2x8x128-g768 (encoder tp x dp, llm tp x ep x dp, then pp, etp, vp, cp
    where not 1, gbs); several encoders name each module (33n-vision1x4-audio1x2-l2x1x13-g768); a colocated
    point says `colo` where the encoder's sizes would be (33n-colo-l2x8x132-g768); a point with its own
    command ends in `-cmd`."""
    l_ = p.llm
    enc = modules.name_part(p, shapes)
    llm = (
        f"l{l_.tp}x{l_.ep}x{l_.dp}"
        + (f"p{l_.pp}" if l_.pp > 1 else "")
        + (f"t{l_.etp}" if l_.etp > 1 else "")
        + (f"v{l_.vp}" if l_.vp > 1 else "")
        + (f"c{l_.cp}" if l_.cp > 1 else "")
    )
    name = f"{p.nodes}n-{enc}-{llm}-g{p.gbs}" + (f"-m{p.mbs}" if p.mbs > 1 else "")
    name += "-cmd" if p.command else ""  # its own command: beside a packaged-trainer point of the same layout
    return name + (f"-r{repeat}" if repeats > 1 else "")


def run_id_of(study: StudySpec, point: PointSpec, repeat: int) -> str:
    """Stable id: a hash of the resolved config (study name, cluster, trainer, point, repeat), its paths
    named relative to the study (study/paths.py)."""
    payload = {
        "study": study.name,
        "cluster": study.cluster.id_payload(),
        "trainer": id_paths(id_payload(study.trainer), study.study_dir),
        "point": id_payload(point),
        "repeat": repeat,
    }
    blob = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def id_payload(m: BaseModel) -> dict:
    """A spec's fields as the run id hashes them: without the later fields that are at their default (each
    model's ID_LATER), so runs of studies that do not use them keep the ids they always had."""
    d = m.model_dump(mode="json")
    _drop_later_defaults(m, d)
    return d


def _drop_later_defaults(m: BaseModel, d: dict) -> None:
    fields = type(m).model_fields
    for name, info in fields.items():
        v = getattr(m, name)
        if name in getattr(m, "ID_LATER", ()) and v == info.get_default(call_default_factory=True):
            d.pop(name, None)
        elif isinstance(v, BaseModel) and isinstance(d.get(name), dict):
            _drop_later_defaults(v, d[name])


# Runs one study may expand to. A product of axes multiplies: a few long axes would otherwise build
# billions of points before anything is checked.
MAX_RUNS = 100_000


def _raw_points(m: MatrixSpec, problems: list[tuple[str, str]]) -> list[tuple[str, dict]]:
    n = len(m.points) + (math.prod(len(v) for v in m.product.values()) if m.product else 0)
    if n > MAX_RUNS:
        problems.append(
            ("matrix", f"expands to {n:,} points; a study holds at most {MAX_RUNS:,} (split it into studies)")
        )
        return []
    pts: list[tuple[str, dict]] = []
    for i, p in enumerate(m.points):
        pts.append((f"matrix.points[{i}]", _deep_merge(m.defaults, p)))
    if m.product:
        axes = list(m.product)
        for combo in itertools.product(*(m.product[a] for a in axes)):
            d = m.defaults
            label = "matrix.product{" + ", ".join(f"{a}={v}" for a, v in zip(axes, combo)) + "}"
            try:
                for a, val in zip(axes, combo):
                    d = _set_dotted(d, a, val)
            except ValueError as e:
                problems.append((f"matrix.product.{a}", str(e)))
                break
            pts.append((label, d))
    if not pts and m.defaults:
        pts.append(("matrix.defaults", copy.deepcopy(m.defaults)))
    return pts


def expand_matrix(
    matrix: MatrixSpec,
    gpus_per_node: int,
    num_experts: int,
    study: StudySpec | None,
    llm_layers: int = 0,
    arch: ModelArch | None = None,
) -> tuple[list[PointResult], list[tuple[str, str]]]:
    """Expand the matrix; schema problems are returned, not raised, so every problem can be reported at once.
    Without a valid `study` (diagnosis of a broken file) points are only checked, no RunSpec is built; with
    the model's `arch`, its TP splits are checked too."""
    problems: list[tuple[str, str]] = []
    results: list[PointResult] = []
    raw = _raw_points(matrix, problems)
    if not raw and not problems:
        problems.append(("matrix", "no points: give matrix.points and/or matrix.product"))
    index = 0
    seen: dict[str, str] = {}
    for label, d in raw:
        try:
            p = PointSpec.model_validate(d)
        except ValidationError as e:
            # Explicit points map back to their YAML path; product points to their axis combination.
            for path, msg in pydantic_problems(e):
                problems.append((f"{label}.{path}", msg))
            continue
        gpn = gpus_per_node
        names = modules.module_names(arch)
        p = modules.canonical(p, names)
        shapes, bad = modules.module_shapes(p, names, None, label)
        if bad:
            problems += bad
            continue
        enc_gpus = 0 if p.colocated else sum(m.ranks for m in shapes)
        dp = p.llm.dp
        if dp is None:
            dp = _derived_dp(p, gpn, enc_gpus)
        if p.colocated:
            shapes, _ = modules.module_shapes(p, names, dp, label)
        lay = topology.Layout(
            nodes=p.nodes,
            gpus_per_node=gpn,
            encoders=shapes,
            colocated=p.colocated,
            llm_tp=p.llm.tp,
            llm_pp=p.llm.pp,
            llm_dp=dp if dp is not None else 0,
            llm_ep=p.llm.ep,
            llm_etp=p.llm.etp,
            llm_cp=p.llm.cp,
            llm_vp=p.llm.vp,
            num_experts=num_experts,
            llm_layers=llm_layers,
            gbs=p.gbs,
            mbs=p.mbs,
        )
        if dp is None:
            viol = [
                topology.Violation(
                    "tiling",
                    f"llm.dp cannot be derived: {p.nodes}x{gpn} GPUs minus encoder{'s' if len(shapes) > 1 else ''} "
                    f"{enc_gpus} is not a multiple of llm.tp*cp*pp={p.llm.tp * p.llm.cp * p.llm.pp}",
                    None,
                )
            ]
        else:
            who = topology.Trainer(
                text_only=bool(arch is not None and arch.text_only),
                packaged=study is None or not (p.command or study.trainer.command),
                split_layers=study.trainer.pipeline_split_layers if study is not None else 0,
            )
            viol = topology.check(lay, who) + (_lr_violations(study, p.gbs) if study is not None else [])
            if arch is not None:
                # the packaged trainer's own needs (an encoder) only where it is known to run it
                packaged = study is not None and not (p.command or study.trainer.command)
                viol += [topology.Violation(*v) for v in split_problems(arch, lay, packaged)]
        p = p.model_copy(update={"llm": p.llm.model_copy(update={"dp": dp})})
        if index + p.repeats > MAX_RUNS:
            problems.append((label, f"with its repeats the study exceeds {MAX_RUNS:,} runs"))
            break
        for r in range(p.repeats):
            if viol:
                results.append(PointResult(index, label, None, viol))
                index += 1
                break
            name = run_name(p, r, p.repeats, shapes)
            if name in seen:
                problems.append((label, f"duplicate run {name!r} (also {seen[name]})"))
                continue
            seen[name] = label
            spec = None
            if study is not None:
                spec = RunSpec(
                    study=study.name,
                    name=name,
                    run_id=run_id_of(study, p, r),
                    index=index,
                    repeat=r,
                    point=p,
                    layout=lay,
                    cluster=study.cluster,
                    trainer=study.trainer,
                    study_dir=study.study_dir,
                )
            results.append(PointResult(index, label, spec, []))
            index += 1
    return results, problems


def split_problems(arch: ModelArch, lay: topology.Layout, packaged: bool = True) -> list[tuple]:
    """What the model needs of the layout's TP sizes (model/splits.py), for each encoder module under the
    name its sizes have in the study (Layout.label: `encoders.eye.tp`, `encoder.tp` for the `encoder:` form;
    colocated: each at the LLM's TP); the LLM's problems once. (rule, message, fit) each; the trainer's own
    guard (trainer/model/models.unsupported) asks the same."""
    out: list[tuple] = []
    for m in lay.encoders:
        # the module alone in front of the LLM (none: a text-only model, whose layout keeps a placeholder)
        one = ModelArch(arch.name, arch.encoders.get(m.name), arch.llm, arch.description)
        for rule, msg, fit in tp_problems(one, m.tp, lay.llm_tp, lay.llm_etp, lay.llm_pp, packaged):
            v = (rule, _relabel(msg, lay.label(m)), _relabel(fit, lay.label(m)))
            if v not in out:
                out.append(v)
    return out


def _relabel(text: str | None, label: str) -> str | None:
    return text and text.replace("encoder.", f"{label}.")


def _lr_violations(study: StudySpec, gbs: int) -> list[topology.Violation]:
    """The learning-rate schedule's rules for a run of `gbs` samples per step (lr_rules holds them)."""
    lr = study.trainer.lr
    t = study.trainer
    end = lr_rules.decay_end(lr.decay_samples, lr_rules.run_samples(t.train_iters, t.train_samples, gbs))
    bad = lr_rules.warmup_problem(lr.schedule, lr.warmup_samples, end)
    return [topology.Violation(lr_rules.RULE, *bad)] if bad else []


def expand(study: StudySpec, source: str = "<study>") -> list[PointResult]:
    """All points of the matrix, each with its RunSpec or its violations. Raises StudyError for malformed
    points (unknown keys, wrong types) and duplicate run names; topology violations are returned per point."""
    arch = arch_of(study.trainer.model)
    results, problems = expand_matrix(
        study.matrix, study.cluster.gpus_per_node, arch.llm.num_experts, study, arch.llm.num_layers, arch
    )
    if problems:
        raise StudyError(source, problems)
    return results


def runs_of(study: StudySpec, source: str = "<study>") -> list[RunSpec]:
    """Expanded runs; raises StudyError naming every infeasible point and every rule it breaks."""
    results = expand(study, source)
    bad = [(r.label, str(v)) for r in results if r.violations for v in r.violations]
    if bad:
        raise StudyError(source, bad)
    return [r.run for r in results if r.run is not None]

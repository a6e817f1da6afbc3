"""Where a plan starts: the model, the trainer, the GPUs per node and the batch, from a study whose points
need not validate (a new user's first study rarely does), or from a model alone. Pure: specs in, a RunShape
and notes out; the layouts come later (layouts.py)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from mimo_jobs.model.resolve import arch_of
from mimo_jobs.study.topology import Layout, ModuleShape

from .run import RunShape, shape_of


@dataclass(frozen=True)
class Start:
    shape: RunShape  # on a placeholder layout: only the model, trainer, GPUs per node and batch are read
    notes: list[str]  # what the plan could not take from the study, in words


def start_of(trainer, gpus_per_node: int, gbs: int, mbs: int = 1, command: str | None = None) -> RunShape:
    """The shape a plan prices candidates of: `trainer`'s model and settings, `gpus_per_node`, the batch."""
    arch = arch_of(trainer.model)
    lay = Layout(
        nodes=1,
        gpus_per_node=gpus_per_node,
        encoders=tuple(ModuleShape(n) for n, _ in arch.named_encoders),  # each module under its name
        llm_tp=1,
        llm_pp=1,
        llm_dp=1,
        num_experts=arch.llm.num_experts,
        gbs=gbs,
        mbs=mbs,
        colocated=True,
        llm_layers=arch.llm.num_layers,
    )
    return shape_of(lay, trainer, command, checked=False)


def study_start(study, points, problems) -> Start:
    """A study's start: its first valid run's point, else its first point's batch; each point that does not
    validate is named (with its first problem) in the notes, not fatal."""
    valid = [pr for pr in points if pr.run is not None]
    notes = []
    bad = {}
    for p in problems:
        bad.setdefault(p.path, p)
    for pr in points:
        if pr.run is None and pr.label in bad:
            b = bad[pr.label]
            notes.append(f"{pr.label} does not validate ([{b.rule}] {b.message}); planned from the study's "
                         "model, cluster and batch")  # fmt: skip
    if valid:
        run = valid[0].run
        shape = start_of(study.trainer, study.cluster.gpus_per_node, run.layout.gbs, run.layout.mbs,
                         run.point.command)  # fmt: skip
        return Start(shape, notes)
    m = study.matrix
    first = {**m.defaults, **(m.points[0] if m.points else {})}
    for axis in ("gbs", "mbs"):  # a product axis: its first value
        if axis not in first and m.product.get(axis):
            first[axis] = m.product[axis][0]
    gbs, mbs = first.get("gbs"), first.get("mbs", 1)
    if not (_count(gbs) and _count(mbs)):
        raise ValueError("no point of the study gives a usable gbs (and mbs): give --gbs")
    return Start(start_of(study.trainer, study.cluster.gpus_per_node, gbs, mbs), notes)


def _count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def own_command(shape: RunShape) -> RunShape:
    """`shape` priced as a study of its own command trains it (Megatron-LM's layouts: PP, interleaving and CP
    for a text-only model), for a plan from a model alone."""
    return replace(shape, packaged=False)

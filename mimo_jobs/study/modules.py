"""A point's encoder modules: the sizes it gives each encoder the model names, in the model's order, and how
a run name writes them. The one reader of `encoder:` / `encoders:` in a point (expand calls it).

`encoder:` sizes the one encoder (the module `vision`, or the model's only encoder whatever its name);
`encoders: {name: {tp, pp, dp}}` sizes each module by its name in trainer.model.encoders. A heterogeneous
point of a model with several encoders gives every module its sizes (no default: each module's ranks are
GPUs the point spends); a colocated point gives none (every module takes the LLM's TP and DP).
"""

from __future__ import annotations

from mimo_jobs.study.spec import EncoderAxes, PointSpec
from mimo_jobs.study.topology import VISION, ModuleShape


def module_names(arch) -> list[str]:
    """The encoder modules of a model (a model/arch.ModelArch, or None when unknown), in rank order; a
    text-only or unknown model has the one placeholder module `vision` (its layout keeps today's form)."""
    names = [n for n, _ in arch.named_encoders] if arch is not None else []
    return names or [VISION]


def canonical(p: PointSpec, names: list[str]) -> PointSpec:
    """`encoders: {vision: X}` for a model whose one encoder is `vision` is `encoder: X` (the same run, the
    same id however it is written)."""
    if names == [VISION] and p.encoders is not None and set(p.encoders) == {VISION}:
        return p.model_copy(update={"encoder": p.encoders[VISION], "encoders": None})
    return p


def module_shapes(
    p: PointSpec, names: list[str], llm_dp: int | None, label: str
) -> tuple[tuple[ModuleShape, ...], list[tuple[str, str]]]:
    """Each module's sizes in the model's order, and every (yaml path, problem) of the point's modules:
    a name the model does not have, a module without sizes. Colocated: each module on the LLM's TP and DP."""
    if p.colocated:
        return tuple(ModuleShape(n, p.llm.tp, 1, llm_dp or 0) for n in names), []
    given: dict[str, EncoderAxes]
    if p.encoders is not None:
        given = dict(p.encoders)
    elif len(names) == 1:
        given = {names[0]: p.encoder}
    else:
        given = {VISION: p.encoder} if "encoder" in p.model_fields_set else {}
    problems = [
        (
            f"{label}.encoders.{n}",
            f"unknown module {n!r}: the model's encoders are {', '.join(names)} (trainer.model.encoders)",
        )
        for n in given
        if n not in names
    ]
    missing = [n for n in names if n not in given]
    if missing:
        problems.append(
            (
                f"{label}.encoders",
                f"no sizes for {', '.join(missing)}: a point of a model with encoders {', '.join(names)} sizes "
                "each one, e.g. encoders: {"
                + ", ".join(f"{n}: {{tp: 1, dp: 1}}" for n in names)
                + "} (or colocated: true)",
            )
        )
    if problems:
        return (), problems
    return tuple(ModuleShape(n, given[n].tp, given[n].pp, given[n].dp) for n in names), []


def name_part(p: PointSpec, shapes: tuple[ModuleShape, ...]) -> str:
    """The encoders in a run name: `colo`, `e1x8` (one encoder: tp x dp, then pp where not 1), or each module
    by its name, `vision1x4-audio1x2`."""
    if p.colocated:
        return "colo"

    def sizes(m: ModuleShape) -> str:
        return f"{m.tp}x{m.dp}" + (f"p{m.pp}" if m.pp > 1 else "")

    if len(shapes) <= 1:
        e = shapes[0] if shapes else ModuleShape(VISION, p.encoder.tp, p.encoder.pp, p.encoder.dp)
        return "e" + sizes(e)
    return "-".join(m.name + sizes(m) for m in shapes)

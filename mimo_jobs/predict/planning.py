"""What `plan` answers for each node count and global batch: the best heterogeneous split, the best colocated
layout (or why none tiles the batch, with the nearest batches that would), what each alternative costs
relative to the best, and flags across node counts (a larger allocation predicted slower than a smaller
one). Pure: layouts.py prices, this module compares and shapes the answer (docs/predict.md has the JSON)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from mimo_jobs.textsafe import visible

from .assumed import EndsVerdict, ends_verdict, range_words
from .band import band_for, band_json, band_note, time_model
from .cost import Cost, gpu_hours_text, tokens_text
from .estimate import Prediction, cost_json
from .hardware import FITTED_EFFICIENCY, GIB, GPU, generation, layers_note
from .layouts import (
    MAX_MODULE_SHAPES,
    MAX_SHAPE_COMBOS,
    TIE,
    Candidate,
    colocated_gbs,
    free_bytes,
    point_dict,
    price_layouts,
    price_with_savers,
    recompute_dict,
    shapes_per_module,
    split_label,
    trainer_changes,
    trainer_words,
    yaml_point,
)
from .run import RunShape
from .steptime import Efficiency


@dataclass(frozen=True)
class NodePlan:
    nodes: int
    gbs: int
    ranked: list[Candidate]  # the top fitting layouts, fastest first
    priced: int
    best_colocated: Candidate | None
    colocated_note: str | None  # why no colocated layout is shown
    nearest_colocated_gbs: list[int] = field(default_factory=list)

    best_heterogeneous: Candidate | None = None
    tiling_note: str | None = None  # why no layout was priced at all (none tiles the batch)
    assumed: EndsVerdict | None = None  # the best at each end of an assumed image mix (assumed.py)

    @property
    def best(self) -> Candidate | None:
        return self.ranked[0] if self.ranked else None


@dataclass(frozen=True)
class Flag:
    kind: str  # larger-slower | no-colocated | nothing-fits | nothing-tiles
    nodes: int
    gbs: int
    message: str


@dataclass(frozen=True)
class PlanResult:
    shape: RunShape
    gpu: GPU
    headroom_bytes: int
    calibrated: bool
    plans: list[NodePlan]
    flags: list[Flag]
    tokens: float | None = None  # a token budget to cost each layout to (carried tokens)
    rank_by: str = "time"  # time | cost: how the summary across node counts is ordered

    def cost(self, c: Candidate) -> Cost | None:
        """What `rank_by cost` compares: the cost to the token budget, else of the study's length."""
        p = c.prediction
        return p.budget_cost(self.tokens) if self.tokens else p.run_cost()

    def summary_order(self) -> list[NodePlan]:
        """The plans in the order the summary lists them: as asked (time), or cheapest first, ties (within
        TIE) by time; plans with no layout last."""
        if self.rank_by != "cost":
            return list(self.plans)
        priced = [p for p in self.plans if p.best is not None]
        priced.sort(key=lambda p: (self.cost(p.best).gpu_hours, _t(p)))
        out: list[NodePlan] = []
        for p in priced:  # a cost within TIE of the one before it is a tie: the faster first
            if (
                out
                and _tie(self.cost(out[-1].best).gpu_hours, self.cost(p.best).gpu_hours)
                and _t(p) < _t(out[-1])
            ):
                out.insert(len(out) - 1, p)
            else:
                out.append(p)
        return out + [p for p in self.plans if p.best is None]


def _tie(a: float, b: float) -> bool:
    return abs(a - b) <= TIE * min(a, b)


def plan_one(
    shape: RunShape, gpu: GPU, nodes: int, gbs: int, eff: Efficiency, top: int, headroom: int
) -> NodePlan:
    s = replace(shape, layout=replace(shape.layout, gbs=gbs))
    fit, over = price_layouts(s, gpu, nodes, eff, headroom)
    colo = next((c for c in fit if c.layout.colocated), None)
    ranked = fit[:top]
    if colo is not None and colo not in ranked:  # the colocated baseline is always shown beside the splits
        ranked = fit[: top - 1] + [colo] if top > 1 else ranked
    note, nearest = None, []
    if colo is None:
        nearest = colocated_gbs(s.layout, nodes)
        if nearest:
            note = (
                f"no colocated layout tiles gbs {gbs} on {nodes * shape.layout.gpus_per_node} GPUs; "
                f"nearest gbs that would: {', '.join(map(str, nearest))}"
            )
        elif any(c.layout.colocated for c in over):
            note = "every colocated layout is over memory"
        else:
            note = "no colocated layout is feasible on this node count"
    hetero = next((c for c in fit if not c.layout.colocated), None)
    tiling = None
    if not fit and not over:  # nothing was priced: no layout tiles the batch, memory was never the question
        near = nearest or colocated_gbs(s.layout, nodes)
        tiling = f"no layout tiles gbs {gbs} on {nodes * shape.layout.gpus_per_node} GPUs" + (
            f"; a colocated layout tiles gbs {' or '.join(map(str, near))}" if near else ""
        )
    tops = [c.layout for c in ranked + [colo, hetero] if c is not None]
    ends = ends_verdict(s, tops, gpu, eff, headroom)
    return NodePlan(nodes, gbs, ranked, len(fit) + len(over), colo, note, nearest, hetero, tiling, ends)


def cross_flags(plans: list[NodePlan]) -> list[Flag]:
    flags = []
    for p in plans:
        if p.best is None and p.tiling_note:
            flags.append(Flag("nothing-tiles", p.nodes, p.gbs, f"{p.nodes} nodes: {p.tiling_note}"))
        elif p.best is None:
            flags.append(
                Flag("nothing-fits", p.nodes, p.gbs, f"{p.nodes} nodes, gbs {p.gbs}: no layout fits")
            )
        if p.best_colocated is None and p.nearest_colocated_gbs:
            flags.append(Flag("no-colocated", p.nodes, p.gbs, f"{p.nodes} nodes: {p.colocated_note}"))
    by_gbs: dict[int, list[NodePlan]] = {}
    for p in plans:
        if p.best is not None:
            by_gbs.setdefault(p.gbs, []).append(p)
    for gbs, ps in by_gbs.items():
        ps.sort(key=lambda p: p.nodes)
        for i, p in enumerate(ps):
            faster = [q for q in ps[:i] if _t(q) < _t(p)]
            if faster:
                q = min(faster, key=_t)
                flags.append(
                    Flag(
                        "larger-slower",
                        p.nodes,
                        gbs,
                        f"{p.nodes} nodes predicted slower than {q.nodes} nodes at gbs {gbs} "
                        f"({_t(p):.4g} vs {_t(q):.4g} s/iter): the extra nodes cost time",
                    )
                )
    return flags


def _t(p: NodePlan) -> float:
    return p.best.prediction.time.iteration_s


def plan_many(
    shape: RunShape,
    gpu: GPU,
    nodes: list[int],
    batches: list[int],
    eff: Efficiency,
    top: int,
    headroom: int,
    calibrated: bool = False,
    tokens: float | None = None,
    rank_by: str = "time",
) -> PlanResult:
    plans = [
        plan_one(shape, gpu, n, g, eff, top, headroom) for g in batches or [shape.layout.gbs] for n in nodes
    ]
    return PlanResult(shape, gpu, headroom, calibrated, plans, cross_flags(plans), tokens, rank_by)


def candidate_json(
    shape: RunShape, c: Candidate, best: Candidate | None, tokens: float | None = None
) -> dict:
    p: Prediction = c.prediction
    t = p.time.iteration_s
    return {
        "point": point_dict(c.layout),
        "trainer": trainer_changes(shape, p),
        "recompute": recompute_dict(p),
        "split": split_label(c.layout, shape.preset.text_only),
        "colocated": c.layout.colocated,
        "iteration_s": t,
        "relative_to_best": t / best.prediction.time.iteration_s - 1 if best else None,
        "tokens_per_s_per_gpu": p.tokens_per_s_per_gpu,
        "mfu": p.mfu,
        "bottleneck": p.time.bottleneck,
        "fits": p.memory.fits,
        "free_bytes": free_bytes(p),
        "rank_classes": [
            {"ranks": list(cls.ranks), "modules": [m.module for m in cls.modules], "bytes": cls.total_bytes}
            for cls in p.memory.classes
        ],
        "parts_s": dict(p.time.parts),
        "cost": cost_json(p, tokens),
    }


def plan_json(r: PlanResult) -> dict:
    def one(p: NodePlan) -> dict:
        return {
            "nodes": p.nodes,
            "gbs": p.gbs,
            "priced": p.priced,
            "best": candidate_json(r.shape, p.best, p.best, r.tokens) if p.best else None,
            "best_heterogeneous": candidate_json(r.shape, p.best_heterogeneous, p.best, r.tokens)
            if p.best_heterogeneous
            else None,
            "best_colocated": candidate_json(r.shape, p.best_colocated, p.best, r.tokens)
            if p.best_colocated
            else None,
            "colocated_note": p.colocated_note,
            "nearest_colocated_gbs": p.nearest_colocated_gbs,
            "layouts": [candidate_json(r.shape, c, p.best, r.tokens) for c in p.ranked],
            "assumed_mix": _ends_json(p.assumed),
        }

    return {
        "gpu": r.gpu.name,
        "layers": r.gpu.layers,
        "capacity_bytes": r.gpu.memory_bytes,
        "headroom_bytes": r.headroom_bytes,
        "calibrated": r.calibrated,
        # the study's own settings; a candidate's "trainer" lists what it needs instead
        "trainer": {
            "recompute": {"encoder": r.shape.recompute.encoder, "llm": r.shape.recompute.llm},
            "encoder_inflight": r.shape.encoder_inflight,
        },
        "tokens": r.tokens,
        "rank_by": r.rank_by,
        "image_tokens": {
            "mean": r.shape.image_tokens_mean,
            "max": r.shape.image_tokens_max,
            "source": r.shape.data_source,
            "assumed": r.shape.image_assumed,
            "range": list(r.shape.image_range) if r.shape.image_range else None,
        },
        "plans": [one(p) for p in r.plans],
        "summary": [
            {
                "nodes": p.nodes,
                "gbs": p.gbs,
                "best_gpu_hours": r.cost(p.best).gpu_hours if p.best and r.cost(p.best) else None,
                "best_split": split_label(p.best.layout, r.shape.preset.text_only) if p.best else None,
                "best_s": _t(p) if p.best else None,
                "best_heterogeneous_s": p.best_heterogeneous.prediction.time.iteration_s
                if p.best_heterogeneous
                else None,
                "best_colocated_s": p.best_colocated.prediction.time.iteration_s
                if p.best_colocated
                else None,
            }
            for p in r.summary_order()
        ],
        "flags": [{"kind": f.kind, "nodes": f.nodes, "gbs": f.gbs, "message": f.message} for f in r.flags],
        "band": None if r.calibrated else band_json(r.gpu, _time_model(r)),
    }


def _ends_json(e: EndsVerdict | None) -> dict | None:
    def end(v) -> dict:
        best = v.best
        return {
            "image_tokens": v.image_tokens,
            "verdict": v.words,
            "point": point_dict(best.layout) if best else None,
            "iteration_s": best.prediction.time.iteration_s if best else None,
        }

    return None if e is None else {"flips": e.flips, "low": end(e.low), "high": end(e.high)}


FLAG_MEANING = {
    "larger-slower": "a larger allocation is predicted slower than a smaller one: the smaller one is the better buy",
    "no-colocated": "no colocated layout divides the global batch over this many GPUs; the nearest batches that "
    "would are given",
    "nothing-fits": "no layout fits in memory (with the headroom asked for) on this node count",
    "nothing-tiles": "no layout divides the global batch over this many GPUs, so none was priced; batches a "
    "colocated layout tiles are given",
}


def plan_text(r: PlanResult, study: str, measure: str = "mimo-jobs data stats") -> list[str]:
    """The pasteable text: per node count and batch the ranked points as YAML with comments, then the
    summary table and what each flag means; `measure` is the command an assumed image mix's warning
    names."""
    cal = (
        "calibrated"
        if r.calibrated
        else f"{generation(r.gpu.name)} efficiencies fitted to published runs"
        if generation(r.gpu.name) in FITTED_EFFICIENCY
        else "uncalibrated"
    )
    rc = r.shape.recompute
    text_only = r.shape.preset.text_only
    # a text-only model has no encoder: its recompute and in-flight settings do not apply
    settings = (
        f"recompute LLM {rc.llm}"
        if text_only
        else f"recompute encoder {rc.encoder}, LLM {rc.llm}; encoder_inflight {r.shape.encoder_inflight}"
    )
    # Transformer Engine's layers are what the fitted efficiencies describe: only the other backend is named
    layers = f", {layers_note(r.gpu)}" if r.gpu.layers != "te" and r.gpu.name != "cpu" else ""
    lines = [  # the study's name, or the --model text as typed: shown with its control characters visible
        f"# {visible(study)} on {r.gpu.name} ({cal if cal.endswith('runs') else cal + ' efficiencies'}){layers}, "
        f"headroom {r.headroom_bytes / GIB:.1f} GiB",
        f"# the study's trainer: {settings} (a point's comment names any setting it needs instead)",
    ]
    n_modules = len(r.shape.layout.encoders)
    if shapes_per_module(n_modules) < MAX_MODULE_SHAPES:  # the search was bounded: say how
        lines.append(
            f"# search bounded: {n_modules} encoder modules, each tried with {shapes_per_module(n_modules)} of "
            f"its {MAX_MODULE_SHAPES} shapes (TP 1 at the smallest DPs first; at most {MAX_SHAPE_COMBOS} "
            "combinations): a split outside them is not priced"
        )
    if r.shape.image_range:
        lines.append(
            f"# image tokens {r.shape.data_source}; {range_words(r.shape.image_range)}: every verdict "
            "below is assumed"
        )
    for p in r.plans:
        lines.append(
            f"# {p.nodes} node(s), gbs {p.gbs}: {len(p.ranked)} shown of {p.priced} feasible layouts"
        )
        if not p.ranked:
            lines.append(f"#   {p.tiling_note}" if p.tiling_note else "#   no layout fits")
        lines.append("points:")
        for c in p.ranked:
            pr = c.prediction
            rel = pr.time.iteration_s / _t(p) - 1
            extra = "".join(f", {w}" for w in trainer_words(r.shape, pr))
            where = split_label(c.layout, text_only)
            lines.append(
                f"  {yaml_point(c.layout)}  # {where}; {pr.time.iteration_s:.4g} s/iter "
                f"({_rank_words(p, c, rel)}), {pr.time.bottleneck}-bound, "
                f"{pr.memory.verdict()}, {_cost_words(r, c)}{extra}"
            )
        if p.colocated_note:
            lines.append(f"# colocated: {p.colocated_note}")
        if p.assumed and p.assumed.flips:
            lines.append(f"# {p.assumed.line(measure)}")
    what = f"GPU-h to {tokens_text(r.tokens)}" if r.tokens else "GPU-h (run)"
    order = " (cheapest first)" if r.rank_by == "cost" else ""
    lines.append(
        f"# summary{order}: nodes   gbs  best s/iter  split s/iter  colocated s/iter  {what:>14}  best split"
    )

    def secs(c: Candidate | None, width: int) -> str:
        return f"{c.prediction.time.iteration_s:{width}.4g}" if c else f"{'-':>{width}}"

    for p in r.summary_order():
        if p.best_heterogeneous:
            split = split_label(p.best_heterogeneous.layout)
        else:  # a text-only model has no encoder to split off: its best is the LLM alone on every GPU
            split = (
                "no split (text-only)"
                if text_only
                else "none tiles the batch"
                if p.tiling_note
                else "no split fits"
            )
        cost = r.cost(p.best) if p.best else None
        gpu_h = f"{gpu_hours_text(cost.gpu_hours):>14}" if cost else f"{'-':>14}"
        if r.shape.image_assumed and p.best:
            split += " (assumed image mix)"
        lines.append(
            f"#{' ' * (8 + len(order))} {p.nodes:5d} {p.gbs:5d}  {secs(p.best, 11)}  "
            f"{secs(p.best_heterogeneous, 12)}  {secs(p.best_colocated, 16)}  {gpu_h}  {split}"
        )
    for f in r.flags:
        lines.append(f"# flag {f.kind}: {f.message}")
    for kind in sorted({f.kind for f in r.flags}):
        lines.append(f"# {kind}: {FLAG_MEANING[kind]}")
    return lines + ([] if r.calibrated else band_lines(r))


def _time_model(r: PlanResult) -> str:
    """The time model that priced the layouts shown (its band is the one they carry)."""
    return time_model(c.prediction.time for p in r.plans for c in p.ranked)


def band_lines(r: PlanResult) -> list[str]:
    """What the times above can and cannot decide: the band of the GPU's generation (band.py), the layouts
    inside it of each node count's best, and whether splitting the encoders off beats colocating them by more
    than it."""
    b = band_for(r.gpu, _time_model(r))
    if b is None:
        return [f"# band: {band_note(r.gpu)}"]
    lines = [f"# band: times are {b.text()}; layouts closer than that are not told apart by the model"]
    for p in r.plans:
        if not p.best:
            continue
        inside = sum(b.contains(c.prediction.time.iteration_s, _t(p)) for c in p.ranked)
        words = [f"{inside} of the {len(p.ranked)} shown within the band of the best"]
        het, colo = p.best_heterogeneous, p.best_colocated
        if het and colo:
            h, c = het.prediction.time.iteration_s, colo.prediction.time.iteration_s
            gap = f"split {h:.4g} vs colocated {c:.4g} s/iter ({h / c - 1:+.1%})"
            words.append(f"{gap}: {'not decided (inside the band)' if b.contains(h, c) else 'decided'}")
        lines.append(f"# band {p.nodes} node(s), gbs {p.gbs}: " + "; ".join(words))
    return lines


def _rank_words(p: NodePlan, c: Candidate, rel: float) -> str:
    """Where a row stands, with the reason in the row when the order is not by time: times within TIE of
    the fastest are a tie, ordered by the most free memory (layouts.ranked)."""
    t = c.prediction.time.iteration_s
    fastest = min(x.prediction.time.iteration_s for x in p.ranked)
    tied = t <= fastest * (1 + TIE)
    if c is p.best:
        if t > fastest:
            return f"best: within {TIE:.1%} of the fastest, {fastest:.4g} s/iter, with the most memory free"
        return "best"
    if rel < 0 and tied:
        return f"{rel:+.1%}: a tie within {TIE:.1%} with the best, which has more memory free"
    return f"{rel:+.1%}"


def _cost_words(r: PlanResult, c: Candidate) -> str:
    """A point's cost in its comment: the study's length, and to the token budget when one is given."""
    p = c.prediction
    words = (
        [f"{gpu_hours_text(p.run_cost().gpu_hours)} GPU-h for {p.iterations:,} iterations"]
        if p.iterations
        else []
    )
    if r.tokens:
        b = p.budget_cost(r.tokens)
        if b is not None:
            words.append(
                f"{gpu_hours_text(b.gpu_hours)} GPU-h ({b.hours:,.3g} h) to {tokens_text(r.tokens)} tokens"
            )
    return ", ".join(words) or "no length to cost (give --tokens)"


def cheapest_fix(shape: RunShape, gpu: GPU, eff: Efficiency) -> str | None:
    """For a run over memory: the cheapest change that fits, as words a user can apply; None if nothing on
    its node count fits. A trainer setting on the same layout comes first (the point stays), else the
    fastest fitting layout of the same node count and batch."""
    p = price_with_savers(shape, shape.layout, gpu, eff, 0)
    if p.memory.fits:
        return ", ".join(trainer_words(shape, p))
    fit, _ = price_layouts(shape, gpu, shape.layout.nodes, eff)
    if not fit:
        return None
    c = fit[0]
    extra = "".join(f", {w}" for w in trainer_words(shape, c.prediction))
    return f"the point {yaml_point(c.layout)[2:]}{extra} ({c.prediction.memory.verdict()})"


def over_text(pred: Prediction) -> str:
    """Each rank class over memory: its ranks, its modules and the bytes over."""
    cap = pred.memory.capacity_bytes
    parts = [
        f"ranks {c.ranks[0]}-{c.ranks[1]} ({'+'.join(m.module for m in c.modules)}) over by "
        f"{(c.total_bytes - cap) / GIB:.1f} GiB ({c.total_bytes - cap:,} bytes)"
        for c in pred.memory.classes
        if c.total_bytes > cap
    ]
    return "; ".join(parts)

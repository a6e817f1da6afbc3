"""Feasible layouts for N nodes, ranked by predicted iteration time.

Candidates come from bounded arithmetic over divisors (TP within a node, PP dividing the layers, EP dividing
the experts, encoder DP dividing the global batch); `topology.check` decides feasibility (the rules live
there only), memory.py drops what does not fit, steptime.py ranks the rest.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace

from mimo_jobs.study.spec import RecomputeSpec
from mimo_jobs.study.topology import (
    PACKAGED,
    Layout,
    ModuleShape,
    Trainer,
    check,
    derive_llm_dp,
    derive_llm_dp_after,
    llm_check,
)

from .estimate import Prediction, predict_shape
from .hardware import GPU
from .run import RunShape, on_layout, trainer_of
from .steptime import Efficiency

MAX_PP = 8  # deeper pipelines only add bubble for models of this size


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


@dataclass(frozen=True)
class Candidate:
    layout: Layout
    prediction: Prediction


CPS = (1, 2, 4, 8)  # context parallel sizes tried for a text-only model of a study's own command
VPS = (1, 2, 4)  # virtual pipeline stages tried with them


def candidate_layouts(base: Layout, nodes: int, who: Trainer = PACKAGED, prune: bool = True) -> list[Layout]:
    """Every feasible layout of `base`'s model and batch on `nodes` nodes (heterogeneous and colocated), for
    the model and trainer `who` (a text-only model of a study's own command: pipelined, interleaved and
    context-parallel layouts too, as Megatron-LM runs them). A text-only model has no encoder ranks to split
    off: every GPU is its LLM's, so its layouts are colocated only. `prune` False: every split is built and
    checked (the same layouts, slower: what tests compare the pruned search to)."""
    out = _split_and_colocated(base, nodes, who, split=not who.text_only, prune=prune)
    if who.text_only and not who.packaged:
        out += _text_only_megatron(base, nodes)
    return [lay for lay in out if not check(lay, who)]


def _text_only_megatron(base: Layout, nodes: int) -> list[Layout]:
    """A text-only model's layouts beyond TP x DP (x EP): PP with and without virtual stages, and CP."""
    gpn, experts = base.gpus_per_node, base.num_experts
    layers = base.llm_layers or 1
    out = []
    for ltp in _divisors(gpn):
        for pp in (p for p in _divisors(layers) if p <= MAX_PP):
            for cp in CPS:
                if pp == 1 and cp == 1:
                    continue  # priced by _split_and_colocated
                dp = derive_llm_dp(nodes, gpn, 0, 1, 1, ltp, pp, cp)
                if not dp:
                    continue
                for vp in (v for v in VPS if v == 1 or (pp > 1 and layers % (pp * v) == 0)):
                    for ep in _divisors(experts) if experts else [1]:
                        out.append(
                            replace(
                                base,
                                nodes=nodes,
                                colocated=True,
                                encoders=tuple(ModuleShape(m.name, ltp, 1, dp) for m in base.encoders),
                                llm_tp=ltp,
                                llm_pp=pp,
                                llm_vp=vp,
                                llm_cp=cp,
                                llm_dp=dp,
                                llm_ep=ep,
                                llm_etp=ltp if experts and pp > 1 else 1,
                            )
                        )
    return out


# The shapes tried per encoder module are its TP (a divisor of the GPUs per node) times its DP (a divisor of
# the global batch), fewer ranks than the world: TP 1 at every DP first (an encoder splits its weights only
# when they do not fit), then TP 2, ... One module is tried with every shape. The combinations of several
# modules' shapes are a product, which grows ~24x with every module (five modules: 8 million before the
# LLM's own shapes): the search prices at most MAX_SHAPE_COMBOS of them, as many shapes per module as that
# allows (two modules keep MAX_MODULE_SHAPES each; three 8; five 3), and says so.
MAX_MODULE_SHAPES = 24
MAX_SHAPE_COMBOS = MAX_MODULE_SHAPES**2


def shapes_per_module(modules: int) -> int:
    """How many of its shapes each of `modules` encoder modules is tried with: the most k with
    k ** modules <= MAX_SHAPE_COMBOS (at least 1; one module: MAX_SHAPE_COMBOS, in effect every shape)."""
    k = 1
    while (k + 1) ** max(1, modules) <= MAX_SHAPE_COMBOS:
        k += 1
    return k


def module_shapes(base: Layout, nodes: int, limit: int = MAX_SHAPE_COMBOS) -> list[tuple[int, int]]:
    """(tp, dp) tried for one encoder module of `base`'s batch on `nodes` nodes (the first `limit`)."""
    world = nodes * base.gpus_per_node
    shapes = [
        (tp, dp) for tp in _divisors(base.gpus_per_node) for dp in _divisors(base.gbs) if tp * dp < world
    ]
    return shapes[:limit]


def _split_and_colocated(
    base: Layout, nodes: int, who: Trainer, split: bool = True, prune: bool = True
) -> list[Layout]:
    """Every encoder module its own TP and DP on its own ranks (the LLM's DP the rest of the world; only when
    `split`), or every module on every rank with the LLM's TP and DP; the LLM's TP, PP (dividing its layers),
    EP (dividing the experts) and expert TP (none, or the dense TP, which MoE with PP requires). A split whose
    LLM breaks a rule of the LLM alone (topology.llm_check: the batch does not tile its DP, ...) is dropped
    with every other split of the same LLM shape, unbuilt: of ten thousand splits, a few hundred tile."""
    gpn, experts, world = base.gpus_per_node, base.num_experts, nodes * base.gpus_per_node
    names = [m.name for m in base.encoders]
    pps = [p for p in _divisors(base.llm_layers or 1) if p <= MAX_PP]
    eps = _divisors(experts) if experts else [1]
    shapes = module_shapes(base, nodes, shapes_per_module(len(names))) if split else []
    combos = [(c, r) for c in itertools.product(shapes, repeat=len(names)) if (r := _ranks(c)) < world]
    common = {"nodes": nodes, "llm_cp": 1}
    out = []
    for ltp in _divisors(gpn):
        for pp in pps:
            for ep, etp_ in ((ep, e) for ep in eps for e in sorted({1, ltp} if experts else {1})):
                llm = {"llm_tp": ltp, "llm_ep": ep, "llm_etp": etp_}
                colo_dp = derive_llm_dp_after(nodes, gpn, 0, ltp, pp)
                if colo_dp and pp == 1:
                    mods = tuple(ModuleShape(n, ltp, 1, colo_dp) for n in names)
                    out.append(
                        replace(
                            base, **common, **llm, encoders=mods, colocated=True, llm_pp=1, llm_dp=colo_dp
                        )
                    )
                llm_holds: dict[int, bool] = {}  # by the LLM's DP: whether the rules of the LLM alone hold
                for c, ranks in combos:
                    dp = derive_llm_dp_after(nodes, gpn, ranks, ltp, pp)
                    if not dp or not llm_holds.get(dp, True):
                        continue
                    mods = tuple(ModuleShape(n, t, 1, d) for n, (t, d) in zip(names, c))
                    lay = replace(base, **common, **llm, encoders=mods, colocated=False, llm_pp=pp, llm_dp=dp)
                    if prune and dp not in llm_holds:
                        llm_holds[dp] = not llm_check(lay, who)
                    if llm_holds.get(dp, True):
                        out.append(lay)
    return out


def _ranks(combo: tuple) -> int:
    """The ranks of one combination of encoder module shapes ((tp, dp) each)."""
    return sum(t * d for t, d in combo)


# Trainer settings that trade time for memory, tried on a layout only when the study's own settings do not
# fit: `encoder_inflight: 1`, then with every per-module recompute pair (the encoder may recompute while the
# LLM does not, and the reverse), fewest changes first. The fastest that fits is kept, and of settings
# predicted within TIE of it the earliest (the time model prices full recompute per module; the other
# settings cost no time in it, so a tie is not a reason to change more).
_RECOMPUTE_PAIRS = (  # (encoder, LLM), fewest changes first; the encoder first (the smaller module)
    ("selective", "none"),
    ("none", "selective"),
    ("selective", "selective"),
    ("full", "none"),
    ("none", "full"),
    ("full", "selective"),
    ("selective", "full"),
    ("full", "full"),
)
MEMORY_SAVERS: tuple[dict, ...] = ({"encoder_inflight": 1},) + tuple(
    {"encoder_inflight": 1, "recompute": RecomputeSpec(encoder=e, llm=l_)} for e, l_ in _RECOMPUTE_PAIRS
)
MBS_CHOICES = (1, 2, 4)  # tried on the fastest layouts only (pipeline depth versus kernel size)
MBS_TRIED_ON = 12
# Two times within this fraction are a tie, broken by memory headroom (the safer layout wins).
TIE = 0.005


def free_bytes(p: Prediction) -> int:
    return p.memory.capacity_bytes - p.memory.worst.total_bytes


def price_with_savers(shape: RunShape, lay: Layout, gpu: GPU, eff: Efficiency, headroom: int) -> Prediction:
    """`lay` priced with the study's settings, else with the fastest memory saver that fits (else the
    study's settings: the caller sees it does not fit)."""
    rs = on_layout(shape, lay)
    first = predict_shape(rs, gpu, eff, name=point_name(lay))
    if free_bytes(first) >= headroom:
        return first
    best: Prediction | None = None
    # a saver priced like one tried before it cannot beat it (it must be faster by TIE): skipped
    tried = {settings_priced(rs)}
    for saver in MEMORY_SAVERS:
        alt = replace(rs, **saver)
        if settings_priced(alt) in tried:
            continue
        tried.add(settings_priced(alt))
        p = predict_shape(alt, gpu, eff, name=point_name(lay))
        if free_bytes(p) >= headroom and (
            best is None or p.time.iteration_s < best.time.iteration_s / (1 + TIE)
        ):
            best = p
    return best or first


def settings_priced(rs: RunShape) -> tuple:
    """The memory savers' settings a prediction of `rs` reads: encoder_inflight and each module's recompute;
    a text-only model has no encoder, so the LLM's recompute alone (its savers price three settings, not
    nine; tests/predict/test_plan_memo.py prices every saver to hold the time and memory models to it)."""
    return (rs.recompute.llm,) if rs.preset.text_only else (rs.encoder_inflight, rs.recompute)


def ranked(cands: list[Candidate]) -> list[Candidate]:
    """By time; a run of times within TIE of its fastest is a tie, ordered by memory headroom (most first)."""
    by_time = sorted(cands, key=lambda c: c.prediction.time.iteration_s)
    out: list[Candidate] = []
    i = 0
    while i < len(by_time):
        limit = by_time[i].prediction.time.iteration_s * (1 + TIE)
        j = i
        while j < len(by_time) and by_time[j].prediction.time.iteration_s <= limit:
            j += 1
        out += sorted(by_time[i:j], key=lambda c: -free_bytes(c.prediction))
        i = j
    return out


def price_layouts(
    shape: RunShape, gpu: GPU, nodes: int, eff: Efficiency, headroom: int = 0
) -> tuple[list[Candidate], list[Candidate]]:
    """(layouts that fit with `headroom` bytes to spare, ranked; those that do not) on `nodes` nodes; the
    fastest fitting layouts are tried again with every microbatch size that tiles the batch."""
    fit, over = [], []
    who = trainer_of(shape)
    for lay in candidate_layouts(shape.layout, nodes, who):
        c = Candidate(lay, price_with_savers(shape, lay, gpu, eff, headroom))
        (fit if free_bytes(c.prediction) >= headroom else over).append(c)
    fit = ranked(fit)
    seen = {c.layout for c in fit}
    for c in fit[:MBS_TRIED_ON]:
        for mbs in MBS_CHOICES:
            lay = replace(c.layout, mbs=mbs)
            if lay in seen or check(lay, who):
                continue
            seen.add(lay)
            alt = Candidate(lay, price_with_savers(shape, lay, gpu, eff, headroom))
            (fit if free_bytes(alt.prediction) >= headroom else over).append(alt)
    return ranked(fit), over


def best_layouts(
    shape: RunShape, gpu: GPU, nodes: int, eff: Efficiency, top: int = 5, headroom: int = 0
) -> tuple[list[Candidate], int]:
    """The `top` fastest layouts that fit in memory, and how many feasible layouts were priced."""
    fit, over = price_layouts(shape, gpu, nodes, eff, headroom)
    return fit[:top], len(fit) + len(over)


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'s' if n != 1 else ''}"


def split_label(lay: Layout, text_only: bool = False) -> str:
    """Where the GPUs go, each encoder module under its name: "vision 2 nodes (16 GPUs) | LLM 31 nodes", in
    GPUs when not every side has whole nodes ("vision 4 GPUs + audio 2 GPUs | LLM 10 GPUs"); a text-only
    model (no encoder, only colocated layouts) runs its LLM on every GPU."""
    gpn = lay.gpus_per_node
    if lay.colocated:
        if text_only:
            return f"LLM on all {_count(lay.nodes, 'node')} (text-only)"
        names = " + ".join(m.name for m in lay.encoders)
        return f"colocated: {names} and LLM on all {_count(lay.nodes, 'node')}"
    llm = lay.world - lay.encoder_ranks
    if llm % gpn or any(m.ranks % gpn for m in lay.encoders):
        mods = " + ".join(f"{m.name} {_count(m.ranks, 'GPU')}" for m in lay.encoders)
        return f"{mods} | LLM {_count(llm, 'GPU')}"
    mods = " + ".join(
        f"{m.name} {_count(m.ranks // gpn, 'node')} ({_count(m.ranks, 'GPU')})" for m in lay.encoders
    )
    return f"{mods} | LLM {_count(llm // gpn, 'node')}"


def colocated_gbs(base: Layout, nodes: int) -> list[int]:
    """The global batches near base.gbs that some colocated layout on `nodes` nodes tiles (one below, one
    above when both exist); empty when base.gbs itself is tiled."""
    gpn = base.gpus_per_node
    steps = set()
    for tp in _divisors(gpn):
        dp = nodes * gpn // tp
        for ep in _divisors(base.num_experts) if base.num_experts else [1]:
            probe = replace(
                base,
                nodes=nodes,
                colocated=True,
                encoders=tuple(ModuleShape(m.name, tp, 1, dp) for m in base.encoders),
                llm_tp=tp,
                llm_pp=1,
                llm_dp=dp,
                llm_ep=ep,
                llm_etp=1,
                llm_cp=1,
                gbs=dp * base.mbs,
            )
            if not check(probe):
                steps.add(dp * base.mbs)
    if not steps or any(base.gbs % s == 0 for s in steps):
        return []
    below = max((base.gbs // s * s for s in steps if base.gbs >= s), default=None)
    above = min(-(-base.gbs // s) * s for s in steps)
    return sorted({g for g in (below, above) if g})


def point_name(lay: Layout) -> str:
    if lay.colocated:
        enc = "colo"
    elif lay.flat:  # the one `vision` module as the `encoder:` form names it
        (m,) = lay.encoders
        enc = f"e{m.tp}x{m.dp}"
    else:
        enc = "-".join(f"{m.name}{m.tp}x{m.dp}" for m in lay.encoders)
    pp = (f"p{lay.llm_pp}" if lay.llm_pp > 1 else "") + (f"t{lay.llm_etp}" if lay.llm_etp > 1 else "")
    pp += (f"v{lay.llm_vp}" if lay.llm_vp > 1 else "") + (f"c{lay.llm_cp}" if lay.llm_cp > 1 else "")
    return f"{lay.nodes}n-{enc}-l{lay.llm_tp}x{lay.llm_ep}x{lay.llm_dp}{pp}-g{lay.gbs}"


def point_dict(lay: Layout) -> dict:
    """The layout as a study's matrix point (a mapping: pasteable as YAML)."""
    llm = {"tp": lay.llm_tp}
    if lay.llm_pp > 1:
        llm["pp"] = lay.llm_pp
    if lay.llm_vp > 1:
        llm["vp"] = lay.llm_vp
    if lay.llm_cp > 1:
        llm["cp"] = lay.llm_cp
    if lay.num_experts:
        llm["ep"] = lay.llm_ep
        if lay.llm_etp > 1:
            llm["etp"] = lay.llm_etp
    llm["dp"] = lay.llm_dp
    point: dict = {"nodes": lay.nodes}
    if lay.colocated:
        point["colocated"] = True
    elif lay.flat:  # a study's `encoder:` form
        (m,) = lay.encoders
        point["encoder"] = {"tp": m.tp, "dp": m.dp}
    else:
        point["encoders"] = {m.name: {"tp": m.tp, "dp": m.dp} for m in lay.encoders}
    point["llm"] = llm
    point["gbs"] = lay.gbs
    if lay.mbs > 1:
        point["mbs"] = lay.mbs
    return point


def flow(v) -> str:
    """A value as flow-style YAML (mappings on one line)."""
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {flow(x)}" for k, x in v.items()) + "}"
    return "true" if v is True else str(v)


def yaml_point(lay: Layout) -> str:
    """point_dict as one flow-style YAML list item."""
    return f"- {flow(point_dict(lay))}"


def trainer_changes(shape: RunShape, p: Prediction) -> dict:
    """The trainer settings a candidate needs that differ from the study's (a memory saver), as a study
    file writes them: recompute as one value, or per module when the modules differ."""
    out: dict = {}
    if p.shape.encoder_inflight != shape.encoder_inflight:
        out["encoder_inflight"] = p.shape.encoder_inflight
    if p.shape.recompute != shape.recompute:
        out["recompute"] = p.shape.recompute.compact()
    return out


def trainer_words(shape: RunShape, p: Prediction) -> list[str]:
    """trainer_changes as the lines a study file takes ("trainer.recompute: {encoder: full, llm: none}")."""
    return [f"trainer.{k}: {flow(v)}" for k, v in trainer_changes(shape, p).items()]


def recompute_dict(p: Prediction) -> dict[str, str]:
    """The recompute setting a candidate is priced with, per module."""
    return {"encoder": p.shape.recompute.encoder, "llm": p.shape.recompute.llm}

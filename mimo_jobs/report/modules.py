"""Every module's phases, from every rank's own timers (rank_memory's timing columns, contract.memory): per
run and module (each encoder module's ranks, under its name in the study: vision, audio; each LLM pipeline
stage's; or the colocated ranks) how much of the step its ranks computed, how much they waited for the other
side, its idle fraction, and which module bounds the step, beside the planner's bottleneck and predicted
idle fraction (predict/steptime.py, predict/several.py). Pure: rows in, rows out.

Per module, over its ranks (sums of the iterations each rank's job ran after its first):
  step     wall time per iteration, sum(elapsed) / sum(iterations);
  busy     the rank's own work: BUSY phases (forward, backward, drawing its data);
  wait     blocked on the other module or stage: WAIT phases (bridge receives/sends, pipeline p2p);
  rest     optimizer (gradient reduction and step) and untimed (world all-reduces of the token counts and
           figures, LR, zeroing): step - busy - wait, common to both sides;
  idle     wait / (busy + wait): the share of its microbatch pipeline it spent waiting, the measured
           counterpart of the planner's idle fraction, 1 - min(e, l) / max(e, l) (e, l: one microbatch's
           time on the encoder and on an LLM stage).
The module with the most busy time per iteration (an encoder module, or the busiest LLM stage) bounds the
step; the other side's idle fraction says how much of it waits (the encoder side's pooled over its modules).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from mimo_jobs.contract.memory import PHASE_SECONDS
from mimo_jobs.contract.modules import LLM

from .model import PredictedRow, RunRow

BUSY = ("enc_fwd", "enc_bwd", "llm_fwd", "llm_bwd", "data")
WAIT = ("bridge_wait", "pipeline_wait")
OPTIMIZER = "optimizer"


@dataclass
class ModuleRow:
    """One module (or LLM stage) of a run, as its ranks' own timers measured it (ms per iteration)."""

    study: str
    run_id: str
    name: str
    module: str  # an encoder module's name in the study (vision, audio) | llm | llm stage <k> | colocated
    role: str  # contract.memory.ROLES
    stage: int | None  # the LLM pipeline stage (None for the encoder)
    ranks: int
    iterations: int  # timed iterations summed over its ranks
    step_ms: float
    busy_ms: float
    wait_ms: float
    optimizer_ms: float
    untimed_ms: float  # step - every timed phase
    busy_share: float  # of the step
    wait_share: float
    rest_share: float  # optimizer + untimed: 1 - busy_share - wait_share
    idle: float | None  # wait / (busy + wait)
    phase_ms: dict[str, float] = field(default_factory=dict)  # every timed phase


@dataclass
class BoundRow:
    """Which module of a run bounds the step, measured and as the planner predicted it."""

    study: str
    run_id: str
    name: str
    colocated: bool
    bound: str | None  # the module with the most busy time per iteration (None: colocated, no sides)
    bound_side: str | None  # encoder | llm
    encoder_busy_ms: float | None  # the busiest encoder module's
    llm_busy_ms: float | None  # the busiest LLM stage's
    encoder_idle: float | None  # over every encoder rank
    llm_idle: float | None  # over every LLM rank
    other_idle: float | None  # the idle fraction of the side that does not bound
    predicted_bottleneck: str | None  # the planner's: an encoder module's name, or llm
    predicted_idle: float | None  # of the side that waits for it
    agrees: bool | None  # the measured bounding module is the predicted one (an LLM stage: llm)


def _rank_timings(ranks: list[dict]) -> dict[str, dict[int, dict]]:
    """run_id -> rank -> its row with timings (a colocated rank's module rows hold the same)."""
    out: dict[str, dict[int, dict]] = defaultdict(dict)
    for r in ranks:
        if r.get("role") and r.get("timed_iterations") and r.get("elapsed_s") is not None:
            out[r["run_id"]].setdefault(r["rank"], r)
    return out


def _module_of(r: dict, staged: bool) -> tuple[str, int | None]:
    """The module row a rank's timings count to: an encoder rank's module (the store names it as the study
    does), the LLM's stage, or the colocated ranks."""
    if r["role"] == "encoder":
        return r["module"], None
    stage = int(r.get("pp_rank") or 0)
    label = r["role"] + (f" stage {stage}" if staged else "")
    return label, stage


def module_row(run: RunRow, module: str, role: str, stage: int | None, ranks: list[dict]) -> ModuleRow:
    """One module's figures from its ranks' timing rows (the fields of rank_memory)."""
    n = sum(int(r["timed_iterations"]) for r in ranks)
    elapsed = sum(float(r["elapsed_s"]) for r in ranks)
    ph = {p: sum(float(r.get(c) or 0.0) for r in ranks) for p, c in PHASE_SECONDS.items()}
    busy, wait, opt = sum(ph[p] for p in BUSY), sum(ph[p] for p in WAIT), ph[OPTIMIZER]
    share = (lambda x: x / elapsed) if elapsed > 0 else (lambda x: 0.0)
    per = 1e3 / n
    return ModuleRow(
        study=run.study,
        run_id=run.run_id,
        name=run.name,
        module=module,
        role=role,
        stage=stage,
        ranks=len(ranks),
        iterations=n,
        step_ms=elapsed * per,
        busy_ms=busy * per,
        wait_ms=wait * per,
        optimizer_ms=opt * per,
        untimed_ms=(elapsed - sum(ph.values())) * per,
        busy_share=share(busy),
        wait_share=share(wait),
        rest_share=1.0 - share(busy) - share(wait),
        idle=wait / (busy + wait) if busy + wait > 0 else None,
        phase_ms={_phase_name(p, module, role): v * per for p, v in ph.items() if v > 0},
    )


def _phase_name(phase: str, module: str, role: str) -> str:
    """An encoder module's own forward and backward under its name (vision_fwd), as the iteration records
    of several encoders name them; every other phase as contract.iteration.PHASES does."""
    if role == "encoder" and phase in ("enc_fwd", "enc_bwd"):
        return f"{module}_{phase[4:]}"
    return phase


def module_rows(rank_memory: list[dict], runs: list[RunRow]) -> list[ModuleRow]:
    """Per run (in the report's order) its modules: encoder modules in rank order, then LLM stages, or the
    colocated ranks."""
    timings = _rank_timings(rank_memory)
    out = []
    for run in runs:
        by_rank = timings.get(run.run_id)
        if not by_rank:
            continue
        staged = any(r["role"] != "encoder" and (r.get("pp_rank") or 0) > 0 for r in by_rank.values())
        groups: dict[tuple, list[dict]] = defaultdict(list)
        for r in by_rank.values():
            label, stage = _module_of(r, staged)
            groups[(label, r["role"], stage or 0)].append(r)
        # encoder modules by their first rank (the layout's order), then the LLM's stages
        order = sorted(groups, key=lambda k: (k[1] != "encoder", k[2], min(x["rank"] for x in groups[k])))
        for label, role, stage in order:
            out.append(
                module_row(
                    run, label, role, None if role == "encoder" else stage, groups[(label, role, stage)]
                )
            )
    return out


def _pooled_idle(mods: list[ModuleRow]) -> float | None:
    busy = sum(m.busy_ms * m.iterations for m in mods)
    wait = sum(m.wait_ms * m.iterations for m in mods)
    return wait / (busy + wait) if mods and busy + wait > 0 else None


def bound_row(run: RunRow, mods: list[ModuleRow], pred: PredictedRow | None) -> BoundRow:
    """The run's bounding side from its module rows, beside the planner's."""
    enc = [m for m in mods if m.role == "encoder"]
    llm = [m for m in mods if m.role == "llm"]
    p_bottleneck = pred.bottleneck if pred is not None else None
    # colocated, no side waits for the other: the planner's idle fraction is 0 by construction
    p_idle = pred.idle_fraction if pred is not None and not run.colocated else None
    row = BoundRow(run.study, run.run_id, run.name, run.colocated, None, None, None, None, None, None, None,
                   p_bottleneck, p_idle, None)  # fmt: skip
    if not enc or not llm:
        return row  # colocated (every rank runs every module), or one side's timers missing
    busiest = max(llm, key=lambda m: m.busy_ms)
    slowest = max(enc, key=lambda m: m.busy_ms)
    row.encoder_busy_ms, row.llm_busy_ms = slowest.busy_ms, busiest.busy_ms
    row.encoder_idle, row.llm_idle = _pooled_idle(enc), _pooled_idle(llm)
    if slowest.busy_ms > busiest.busy_ms:
        row.bound, row.bound_side, row.other_idle = slowest.module, "encoder", row.llm_idle
    else:
        row.bound, row.bound_side, row.other_idle = busiest.module, "llm", row.encoder_idle
    if p_bottleneck is not None:
        row.agrees = p_bottleneck == (LLM if row.bound_side == "llm" else row.bound)
    return row


def bound_rows(mods: list[ModuleRow], runs: list[RunRow], predicted: list[PredictedRow]) -> list[BoundRow]:
    """One row per run with module timings."""
    by_run: dict[str, list[ModuleRow]] = defaultdict(list)
    for m in mods:
        by_run[m.run_id].append(m)
    preds = {p.run_id: p for p in predicted}
    return [bound_row(r, by_run[r.run_id], preds.get(r.run_id)) for r in runs if r.run_id in by_run]

"""Each module's forward and backward per iteration from the iteration records' phases, and which module
bounds the step, beside the planner's bottleneck. Pure: phase means in, rows out.

The iteration record (contract.iteration) names a module's phases `<module>_fwd` and `<module>_bwd`: one
pair per encoder module under its name in the study (e.g. `vision_fwd`, `audio_bwd`) and the LLM's
`llm_fwd`/`llm_bwd`. A record of one encoder names it `enc_fwd`/`enc_bwd`: that is the run's one encoder
module (`vision` for a run of `encoder:` and for records older than module names). The module with the most
forward + backward time per iteration bounds the step; the planner's bottleneck (predict/several.py) is the
module whose one microbatch takes longest, by the study's name (report/predicted.py names it so).
"""

from __future__ import annotations

from dataclasses import dataclass

from mimo_jobs.model.arch import VISION

from .model import PredictedRow, RunRow

ONE_ENCODER = "enc"  # the phases' prefix for a run's one encoder module
LLM = "llm"
SIDES = ("fwd", "bwd")


@dataclass
class EncoderPhaseRow:
    """One module of a run: its forward and backward ms per iteration (mean over the steady window)."""

    study: str
    run_id: str
    name: str
    module: str  # an encoder module's name, or "llm"
    fwd_ms: float | None
    bwd_ms: float | None
    bounds: bool  # the module with the most forward + backward time of the run
    predicted_bottleneck: str | None  # the planner's, for the run (a module's name in the study, or llm)

    @property
    def busy_ms(self) -> float:
        return (self.fwd_ms or 0.0) + (self.bwd_ms or 0.0)


def phase_module(key: str, encoders: list[str]) -> tuple[str, str] | None:
    """(module, "fwd" | "bwd") of a phase key of a run with these encoder modules (None: not a module's
    forward or backward, e.g. bridge_wait, or a module the run does not have)."""
    head, _, side = key.rpartition("_")
    if side not in SIDES:
        return None
    if head == ONE_ENCODER:
        return (encoders[0] if len(encoders) == 1 else VISION), side
    if head == LLM or head in encoders:
        return head, side
    return None


def run_phase_rows(run: RunRow, encoders: list[str], means: dict[str, float], pred: PredictedRow | None):
    """A run's rows, encoder modules in rank order then the LLM; none when no module phase was timed."""
    got: dict[str, dict[str, float]] = {}
    for key, ms in means.items():
        where = phase_module(key, encoders or [VISION])
        if where is not None and ms is not None:
            got.setdefault(where[0], {})[where[1]] = ms
    if not got:
        return []
    order = [m for m in [*(encoders or [VISION]), LLM] if m in got]
    rows = [
        EncoderPhaseRow(
            run.study,
            run.run_id,
            run.name,
            m,
            got[m].get("fwd"),
            got[m].get("bwd"),
            False,
            pred.bottleneck if pred is not None else None,
        )
        for m in order
    ]
    max(rows, key=lambda r: r.busy_ms).bounds = True
    return rows


def encoder_phase_rows(
    runs: list[RunRow], modules: dict[str, list[str]], means: dict[str, dict], predicted: list[PredictedRow]
) -> list:
    """Every run's rows whose records time a module (`modules`: run id -> encoder module names in rank
    order; `means`: run id -> phase -> mean ms)."""
    preds = {p.run_id: p for p in predicted}
    out = []
    for r in runs:
        out += run_phase_rows(r, modules.get(r.run_id, []), means.get(r.run_id, {}), preds.get(r.run_id))
    return out

"""Predictions against measured runs: each run's error before and after calibration, and a hold-out check.

Calibrated figures are the planner run again with the fitted efficiencies (not the fit's linear
approximation), so a bottleneck that moves from one module to the other is priced as `predict` prices it.
Hold-out: the runs are split into folds, by node count when there are two or more, else one run per fold;
each fold is predicted with efficiencies fitted on the other folds only, and its error is compared with
the uncalibrated one. That error is what calibration buys on a run it has not seen.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .calibrate import Point, Scales, fit, mean_abs, relative_error
from .estimate import Prediction, predict_shape
from .hardware import GPU
from .run import RunShape
from .steptime import Efficiency, efficiency_for


@dataclass(frozen=True)
class Measured:
    """A run of the study and its measured (report: steady-state median) iteration seconds."""

    name: str
    run_id: str
    shape: RunShape
    measured_s: float


@dataclass(frozen=True)
class RunCheck:
    name: str
    run_id: str
    nodes: int
    measured_s: float
    uncalibrated_s: float
    calibrated_s: float  # efficiencies fitted on every run
    holdout_s: float | None  # efficiencies fitted without this run's fold

    @property
    def uncalibrated_error(self) -> float:
        return relative_error(self.uncalibrated_s, self.measured_s)

    @property
    def calibrated_error(self) -> float:
        return relative_error(self.calibrated_s, self.measured_s)

    @property
    def holdout_error(self) -> float | None:
        return None if self.holdout_s is None else relative_error(self.holdout_s, self.measured_s)


@dataclass(frozen=True)
class Calibration:
    scales: Scales
    efficiency: Efficiency
    runs: list[RunCheck]
    holdout_by: str  # "nodes" | "run" | "" (a single run: nothing to hold out)

    @property
    def error_before(self) -> float | None:
        return mean_abs([r.uncalibrated_error for r in self.runs])

    @property
    def error_after(self) -> float | None:
        return mean_abs([r.calibrated_error for r in self.runs])

    @property
    def holdout_error_before(self) -> float | None:
        return mean_abs([r.uncalibrated_error for r in self.runs if r.holdout_s is not None])

    @property
    def holdout_error_after(self) -> float | None:
        return mean_abs([r.holdout_error for r in self.runs if r.holdout_error is not None])


def point_of(p: Prediction, measured_s: float) -> Point:
    t = p.time
    fixed = t.iteration_s - t.encoder_compute_s - t.llm_compute_s - t.network_s - t.latency_s
    return Point(p.name, t.encoder_compute_s, t.llm_compute_s, t.network_s, fixed, measured_s, t.latency_s)


def _folds(runs: list[Measured]) -> tuple[str, list[list[int]]]:
    nodes = sorted({m.shape.layout.nodes for m in runs})
    if len(nodes) > 1:
        return "nodes", [[i for i, m in enumerate(runs) if m.shape.layout.nodes == n] for n in nodes]
    if len(runs) > 1:
        return "run", [[i] for i in range(len(runs))]
    return "", []


def calibrate(runs: list[Measured], gpu: GPU, base: Efficiency | None = None) -> Calibration:
    """Fit on `runs` (each with a measured time > 0), and hold each fold out in turn. The fit scales the
    FLOPs model's terms (fit.py), so every time here is the FLOPs model's, whatever the GPU's time_model:
    points taken from the operator model would be scaled as if they were the FLOPs model's terms."""
    gpu = replace(gpu, time_model="flops")
    base = base or efficiency_for(gpu)
    runs = [m for m in runs if m.measured_s > 0]
    if not runs:
        raise ValueError("no measured run to calibrate against")
    before = [predict_shape(m.shape, gpu, base, m.name, m.run_id) for m in runs]
    points = [point_of(p, m.measured_s) for p, m in zip(before, runs)]
    scales = fit(points)
    eff = scales.efficiency(base)
    after = [predict_shape(m.shape, gpu, eff).time.iteration_s for m in runs]
    held: list[float | None] = [None] * len(runs)
    how, folds = _folds(runs)
    for fold in folds:
        train = [pt for i, pt in enumerate(points) if i not in fold]
        fold_eff = fit(train).efficiency(base)
        for i in fold:
            held[i] = predict_shape(runs[i].shape, gpu, fold_eff).time.iteration_s
    checks = [
        RunCheck(m.name, m.run_id, m.shape.layout.nodes, m.measured_s, p.time.iteration_s, a, h)
        for m, p, a, h in zip(runs, before, after, held)
    ]
    return Calibration(scales, eff, checks, how)

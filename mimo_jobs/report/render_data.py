"""Machine-readable renderings: JSON (the whole report) and CSV (one row per run: its figures, its pair and
group verdict, its repeats' aggregate, the planner's prediction, and its modules' phases)."""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace
from datetime import datetime

from .fmt import csv_cell
from .model import Report, RunRow
from .modules import ModuleRow
from .repeats import base_name

CSV_COLS = [
    "study",
    "run_id",
    "name",
    "nodes",
    "gpus",
    "gbs",
    "seq_length",
    "model",
    "layout",
    "state",
    "state_source",
    "iterations",
    "train_iters",
    "jobs",
    "window_from",
    "window_n",
    "t_median_ms",
    "t_mean_ms",
    "t_std_ms",
    "samples_per_s",
    "slots_per_s",
    "samples_per_s_per_gpu",
    "slots_per_s_per_gpu",
    "tokens_per_s",
    "tokens_per_s_per_gpu",
    "loss_tokens_per_s_per_gpu",
    "padded_share",
    "image_tokens_per_sample",
    "mfu",
    # what the run's own log says (report/external.py): its TFLOP/s/GPU, the MFU that implies, the MoE loss
    "log_tflops_per_gpu",
    "log_mfu",
    "moe_aux_loss",
    "log_extras",
    "program",
    "final_loss",
    "final_samples",
    "efficiency",
    "speedup",
    "loss_parity_rel",
    "colocated",
    "relative_throughput",
    "layout_note",
    "gpu_hours",
    "node_hours",
    "gpu_hours_per_billion_tokens",
    "budget_hours",
    "budget_gpu_hours",
    "repeat",
    "pkg_version",
    "git_sha",
    "flags",
]
# a heterogeneous run's comparison with the fastest colocated run of its group (compare.py), empty for others
PAIR_COLS = [
    "paired_colocated_run",
    "pair_time_ratio",
    "pair_tokens_ratio",
    "pair_loss_max_rel_diff",
    "pair_verdict",
]
# the planner's prediction of the run (predicted.py), empty when the run has none
PRED_COLS = [
    "predicted_s_per_iter",
    "predicted_error",
    "predicted_tokens_per_s_per_gpu",
    "predicted_tokens_error",
    # with enough measured runs in the study (predicted.CALIBRATION_RUNS): fitted on all, and held out
    "predicted_calibrated_s",
    "predicted_calibrated_error",
    "predicted_holdout_s",
    "predicted_holdout_error",
]
# in a study, node count and GBS holding both kinds (compare.group_verdicts): whether the run is the fastest
# of its kind there, and the group's verdict (its fastest heterogeneous run against its fastest colocated
# one, naming both), on every run of the group
GROUP_COLS = ["fastest_of_its_kind", "group_verdict"]
# the run's layout aggregated over its repeats (repeats.py), empty for a run not repeated
REPEAT_COLS = [
    "repeat_group",
    "repeat_runs",
    "repeat_t_mean_ms",
    "repeat_t_ci95_ms",
    "repeat_t_spread_ms",
    "repeat_metric",
    "repeat_perf_mean",
    "repeat_perf_ci95",
    "repeat_perf_spread",
    "repeat_flags",
]
# which side bounds the step, measured and predicted (modules.BoundRow); then per module of the report
# (encoder, llm or llm_stage_<k>, colocated) its busy and wait shares of the step and its idle fraction
BOUND_COLS = {
    "bounds_the_step": "bound",
    "encoder_busy_ms": "encoder_busy_ms",
    "llm_busy_ms": "llm_busy_ms",
    "encoder_idle": "encoder_idle",
    "llm_idle": "llm_idle",
    "other_idle": "other_idle",
    "predicted_bottleneck": "predicted_bottleneck",
    "predicted_idle_of_the_other": "predicted_idle",
    "bound_agrees": "agrees",
}
MODULE_FIGURES = ("busy_share", "wait_share", "idle")


def _default(o):
    if isinstance(o, datetime):
        return o.isoformat()
    raise TypeError(f"not JSON serializable: {type(o).__name__}")


def finite(o):
    """`o` (dicts, lists, scalars) with every NaN/inf float as None: they are not JSON, they become null."""
    if isinstance(o, float) and (o != o or o in (float("inf"), float("-inf"))):
        return None
    if isinstance(o, dict):
        return {k: finite(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [finite(v) for v in o]
    return o


def _num(v) -> str:
    if isinstance(v, float):
        return float.__repr__(v) if math.isfinite(v) else "null"  # as json.dumps after finite()
    return "null" if v is None else json.dumps(v)


def _curves_json(curves: dict[str, list[tuple[float, float]]], level: int = 1) -> str:
    """The curves as json.dumps(indent=2) writes them at nesting `level`, ~10x faster: the indenting
    encoder is pure Python, and a 100-run report has ~40,000 points of one fixed shape."""
    if not curves:
        return "{}"
    i1, i2, i3 = "  " * (level + 1), "  " * (level + 2), "  " * (level + 3)
    items = []
    for rid, pts in curves.items():
        key = json.dumps(rid)
        if not pts:
            items.append(f"{i1}{key}: []")
            continue
        body = ",\n".join(f"{i2}[\n{i3}{_num(x)},\n{i3}{_num(y)}\n{i2}]" for x, y in pts)
        items.append(f"{i1}{key}: [\n{body}\n{i1}]")
    return "{\n" + ",\n".join(items) + "\n" + "  " * level + "}"


def render_json(report: Report) -> str:
    # Everything but the curves through json.dumps; the curves (most of the text) written directly, in
    # the same layout (tests/report/test_render_data.py compares with json.dumps of the whole report).
    doc = replace(report, curves={}).to_dict()
    marker = "@@curves-" + "x" * 8 + "@@"
    doc["curves"] = marker
    text = json.dumps(finite(doc), indent=2, default=_default, allow_nan=False)
    return text.replace(json.dumps(marker), _curves_json(report.curves), 1) + "\n"


def _cell(r: RunRow, c: str):
    v = getattr(r, c)
    if c == "flags":
        return "; ".join(v)
    if c == "log_extras":
        return "; ".join(f"{k}={x!r}" for k, x in sorted(v.items()))
    return "" if v is None else v


# Python's csv writer quotes a field holding its line terminator ("\n") but not a lone "\r", which every
# CSV reader takes for a line end: a name holding one would split its row. Quoted here is any field holding
# a separator, a quote or either line-end character.
_QUOTED = re.compile('[,"\r\n]')


def _csv_field(v) -> str:
    s = v if isinstance(v, str) else str(v)  # str(float) is repr: every digit, as csv.writer writes it
    return '"' + s.replace('"', '""') + '"' if _QUOTED.search(s) else s


def _csv_line(cells: list) -> str:
    """One CSV line; every cell through csv_cell first, so a spreadsheet opening the file evaluates none."""
    return ",".join(_csv_field(csv_cell(c)) for c in cells) + "\n"


def render_csv(report: Report) -> str:
    phases = []
    for r in report.runs:
        phases += [p for p in r.phase_share if p not in phases]
    pairs = {}  # a heterogeneous run's pair against the fastest colocated run of its group, else its first
    for p in report.pairs:
        if (p.study, p.hetero_run) not in pairs or p.best_colocated:
            pairs[(p.study, p.hetero_run)] = p
    preds = {p.run_id: p for p in report.predicted}
    groups = _group_verdicts(report)
    reps = {(x.study, x.name): x for x in report.repeats}
    bounds = {b.run_id: b for b in report.bounds}
    mods: dict[str, dict[str, ModuleRow]] = {}  # run_id -> module column key -> its row
    for m in report.modules:
        mods.setdefault(m.run_id, {})[m.module.replace(" ", "_")] = m
    labels = list(dict.fromkeys(k for by in mods.values() for k in by))
    module_cols = [f"{k}_{f}" for k in labels for f in MODULE_FIGURES]
    head = CSV_COLS + [f"share_{p}" for p in phases] + PAIR_COLS + PRED_COLS + GROUP_COLS + REPEAT_COLS
    lines = [_csv_line(head + list(BOUND_COLS) + module_cols)]
    for r in report.runs:
        rep = reps.get((r.study, base_name(r))) if r.repeat is not None else None
        b, by = bounds.get(r.run_id), mods.get(r.run_id, {})
        lines.append(
            _csv_line(
                [_cell(r, c) for c in CSV_COLS]
                + [r.phase_share.get(p, "") for p in phases]
                + _pair_cells(pairs.get((r.study, r.name)))
                + _pred_cells(preds.get(r.run_id))
                + _group_cells(r, groups.get((r.study, r.nodes, r.gbs)))
                + _repeat_cells(rep)
                + _blank([getattr(b, f) if b is not None else None for f in BOUND_COLS.values()])
                + _blank([getattr(by[k], f) if k in by else None for k in labels for f in MODULE_FIGURES])
            )
        )
    return "".join(lines)


def _blank(vals: list) -> list:
    return ["" if v is None else v for v in vals]


def _group_verdicts(report: Report) -> dict[tuple, tuple[str, str, str]]:
    """(study, nodes, GBS) -> (fastest heterogeneous run, fastest colocated run, their verdict)."""
    return {
        (p.study, p.nodes, p.gbs): (p.hetero_run, p.colocated_run, p.verdict)
        for p in report.pairs
        if p.best_hetero and p.best_colocated
    }


def _group_cells(r: RunRow, group: tuple[str, str, str] | None) -> list:
    if group is None:
        return [""] * len(GROUP_COLS)
    return [r.name == group[1 if r.colocated else 0], group[2]]


def _repeat_cells(x) -> list:
    if x is None:
        return [""] * len(REPEAT_COLS)
    vals = [x.name, x.runs, x.t_mean_ms, x.t_ci95_ms, x.t_spread_ms, x.metric, x.perf_mean, x.perf_ci95,
            x.perf_spread, "; ".join(x.flags)]  # fmt: skip
    return _blank(vals)


def _pair_cells(p) -> list:
    if p is None:
        return [""] * len(PAIR_COLS)
    vals = [p.colocated_run, p.time_ratio, p.tokens_ratio, p.loss_max_rel_diff, p.verdict]
    return ["" if v is None else v for v in vals]


def _pred_cells(p) -> list:
    if p is None:
        return [""] * len(PRED_COLS)
    vals = [p.predicted_s, p.error, p.predicted_tokens_per_s_per_gpu, p.tokens_error]
    vals += [p.calibrated_s, p.calibrated_error, p.holdout_s, p.holdout_error]
    return ["" if v is None else v for v in vals]

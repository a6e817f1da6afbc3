"""Machine-readable renderings: JSON (the whole report) and CSV (one row per run)."""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace
from datetime import datetime

from .fmt import csv_cell
from .model import Report, RunRow

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
    "tokens_per_s",
    "samples_per_s_per_gpu",
    "tokens_per_s_per_gpu",
    "carried_tokens_per_s",
    "carried_tokens_per_s_per_gpu",
    "loss_tokens_per_s_per_gpu",
    "padded_share",
    "image_tokens_per_sample",
    "mfu",
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
]


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
    lines = [_csv_line(CSV_COLS + [f"share_{p}" for p in phases] + PAIR_COLS + PRED_COLS)]
    for r in report.runs:
        lines.append(
            _csv_line(
                [_cell(r, c) for c in CSV_COLS]
                + [r.phase_share.get(p, "") for p in phases]
                + _pair_cells(pairs.get((r.study, r.name)))
                + _pred_cells(preds.get(r.run_id))
            )
        )
    return "".join(lines)


def _pair_cells(p) -> list:
    if p is None:
        return [""] * len(PAIR_COLS)
    vals = [p.colocated_run, p.time_ratio, p.tokens_ratio, p.loss_max_rel_diff, p.verdict]
    return ["" if v is None else v for v in vals]


def _pred_cells(p) -> list:
    if p is None:
        return [""] * len(PRED_COLS)
    vals = [p.predicted_s, p.error, p.predicted_tokens_per_s_per_gpu, p.tokens_error]
    return ["" if v is None else v for v in vals]

"""Machine-readable renderings: JSON (the whole report) and CSV (one row per run)."""

from __future__ import annotations

import csv
import io
import json
from datetime import datetime

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
    "mfu",
    "final_loss",
    "final_samples",
    "efficiency",
    "speedup",
    "loss_parity_rel",
    "flags",
]


def _default(o):
    if isinstance(o, datetime):
        return o.isoformat()
    raise TypeError(f"not JSON serializable: {type(o).__name__}")


def _clean(o):
    """NaN/inf are not JSON: they become null."""
    if isinstance(o, float) and (o != o or o in (float("inf"), float("-inf"))):
        return None
    if isinstance(o, dict):
        return {k: _clean(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_clean(v) for v in o]
    return o


def render_json(report: Report) -> str:
    return json.dumps(_clean(report.to_dict()), indent=2, default=_default, allow_nan=False) + "\n"


def _cell(r: RunRow, c: str):
    v = getattr(r, c)
    if c == "flags":
        return "; ".join(v)
    return "" if v is None else v


def render_csv(report: Report) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    phases = []
    for r in report.runs:
        phases += [p for p in r.phase_share if p not in phases]
    w.writerow(CSV_COLS + [f"share_{p}" for p in phases])
    for r in report.runs:
        w.writerow([_cell(r, c) for c in CSV_COLS] + [r.phase_share.get(p, "") for p in phases])
    return buf.getvalue()

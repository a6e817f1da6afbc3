"""Our trainer's metrics.jsonl: one JSON record a line (contract.IterationRecord, plus start/end records)
into staged iteration and event rows. A line that is not such a record is counted bad."""

from __future__ import annotations

import json
from datetime import datetime, timezone

from mimo_jobs.contract.iteration import PHASES, VALUE_COLUMNS

from .readers import FileState
from .runs import RunCtx
from .staging import measured_time
from .timestamps import find_time, store_text

# the record keys staged as they are, in the iterations table's order (between time and phases)
_VALUE_KEYS = tuple(VALUE_COLUMNS)


def metrics_rows(text: str, first: int, st: FileState, ctx: RunCtx, stage, src: str) -> None:
    """Stage the records of a block of complete lines (`first`: the line number before the block)."""
    line_no = first
    for line in text.split("\n")[:-1]:
        line_no += 1
        if not line.strip():
            continue
        try:
            r = json.loads(line)
            if not isinstance(r, dict):
                raise ValueError("not an object")
            kind = r.get("kind", "iteration")
            if kind == "iteration":
                _iteration(r, st, ctx, stage, src)
            elif kind in ("start", "end"):
                _lifecycle(r, kind, ctx, stage, src, line_no)
        except (ValueError, KeyError, TypeError):
            st.bad += 1


def _iteration(r: dict, st: FileState, ctx: RunCtx, stage, src: str) -> None:
    it = int(r["iteration"])
    phases = r.get("phases_ms") or {}
    extras = r.get("extras") or {}
    t = store_text(_parse_iso(r.get("time")))
    job, attempt = str(r.get("job_id") or "unknown"), int(r.get("attempt") or 0)
    # no time at all (zero, negative, NaN, infinite): the line is counted bad, its other figures kept
    no_time = r.get("elapsed_ms") is not None and not measured_time(r["elapsed_ms"])
    if no_time:
        r = {**r, "elapsed_ms": None}
    staged = stage.iteration(
        [ctx.run_id, job, it, t, *[r.get(k) for k in _VALUE_KEYS], json.dumps(phases), json.dumps(extras)]
        + ["jsonl", attempt, r.get("train_iters"), src, *[_float(phases.get(p)) for p in PHASES]]
    )
    if not staged:
        raise ValueError("iteration out of the store's range")  # counted as a bad line
    st.bad += no_time
    st.last_time = t or st.last_time


def _lifecycle(r: dict, kind: str, ctx: RunCtx, stage, src: str, line_no: int) -> None:
    """A start/end record: an event whose message is the record's other fields."""
    msg = {k: v for k, v in r.items() if k not in ("kind", "run_id", "job_id", "time")}
    job = str(r.get("job_id") or "unknown")
    t = store_text(_parse_iso(r.get("time")))
    stage.event([ctx.run_id, job, None, None, t, kind, json.dumps(msg, default=str)[:2000], src, line_no])


def _float(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _parse_iso(s) -> datetime | None:
    """A record's time: ISO 8601 (an offset is converted: the store keeps naive UTC), else any timestamp in
    the text."""
    if not s or not isinstance(s, str):
        return None
    try:
        t = datetime.fromisoformat(s.replace("Z", "+00:00"))
    except ValueError:
        return find_time(s)
    if t.tzinfo is not None:
        t = t.astimezone(timezone.utc).replace(tzinfo=None)
    return t

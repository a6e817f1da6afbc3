"""Megatron iteration lines: ` [time] iteration N/ M | key: value | ... |`.

The fields are parsed generically as `key: value |` pairs, so upstream Megatron-LM logs (dynamic loss keys,
MoE keys, fields absent on some ranks, timestamps with or without microseconds) and our trainer's lines go
through the same code. Known keys become columns (`COLUMN_OF`), keys that name a loss become the loss and
MoE aux loss columns or extras, anything else is kept in the extras JSON.

- `iteration_head`: the cheap first look (iteration, total, timestamp, where the fields start);
- `fast_fields`: the fields of an all-numbers line, with a per-key-sequence plan cached (the hot path);
- `parse_fields` + `main_losses`: the generic parser, which decides every other line (and defines what
  `fast_fields` and the compiled scanner must give);
- `parse_iteration`: one whole line as a `MegatronIteration`.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from datetime import datetime

from .staging import ITER_TYPES, storable_int
from .timestamps import make_time

ITERATION_TRIGGER = "iteration"  # the substring that makes a line a candidate iteration line

_ITER_RE = re.compile(
    r"(?:\[(\d{4})-(\d{2})-(\d{2}) (\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,6}))?\]\s*)?"
    r"iteration\s+(\d+)\s*/\s*(\d+)\s*\|"
)

# Megatron key -> our column. Everything else lands in `extras` (loss keys in extras["losses"]).
_FLOAT_KEYS = {
    "elapsed time per iteration (ms)": "elapsed_ms",
    "throughput per GPU (TFLOP/s/GPU)": "tflops_per_gpu",
    "learning rate": "lr",
    "loss scale": "loss_scale",
    "grad norm": "grad_norm",
}
_INT_KEYS = {
    "consumed samples": "consumed_samples",
    "global batch size": "gbs",
    "number of skipped iterations": "skipped",
    "number of nan iterations": "nan",
}
COLUMN_OF = {**_FLOAT_KEYS, **_INT_KEYS}
INT_COLUMNS = frozenset(_INT_KEYS.values())
# column order of fast_fields' values (and of the compiled scanner's key columns)
FAST_COLUMNS = (
    "elapsed_ms",
    "lr",
    "grad_norm",
    "consumed_samples",
    "gbs",
    "loss_scale",
    "skipped",
    "nan",
    "tflops_per_gpu",
)
_FAST_INT = tuple(i for i, c in enumerate(FAST_COLUMNS) if c in INT_COLUMNS)


@dataclass
class MegatronIteration:
    iteration: int
    train_iters: int
    time: datetime | None
    consumed_samples: int | None = None
    elapsed_ms: float | None = None
    lr: float | None = None
    gbs: int | None = None
    loss: float | None = None
    loss_scale: float | None = None
    grad_norm: float | None = None
    skipped: int | None = None
    nan: int | None = None
    tflops_per_gpu: float | None = None
    moe_aux_loss: float | None = None
    losses: dict[str, float] = field(default_factory=dict)
    extras: dict[str, float | str] = field(default_factory=dict)


# ----------------------------------------------------------------------------------------- the head

_ITER_HEAD_RE = re.compile(r"iteration\s+(\d+)\s*/\s*(\d+)\s*\|")
_TS_RE = re.compile(r"\[(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}(?:\.\d{1,6})?)\]")


def iteration_head(text: str) -> tuple[int, int, str | None, int] | None:
    """Cheap first look at an iteration line: (iteration, train_iters, timestamp text or None, offset of
    the `key: value |` fields)."""
    p = text.find("iteration")
    while p >= 0:
        m = _ITER_HEAD_RE.match(text, p)
        if m:
            t = _TS_RE.search(text, 0, p)
            return int(m.group(1)), int(m.group(2)), t.group(1) if t else None, m.end()
        p = text.find("iteration", p + 9)
    return None


# ----------------------------------------------------------------------------------------- generic fields


def _as_int(col: str, x: float | None) -> int | None:
    """A count as its column stores it: int(x), or None beyond the store's type (a garbled "global batch
    size: 1e20" is no value at all)."""
    if x is None or not math.isfinite(x):
        return None
    return storable_int(int(x), ITER_TYPES[col])


def parse_fields(rest: str) -> tuple[dict, dict, dict]:
    """The `key: value |` fields after `iteration N/ M |`, generically: (columns, losses, extras).
    Known keys become columns (None when the value does not parse: a garbled line); keys ending in
    "loss" are losses; anything else is kept in extras."""
    cols: dict = {}
    losses: dict = {}
    extras: dict = {}
    for seg in rest.split("|"):
        key, sep, val = seg.rpartition(":")
        if not sep:
            key, val = _colonless(seg)  # 2019 Megatron-LM: "lm loss 7.70E-02", "loss scale 32768.0"
            if key is None:
                continue
        key = key.strip()
        if not key:
            continue
        try:
            x = float(val)  # float() ignores surrounding spaces
        except ValueError:
            x = None
        col = COLUMN_OF.get(key)
        if col is not None:
            if col in INT_COLUMNS:
                x = _as_int(col, x)
            cols[col] = x
        elif key.endswith("loss") or " loss" in key:
            if x is not None:
                losses[key] = x
        else:
            extras[key] = x if x is not None else val.strip()
    return cols, losses, extras


def _colonless(seg: str) -> tuple[str | None, str]:
    """(key, value) of a `key number` segment without a colon (Megatron-LM's 2019 format), else (None, "")."""
    key, _, val = seg.strip().rpartition(" ")
    try:
        float(val)
    except ValueError:
        return None, ""
    return (key.strip() or None), val


def loss_roles(keys) -> tuple[str | None, str | None]:
    """Which loss keys are (the main loss, the MoE aux loss): "lm loss" upstream and in our trainer; a log
    with one other (non-auxiliary) loss key still gets a loss curve; the load-balancing loss is the aux."""
    keys = list(keys)
    main = "lm loss" if "lm loss" in keys else None
    if main is None:
        cands = [k for k in keys if "load_balancing" not in k and "z_loss" not in k and "mtp" not in k]
        if len(cands) == 1:
            main = cands[0]
    aux = next((k for k in keys if "load_balancing" in k), None)
    return main, aux


def main_losses(losses: dict) -> tuple[float | None, float | None]:
    """(loss, MoE aux loss) values (see loss_roles)."""
    main, aux = loss_roles(losses)
    return (losses[main] if main else None), (losses[aux] if aux else None)


def extra_losses(losses: dict) -> dict:
    """The losses that have no column of their own (what the extras JSON keeps under "losses")."""
    roles = loss_roles(losses)
    return {k: v for k, v in losses.items() if k not in roles}


def parse_iteration(text: str) -> MegatronIteration | None:
    """Parse one Megatron iteration line (prefixes already stripped or not: the match is searched)."""
    m = _ITER_RE.search(text)
    if not m:
        return None
    ts = make_time(*m.group(1, 2, 3, 4, 5, 6, 7)) if m.group(1) else None
    it = MegatronIteration(int(m.group(8)), int(m.group(9)), ts)
    cols, it.losses, it.extras = parse_fields(text[m.end() :])
    for c, v in cols.items():
        setattr(it, c, v)
    it.loss, it.moe_aux_loss = main_losses(it.losses)
    return it


# ----------------------------------------------------------------------------------------- fast path

# One C-level regex pass yields (key, value) pairs with exactly parse_fields' semantics (key = stripped text
# before a segment's last ':', value after it; segments without a key skipped; a repeated key keeps its
# first position and last value, as a dict does). What to do with each key is decided once per distinct
# key sequence (a log repeats one or two shapes) and cached.
_FIELD_RE = re.compile(r"\s*([^|]*[^|\s])\s*:([^|:]*)")


@dataclass(frozen=True)
class _FieldPlan:
    columns: tuple[int, ...]  # index into the value list per FAST_COLUMNS entry (-1: absent -> None)
    loss: int  # index of the main loss, -1 when none
    aux: int  # index of the MoE load-balancing loss, -1 when none
    extras: tuple[int, ...]  # indices of the values that go into the extras JSON, in order
    template: str  # %-template of the extras JSON with one %r per extras value
    rx: re.Pattern | None  # matches a line of exactly this key sequence; its groups are the values


def _make_plan(keys: tuple[str, ...]) -> _FieldPlan:
    cols = [-1] * len(FAST_COLUMNS)
    losses: dict[str, int] = {}
    ex: list[tuple[str, int]] = []
    for i, key in enumerate(keys):
        col = COLUMN_OF.get(key)
        if col is not None:
            cols[FAST_COLUMNS.index(col)] = i
        elif key.endswith("loss") or " loss" in key:
            losses[key] = i
        else:
            ex.append((key, i))
    main_key, aux_key = loss_roles(losses)
    loss = losses[main_key] if main_key else -1
    aux = losses[aux_key] if aux_key else -1
    # json.dumps(extras) with extras["losses"] (those without a column) last, as the generic path writes it
    parts = [json.dumps(k).replace("%", "%%") + ": %r" for k, _ in ex]
    idx = [i for _, i in ex]
    rest = {k: i for k, i in losses.items() if k not in (main_key, aux_key)}
    if rest:
        parts.append('"losses": {' + ", ".join(json.dumps(k).replace("%", "%%") + ": %r" for k in rest) + "}")
        idx += list(rest.values())
    # The literal keys make this match backtrack-free (the generic regex costs ~20 us a line). A segment
    # is exactly `key: value` with no other ':' after the key, as _FIELD_RE would split it.
    rx = None
    if len(set(keys)) == len(keys) and all("|" not in k for k in keys):
        segs = [r"\s*" + re.escape(k) + r"\s*:([^|:]*)" for k in keys]
        rx = re.compile(r"\|".join(segs) + r"(?:\|\s*)?\Z")
    return _FieldPlan(tuple(cols), loss, aux, tuple(idx), "{" + ", ".join(parts) + "}", rx)


_PLANS: dict[tuple[str, ...], _FieldPlan] = {}
_last_plan: list[_FieldPlan | None] = [None]
_isfinite = math.isfinite


def _plan_and_values(rest: str) -> tuple[_FieldPlan | None, tuple | object]:
    """The plan for this line's key sequence and the value texts in its order (the last line's plan is
    tried first: the usual case)."""
    plan = _last_plan[0]
    m = plan.rx.match(rest) if plan is not None and plan.rx is not None else None
    if m is not None:
        return plan, m.groups()
    d = dict(_FIELD_RE.findall(rest))
    if sum(1 for seg in rest.split("|") if seg.strip()) != len(d):
        return None, ()  # a segment that is not `key: value` (2019's `lm loss 7.7E-02`): parse_fields decides
    keys = tuple(d)
    plan = _PLANS.get(keys)
    if plan is None:
        if len(_PLANS) > 4096:  # a log with ever-changing keys: do not grow without bound
            _PLANS.clear()
        plan = _PLANS[keys] = _make_plan(keys)
    _last_plan[0] = plan
    return plan, d.values()


def fast_fields(
    rest: str, as_text: bool = False
) -> tuple[list, float | str | None, float | str | None, str] | None:
    """parse_fields + main_losses + json.dumps(extras) for the common case where every value is a number:
    (FAST_COLUMNS values, loss, aux loss, extras JSON). None when some value is not a finite number:
    the caller then takes the generic path (same result, slower).
    as_text: the float columns and losses are given as the number text of the line (surrounding spaces
    included) when the line is plain printable ASCII without '_' (there Python's float() and a CSV
    reader's DOUBLE agree): staging it skips float repr, the costliest step of writing a row."""
    plan, raw = _plan_and_values(rest)
    if plan is None:
        return None
    try:
        vals = [*map(float, raw)]
    except ValueError:
        return None
    if not all(map(_isfinite, vals)):
        return None  # nan/inf: the generic path knows how ints and the JSON treat them
    vals.append(None)  # index -1: an absent column
    ex = plan.extras
    js = plan.template % tuple([vals[i] for i in ex]) if ex else "{}"
    if as_text and rest.isascii() and rest.isprintable() and "_" not in rest:
        txt = [*raw, None]
        row = [txt[i] for i in plan.columns]
        for j in _FAST_INT:
            if row[j] is not None:
                row[j] = _as_int(FAST_COLUMNS[j], vals[plan.columns[j]])
        return row, txt[plan.loss], txt[plan.aux], js
    row = [vals[i] for i in plan.columns]
    for j in _FAST_INT:
        if row[j] is not None:
            row[j] = _as_int(FAST_COLUMNS[j], row[j])
    return row, vals[plan.loss], vals[plan.aux], js

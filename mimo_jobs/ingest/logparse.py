"""Pure parsing of training/scheduler log text: no I/O, no database.

What it understands (facts in shared/notes/anchors-peers.md §3):
- Megatron iteration lines, parsed generically as `key: value |` pairs after ` iteration N/ M |`, so upstream
  Megatron-LM logs (dynamic loss keys, MoE keys, fields absent on some ranks, timestamps with or without
  microseconds) and our trainer's lines go through the same code.
- Line origins: srun --label `N: ` prefixes, torchrun --tee `[default3]:` (local rank) and torch's own
  `[rank3]:` (global rank) prefixes, nested in any order, and per-rank torchrun log paths
  logs/job-<job>/node-<n>/<rdzv>/attempt_<k>/<local_rank>/{stdout,stderr}.log.
- Events: Python tracebacks (exception type + message), NCCL/gloo watchdog timeouts, CUDA/host OOM,
  SLURM `DUE TO TIME LIMIT`/preemption/requeue/node failure, checkpoints saved/loaded, torchrun's
  "Root Cause" summary, segfaults, srun task exits.

Ingest finds candidate lines with fast substring search (`TRIGGERS`) and hands each to these functions.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from datetime import datetime

# ----------------------------------------------------------------------------------------- prefixes


@dataclass(frozen=True)
class Origin:
    """Who wrote a line, as far as its prefixes tell. `rank` is global; `task` is the srun task id."""

    task: int | None = None  # srun --label N (a node index when srun launches one torchrun per node)
    local_rank: int | None = None  # torchrun [defaultK]:
    rank: int | None = None  # torch's own [rankK]:

    def global_rank(self, gpus_per_node: int | None = None, node: int | None = None) -> int | None:
        """Global rank: [rankK] wins; else node*gpn + local rank (node from the label or the file path)."""
        if self.rank is not None:
            return self.rank
        n = self.task if self.task is not None else node
        if self.local_rank is not None:
            if n is None:
                return self.local_rank if gpus_per_node in (None, 1) or node is None else None
            if gpus_per_node is None:
                return None
            return n * gpus_per_node + self.local_rank
        if self.task is not None and gpus_per_node == 1:
            return self.task
        return None


# No `^`: Pattern.match(line, pos) anchors at pos, and `^` would only match at 0.
_PREFIX_RE = re.compile(
    r"[ \t]*(\d{1,6}): |\[default(\d{1,4})\]:|\[rank(\d{1,6})\]: ?"
)  # torch writes "[rank3]: text"


def split_origin(line: str) -> tuple[Origin, str]:
    """Strip any chain of srun/torchrun prefixes ("0: [default3]:[rank3]: text") and say who wrote it."""
    task = local = rank = None
    pos = 0
    for _ in range(4):  # prefixes never nest deeper; bound the loop against odd input
        m = _PREFIX_RE.match(line, pos)
        if not m:
            break
        if m.group(1) is not None:
            task = int(m.group(1))
        elif m.group(2) is not None:
            local = int(m.group(2))
        else:
            rank = int(m.group(3))
        pos = m.end()
    return Origin(task, local, rank), line[pos:]


_RANK_PATH_RE = re.compile(
    r"(?:^|/)job-(?P<job>[^/]+)/node-(?P<node>\d+)/(?:[^/]+/)?attempt_(?P<attempt>\d+)/(?P<local>\d+)/"
    r"(?P<stream>stdout|stderr|error)\.(?:log|json)$"
)
_JOB_FILE_RE = re.compile(r"(?:^|/)(?:slurm|local)-(?P<job>[A-Za-z0-9_.\-]+?)(?:\.\d+)?\.(?:out|err|log)$")
_JOB_DIR_RE = re.compile(r"(?:^|/)job-(?P<job>[^/]+)/")


@dataclass(frozen=True)
class PathInfo:
    job_id: str | None = None
    node: int | None = None
    attempt: int | None = None  # torchrun restart (attempt_<k>)
    local_rank: int | None = None
    stream: str | None = None


def path_info(path: str) -> PathInfo:
    """What a log file's path says: its job, and for torchrun per-rank files the node/attempt/local rank."""
    p = path.replace("\\", "/")
    m = _RANK_PATH_RE.search(p)
    if m:
        return PathInfo(m["job"], int(m["node"]), int(m["attempt"]), int(m["local"]), m["stream"])
    m = _JOB_FILE_RE.search(p)
    if m:
        return PathInfo(m["job"])
    m = _JOB_DIR_RE.search(p)
    if m:
        return PathInfo(m["job"])
    return PathInfo()


# ----------------------------------------------------------------------------------------- timestamps

_ISO_RE = re.compile(r"(\d{4})-(\d{2})-(\d{2})[ T_](\d{2}):(\d{2}):(\d{2})(?:[.,](\d{1,6}))?")
_GLOG_RE = re.compile(r"\[[EWIF](\d{2})(\d{2}) (\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,6}))?")


def _dt(y, mo, d, h, mi, s, frac) -> datetime | None:
    try:
        us = int(frac.ljust(6, "0")) if frac else 0
        return datetime(int(y), int(mo), int(d), int(h), int(mi), int(s), us)
    except ValueError:
        return None


def find_time(text: str, year_hint: int | None = None) -> datetime | None:
    """First timestamp in a line: ISO-like (Megatron, SLURM, Python logging) or glog `[E0406 03:04:12.1`
    (NCCL watchdog lines carry no year: `year_hint` supplies it)."""
    m = _ISO_RE.search(text)
    if m:
        return _dt(*m.groups())
    if year_hint:
        m = _GLOG_RE.search(text)
        if m:
            return _dt(year_hint, *m.groups())
    return None


# ----------------------------------------------------------------------------------------- iterations

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


def _num(v: str) -> float | None:
    try:
        return float(v)
    except ValueError:
        return None


_COLUMN_OF = {**_FLOAT_KEYS, **_INT_KEYS}
_INT_COLUMNS = frozenset(_INT_KEYS.values())
# The store's integer types: a count beyond them (a garbled "global batch size: 1e20") is no value at all.
_INT_MAX = {"consumed_samples": 2**63 - 1, "gbs": 2**31 - 1, "skipped": 2**31 - 1, "nan": 2**31 - 1}


def _as_int(col: str, x: float | None) -> int | None:
    if x is None or not math.isfinite(x):
        return None
    v = int(x)
    return v if -_INT_MAX[col] <= v <= _INT_MAX[col] else None


def parse_fields(rest: str) -> tuple[dict, dict, dict]:
    """The `key: value |` fields after `iteration N/ M |`, generically: (columns, losses, extras).
    Known keys become columns (None when the value does not parse: a garbled line); keys ending in
    "loss" are losses; anything else is kept in extras. Hot path of big-log ingest: keep it lean."""
    cols: dict = {}
    losses: dict = {}
    extras: dict = {}
    for seg in rest.split("|"):
        key, sep, val = seg.rpartition(":")
        if not sep:
            continue
        key = key.strip()
        if not key:
            continue
        try:
            x = float(val)  # float() ignores surrounding spaces
        except ValueError:
            x = None
        col = _COLUMN_OF.get(key)
        if col is not None:
            if col in _INT_COLUMNS:
                x = _as_int(col, x)
            cols[col] = x
        elif key.endswith("loss") or " loss" in key:
            if x is not None:
                losses[key] = x
        else:
            extras[key] = x if x is not None else val.strip()
    return cols, losses, extras


# Fast path for big logs: one C-level regex pass yields (key, value) pairs with exactly parse_fields'
# semantics (key = stripped text before a segment's last ':', value after it; segments without a key
# skipped; a repeated key keeps its first position and last value, as a dict does). What to do with each
# key is decided once per distinct key sequence (a log repeats one or two shapes) and cached.
_FIELD_RE = re.compile(r"\s*([^|]*[^|\s])\s*:([^|:]*)")
# column order of FieldPlan.columns
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
_FAST_INT = tuple(i for i, c in enumerate(FAST_COLUMNS) if c in _INT_COLUMNS)


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
        col = _COLUMN_OF.get(key)
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


def fast_fields(
    rest: str, as_text: bool = False
) -> tuple[list, float | str | None, float | str | None, str] | None:
    """parse_fields + main_losses + json.dumps(extras) for the common case where every value is a number:
    (FAST_COLUMNS values, loss, aux loss, extras JSON). None when some value is not a finite number:
    the caller then takes the generic path (same result, slower).
    as_text: the float columns and losses are given as the number text of the line (surrounding spaces
    included) when the line is plain printable ASCII without '_' (there Python's float() and a CSV
    reader's DOUBLE agree): staging it skips float repr, the costliest step of writing a row."""
    plan = _last_plan[0]
    m = plan.rx.match(rest) if plan is not None and plan.rx is not None else None
    if m is not None:  # the same keys as the line before (the usual case)
        raw = m.groups()
    else:
        d = dict(_FIELD_RE.findall(rest))
        keys = tuple(d)
        plan = _PLANS.get(keys)
        if plan is None:
            if len(_PLANS) > 4096:  # a log with ever-changing keys: do not grow without bound
                _PLANS.clear()
            plan = _PLANS[keys] = _make_plan(keys)
        _last_plan[0] = plan
        raw = d.values()
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
    ts = _dt(*m.group(1, 2, 3, 4, 5, 6, 7)) if m.group(1) else None
    it = MegatronIteration(int(m.group(8)), int(m.group(9)), ts)
    cols, it.losses, it.extras = parse_fields(text[m.end() :])
    for c, v in cols.items():
        setattr(it, c, v)
    it.loss, it.moe_aux_loss = main_losses(it.losses)
    return it


# ----------------------------------------------------------------------------------------- events

ROOT_KINDS = ("traceback", "oom", "segfault", "node_fail")  # a rank's own failure
SUMMARY_KINDS = ("child_failed", "task_exit")  # launcher summaries of a failure seen elsewhere
VICTIM_KINDS = ("nccl_timeout", "gloo_timeout", "peer_lost")  # waited on a peer that failed or hung
SCHEDULER_KINDS = ("time_limit", "preemption", "requeue", "cancelled")
INFO_KINDS = ("checkpoint_saved", "checkpoint_loaded", "end")

# Substrings that make a line worth classifying (ingest searches whole chunks for them, so keep them
# few and specific). Order does not matter.
TRIGGERS = (
    "Traceback (most recent call last)",
    "Watchdog caught collective",
    "gloo/transport",
    "out of memory",
    "oom-kill",
    "OutOfMemoryError",
    "CANCELLED AT",
    "Node failure",
    "NODE_FAIL",
    "equeue",  # requeue / Requeued
    "REQUEUE",
    "reempt",  # preempted / Preemption
    "PREEMPT",
    "saved checkpoint",
    "loaded checkpoint",
    "checkpoint saved",
    "checkpoint loaded",
    "from checkpoint",
    "Root Cause (first observed failure)",
    "Segmentation fault",
    "Exited with exit code",
)
# A traceback's last line names the exception; ingest only sees candidate lines, so these make the
# exception lines of tracebacks candidates too (a custom exception without these words is reported as a
# traceback without its exception line).
EXCEPTION_TRIGGERS = ("Error", "Exception", "Interrupt", "SystemExit", "StopIteration")
ITERATION_TRIGGER = "iteration"
ALL_TRIGGERS = (ITERATION_TRIGGER, *TRIGGERS, *EXCEPTION_TRIGGERS)

_ITER_HEAD_RE = re.compile(r"iteration\s+(\d+)\s*/\s*(\d+)\s*\|")
_TS_RE = re.compile(r"\[(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}(?:\.\d{1,6})?)\]")


def iteration_head(text: str) -> tuple[int, int, str | None, int] | None:
    """Cheap first look at an iteration line: (iteration, train_iters, timestamp text or None, offset of
    the `key: value |` fields). Ingest stages the fields and parses them in bulk in SQL."""
    p = text.find("iteration")
    while p >= 0:
        m = _ITER_HEAD_RE.match(text, p)
        if m:
            t = _TS_RE.search(text, 0, p)
            return int(m.group(1)), int(m.group(2)), t.group(1) if t else None, m.end()
        p = text.find("iteration", p + 9)
    return None


_VICTIM_MSG_RE = re.compile(
    r"Timed out waiting|Connection closed by peer|Connection reset by peer|Watchdog caught|"
    r"collective operation timeout|DistNetworkError|NCCL communicator was aborted|"
    r"remote process exited|Broken pipe|failed to recv|ncclRemoteError",
    re.I,
)
_SLURM_CANCEL_RE = re.compile(
    r"\*\*\* (?:JOB|STEP) ([\w.\[\]+-]+) ON (\S+) CANCELLED AT (\S+)(?: DUE TO ([A-Z ]+?))?"
    r"(?:,.*)? \*\*\*"
)
_CKPT_ITER_RE = re.compile(r"iteration\s+(\d+)|iter_0*(\d+)")


@dataclass
class Event:
    kind: str
    message: str
    time: datetime | None = None


def is_victim_message(msg: str) -> bool:
    """A failure that only says a peer went away or a collective timed out (a consequence, not a cause)."""
    return bool(_VICTIM_MSG_RE.search(msg))


def classify_line(text: str, year_hint: int | None = None) -> list[Event]:
    """Events in one line (prefixes stripped). Tracebacks are handled by `TracebackTracker`."""
    out: list[Event] = []
    t = None

    def add(kind: str, msg: str) -> None:
        nonlocal t
        if t is None:
            t = find_time(text, year_hint)
        out.append(Event(kind, msg.strip()[:500], t))

    if "Watchdog caught collective" in text:
        add("nccl_timeout", text)
    if "gloo/transport" in text:
        add("gloo_timeout" if "Timed out" in text else "peer_lost", text)
    if ("out of memory" in text or "OutOfMemoryError" in text) and "CUDA" in text:
        add("oom", text)
    elif "oom-kill" in text or "Out Of Memory" in text or "OutOfMemoryError" in text:
        add("oom", text)
    if "CANCELLED AT" in text:
        m = _SLURM_CANCEL_RE.search(text)
        reason = (m.group(4) or "") if m else ""
        if m:
            t = find_time(m.group(3)) or t
        if "TIME LIMIT" in reason:
            add("time_limit", text)
        elif "PREEMPT" in reason:
            add("preemption", text)
        elif "NODE FAIL" in reason:
            add("node_fail", text)
        elif "REQUEUE" in reason:
            add("requeue", text)
        else:
            add("cancelled", text)
    elif "DUE TO TIME LIMIT" in text:
        add("time_limit", text)
    if "Node failure" in text or "NODE_FAIL" in text:
        if not any(e.kind == "node_fail" for e in out):
            add("node_fail", text)
    low = text.lower()
    if ("requeued" in low or "requeuing" in low or "job requeue" in low) and not any(
        e.kind == "requeue" for e in out
    ):
        add("requeue", text)
    if ("preempted" in low or "preemption" in low) and not any(e.kind == "preemption" for e in out):
        add("preemption", text)
    if "checkpoint" in text:
        if "saved checkpoint" in low or "checkpoint saved" in low:
            add("checkpoint_saved", text)
        elif "loaded checkpoint" in low or "checkpoint loaded" in low or "resumed from checkpoint" in low:
            add("checkpoint_loaded", text)
    if "Segmentation fault" in text:
        add("segfault", text)
    if "Exited with exit code" in text:
        add("task_exit", text)
    return out


def checkpoint_iteration(msg: str) -> int | None:
    m = _CKPT_ITER_RE.search(msg)
    if not m:
        return None
    return int(m.group(1) or m.group(2))


@dataclass
class _Pending:
    start_line: int
    time: datetime | None
    seen: int = 0


class TracebackTracker:
    """Follows Python tracebacks per writer (interleaved multi-rank output keeps one state per origin).

    feed() gets every line of an origin after its traceback header; it returns the finished event (at the
    exception line: "Type: message") or None. Chained tracebacks ("During handling ...") continue the same
    event and report the last exception, which is the one that ended the process.
    """

    MAX_LINES = 400  # a traceback longer than this is cut off and reported with what we have

    def __init__(self) -> None:
        self.pending: dict[object, _Pending] = {}

    def start(self, key: object, line_no: int, time: datetime | None) -> None:
        if key not in self.pending:
            self.pending[key] = _Pending(line_no, time)

    def active(self, key: object) -> bool:
        return key in self.pending

    def feed(self, key: object, text: str) -> tuple[int, Event] | None:
        p = self.pending.get(key)
        if p is None:
            return None
        p.seen += 1
        s = text.rstrip("\r\n")
        if not s.strip() or s.startswith((" ", "\t")) or s.startswith("Traceback (most recent call last)"):
            if p.seen > self.MAX_LINES:
                del self.pending[key]
                return p.start_line, Event("traceback", "traceback cut off (no exception line)", p.time)
            return None
        if s.startswith(
            ("During handling of the above exception", "The above exception was the direct cause")
        ):
            return None
        if s.startswith("^") or s.lstrip().startswith("~"):
            return None
        del self.pending[key]
        return p.start_line, Event("traceback", s.strip()[:500], p.time)

    def flush(self) -> list[tuple[int, Event]]:
        """Tracebacks still open at end of input (file truncated mid-traceback)."""
        out = [
            (p.start_line, Event("traceback", "traceback truncated (no exception line)", p.time))
            for p in self.pending.values()
        ]
        self.pending.clear()
        return out


# ----------------------------------------------------------------------------------------- torchrun summary

_ROOT_RANK_RE = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*(\d+)\)")
_ROOT_EXIT_RE = re.compile(r"exitcode\s*:\s*(-?\d+)")
_ROOT_TIME_RE = re.compile(r"time\s*:\s*(\d{4}-\d{2}-\d{2}_\d{2}:\d{2}:\d{2})")


def parse_root_cause(lines: list[str]) -> tuple[int | None, Event] | None:
    """torchrun's ChildFailedError summary: the lines after "Root Cause (first observed failure):"."""
    rank = None
    exitcode = None
    t = None
    for s in lines[:12]:
        if rank is None and (m := _ROOT_RANK_RE.search(s)):
            rank = int(m.group(1))
        if exitcode is None and (m := _ROOT_EXIT_RE.search(s)):
            exitcode = int(m.group(1))
        if t is None and (m := _ROOT_TIME_RE.search(s)):
            t = find_time(m.group(1))
    if rank is None:
        return None
    return rank, Event("child_failed", f"torchrun root cause: rank {rank} exitcode {exitcode}", t)


# ----------------------------------------------------------------------------------------- sacct


@dataclass
class SacctRecord:
    job_id: str
    state: str
    exit_code: int | None
    start: datetime | None
    end: datetime | None
    node_list: str | None
    reason: str | None
    restarts: int | None


def parse_sacct(lines: list[str]) -> list[SacctRecord]:
    """`sacct --parsable2` (or --parsable) output with a header row. Job steps (123.batch, 123.0) are
    skipped: the allocation's own row carries the job's state. Unknown columns are ignored."""
    if not lines:
        return []
    header = [h.strip() for h in lines[0].rstrip("\n").rstrip("|").split("|")]
    if "JobID" not in header or "State" not in header:
        raise ValueError(f"not sacct --parsable2 output: header {lines[0].strip()[:80]!r} lacks JobID/State")
    col = {h: i for i, h in enumerate(header)}
    out = []
    for s in lines[1:]:
        f = s.rstrip("\n").split("|")
        if len(f) < len(header):
            continue
        jid = f[col["JobID"]].strip()
        if not jid or "." in jid:
            continue
        state = f[col["State"]].split()[0] if f[col["State"]].strip() else ""  # "CANCELLED by 0" -> CANCELLED

        def get(name: str, f: list[str] = f) -> str | None:
            v = f[col[name]].strip() if name in col else ""
            return v if v and v not in ("Unknown", "None") else None

        ec = get("ExitCode")
        exit_code = int(ec.split(":")[0]) if ec and ec.split(":")[0].lstrip("-").isdigit() else None
        st, en = get("Start"), get("End")
        rs = get("Restarts")
        out.append(
            SacctRecord(
                jid,
                state,
                exit_code,
                find_time(st) if st else None,
                find_time(en) if en else None,
                get("NodeList"),
                get("Reason"),
                int(rs) if rs and rs.isdigit() else None,
            )
        )
    return out


SACCT_EVENT = {
    "TIMEOUT": "time_limit",
    "PREEMPTED": "preemption",
    "NODE_FAIL": "node_fail",
    "OUT_OF_MEMORY": "oom",
    "REQUEUED": "requeue",
}

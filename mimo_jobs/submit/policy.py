"""The jobs table: one row per scheduler job (a submission, a retry or a requeue of a run), its state as the
scheduler reports it, and the retry/requeue policy applied when a job ends.

Pure parts (no I/O): `JobFacts` (what an executor reports), `classify()` (what to do when a job ends) and
`first_error()` (the first meaningful error of a log text). The rest reads and writes the store.

Policy (classify):
- COMPLETED                                   -> done
- exit 75 (REQUEUE_EXIT_CODE), or the trainer's "stopping for requeue" line (not CANCELLED): the trainer
  stopped on a signal or near its deadline after saving a checkpoint -> requeue (up to MAX_REQUEUES; resumes
  from `latest`), also when the limit's TERM came while it was exiting (TIMEOUT exit 75)
- PREEMPTED                                   -> requeue (the run resumes from its checkpoints)
- TIMEOUT                                     -> requeue while checkpoints exist and timeouts < MAX_TIMEOUTS
                                                 (no checkpoint: the next attempt would redo the same work)
- NODE_FAIL, or FAILED with a flaky signature  -> retry while retries < cluster.max_retries
  (NCCL/gloo watchdog timeouts, lost peers, node failure)
- anything else (a traceback, exit code 1, OOM, CANCELLED) -> final: deterministic failures are not retried
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

ACTIVE_STATES = frozenset({"SUBMITTED", "PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED",
                           "RESIZING", "SUSPENDED", "UNKNOWN"})
# Runs whose latest job is in one of these are not submitted again (unless --force).
KEEP_STATES = ACTIVE_STATES | {"COMPLETED"}
MAX_TIMEOUTS = 3  # like submitit's max_num_timeout
# The trainer's requeue contract (trainer/signals.py; repeated here so the CLI imports no trainer module).
REQUEUE_EXIT_CODE = 75
REQUEUE_LOG_LINE = "mimo-jobs trainer: stopping for requeue at iteration"
# Every requeued attempt advances at least one iteration, but a run that keeps stopping is bounded anyway.
MAX_REQUEUES = 20

# Log signatures of failures that another attempt may well not hit (infrastructure, not the program).
FLAKY_PATTERNS = [
    ("nccl_timeout", re.compile(r"Watchdog caught collective operation timeout|NCCL (?:communicator was aborted|"
                                r"error|timeout)|ncclRemoteError|ncclSystemError", re.IGNORECASE)),
    ("gloo_timeout", re.compile(r"gloo/transport.*Timed out|\[gloo\].*Timed out|Gloo connectFullMesh failed", re.IGNORECASE)),
    ("peer_lost", re.compile(r"gloo/transport.*(?:Connection closed by peer|Connection reset by peer)|"
                             r"DistNetworkError|RendezvousConnectionError|RendezvousTimeoutError", re.IGNORECASE)),
    ("node_fail", re.compile(r"DUE TO NODE FAILURE|NODE_FAIL|Node failure on", re.IGNORECASE)),
]
_ERROR_LINE = re.compile(r"^\s*(?:\[?rank\d+\]?:\s*)?([A-Za-z_][\w.]*(?:Error|Exception)|error|Error|ERROR|FATAL|"
                         r"fatal|Killed|Segmentation fault)\b")


def utcnow() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


@dataclass
class JobFacts:
    """A job as its executor reports it. Times are naive UTC."""

    job_id: str
    state: str
    exit_code: int | None = None
    submit_time: datetime | None = None
    start_time: datetime | None = None
    end_time: datetime | None = None
    node_list: str | None = None
    reason: str | None = None  # scheduler's reason (sacct Reason / local runner note)

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES


@dataclass(frozen=True)
class Decision:
    action: str  # done | final | retry | requeue
    reason: str


@dataclass
class History:
    """What earlier jobs of the same run used up (for the limits)."""

    retries: int = 0
    timeouts: int = 0
    preemptions: int = 0


def flaky_signature(text: str) -> str | None:
    for name, rx in FLAKY_PATTERNS:
        if rx.search(text):
            return name
    return None


def classify(state: str, exit_code: int | None, log_text: str, history: History, max_retries: int,
             has_checkpoint: bool) -> Decision:
    """What to do with a job that ended. Pure: every input is given."""
    if state == "COMPLETED":
        return Decision("done", "completed")
    if state != "CANCELLED" and (exit_code == REQUEUE_EXIT_CODE or REQUEUE_LOG_LINE in log_text):
        # The trainer checkpointed and asked for another attempt (its marker was handled by the launch script).
        if not has_checkpoint:
            return Decision("final", f"exit {exit_code}: the trainer asked for a requeue but no complete "
                                     "checkpoint exists: not requeued")
        if history.preemptions >= MAX_REQUEUES:
            return Decision("final", f"requeued {history.preemptions} times already: not requeued again")
        return Decision("requeue", "trainer checkpointed and asked for a requeue (signal or time limit): "
                                   "requeued, resumes from checkpoint")
    if state == "PREEMPTED":
        return Decision("requeue", "preempted: requeued" + (" (resumes from checkpoint)" if has_checkpoint else ""))
    if state == "TIMEOUT":
        if not has_checkpoint:
            return Decision("final", "time limit reached with no checkpoint: not requeued (it would redo the "
                                     "same work); raise time_limit or set trainer.save_interval")
        if history.timeouts >= MAX_TIMEOUTS:
            return Decision("final", f"time limit reached {history.timeouts + 1} times: not requeued again")
        return Decision("requeue", "time limit reached: requeued, resumes from checkpoint")
    if state == "CANCELLED":
        return Decision("final", "cancelled")
    sig = "node_fail" if state == "NODE_FAIL" else flaky_signature(log_text)
    if sig is not None:
        if history.retries < max_retries:
            return Decision("retry", f"flaky failure ({sig}): retry {history.retries + 1}/{max_retries}")
        return Decision("final", f"flaky failure ({sig}) after {history.retries} retries (cluster.max_retries="
                                 f"{max_retries})")
    return Decision("final", "deterministic failure: not retried")


def first_error(text: str) -> str | None:
    """The first line that says what went wrong: a traceback's exception line, else an error-looking line.
    Uses the ingest engineer's logparse when present (same rules as the events table), else a small scan."""
    lines = text.splitlines()
    try:
        from mimo_jobs.ingest import logparse
    except ImportError:  # pragma: no cover - logparse is part of the package once ingest lands
        logparse = None
    if logparse is not None and hasattr(logparse, "TracebackTracker"):
        tracker = logparse.TracebackTracker()
        for i, raw in enumerate(lines):
            origin, s = logparse.split_origin(raw)
            key = (origin.task, origin.local_rank, origin.rank)
            if s.startswith("Traceback (most recent call last)"):
                tracker.start(key, i, None)
                continue
            done = tracker.feed(key, s) if tracker.active(key) else None
            if done is not None and not logparse.is_victim_message(done[1].message):
                return done[1].message
            for ev in logparse.classify_line(s):
                if ev.kind in ("oom", "segfault", "time_limit", "node_fail", "preemption"):
                    return ev.message
    for s in lines:  # no logparse verdict: the first error-looking line
        if _ERROR_LINE.match(s) and "Traceback" not in s:
            return s.strip()[:500]
    return None


# ------------------------------------------------------------------------------------------------ store

# Additive columns (store.py owns the base DDL): what policy was applied to an ended job, and which job
# continued the run.
_EXTRA_COLUMNS = [("action", "VARCHAR"), ("next_job_id", "VARCHAR"), ("first_error", "VARCHAR"),
                  ("log_path", "VARCHAR")]


def ensure_schema(con) -> None:
    have = {r[0] for r in con.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_name = 'jobs'").fetchall()}
    for name, typ in _EXTRA_COLUMNS:
        if name not in have:
            con.execute(f"ALTER TABLE jobs ADD COLUMN {name} {typ}")


@dataclass
class JobRow:
    run_id: str
    job_id: str
    executor: str
    attempt: int
    state: str
    reason: str | None
    exit_code: int | None
    submit_time: datetime | None
    start_time: datetime | None
    end_time: datetime | None
    node_list: str | None
    script_sha256: str | None
    action: str | None = None
    next_job_id: str | None = None
    first_error: str | None = None
    log_path: str | None = None
    extra: dict = field(default_factory=dict)

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES

    def elapsed_s(self, now: datetime | None = None) -> float | None:
        if self.start_time is None:
            return None
        end = self.end_time or (now or utcnow())
        return max(0.0, (end - self.start_time).total_seconds())


_COLS = ("run_id, job_id, executor, attempt, state, reason, exit_code, submit_time, start_time, end_time, "
         "node_list, script_sha256, action, next_job_id, first_error, log_path")


def insert_job(con, run_id: str, job_id: str, executor: str, attempt: int, script_sha256: str | None,
               log_path: str | None, submit_time: datetime | None = None, state: str = "SUBMITTED") -> None:
    con.execute(
        f"INSERT INTO jobs ({_COLS}, updated_at) VALUES (?, ?, ?, ?, ?, NULL, NULL, ?, NULL, NULL, NULL, ?, "
        "NULL, NULL, NULL, ?, ?)",
        [run_id, job_id, executor, attempt, state, submit_time or utcnow(), script_sha256, log_path, utcnow()])


def update_facts(con, run_id: str, f: JobFacts) -> None:
    con.execute(
        """UPDATE jobs SET state = ?, exit_code = coalesce(?, exit_code), submit_time = coalesce(?, submit_time),
             start_time = coalesce(?, start_time), end_time = coalesce(?, end_time),
             node_list = coalesce(?, node_list), reason = coalesce(?, reason), updated_at = ?
           WHERE run_id = ? AND job_id = ?""",
        [f.state, f.exit_code, f.submit_time, f.start_time, f.end_time, f.node_list, f.reason, utcnow(),
         run_id, f.job_id])


def set_outcome(con, run_id: str, job_id: str, action: str, reason: str, first_err: str | None,
                next_job_id: str | None = None) -> None:
    con.execute("UPDATE jobs SET action = ?, reason = ?, first_error = ?, next_job_id = ?, updated_at = ? "
                "WHERE run_id = ? AND job_id = ?",
                [action, reason, first_err, next_job_id, utcnow(), run_id, job_id])


def _rows(con, where: str, params: list) -> list[JobRow]:
    cur = con.execute(f"SELECT {_COLS} FROM jobs WHERE {where} ORDER BY run_id, attempt, submit_time", params)
    return [JobRow(*r) for r in cur.fetchall()]


def jobs_of_run(con, run_id: str) -> list[JobRow]:
    return _rows(con, "run_id = ?", [run_id])


def latest_jobs(con, run_ids: list[str]) -> dict[str, JobRow]:
    """The newest job of each run (highest attempt)."""
    if not run_ids:
        return {}
    out: dict[str, JobRow] = {}
    for r in _rows(con, "run_id IN (SELECT unnest(?))", [run_ids]):
        out[r.run_id] = r  # ordered by attempt: the last one wins
    return out


def active_jobs(con) -> list[JobRow]:
    states = sorted(ACTIVE_STATES)
    return _rows(con, "state IN (SELECT unnest(?))", [states])


def unsettled_jobs(con) -> list[JobRow]:
    """Ended jobs the policy has not looked at yet (action IS NULL), e.g. after a crash mid-poll."""
    states = sorted(ACTIVE_STATES)
    return _rows(con, "action IS NULL AND state NOT IN (SELECT unnest(?))", [states])


def history_of(rows: list[JobRow]) -> History:
    h = History()
    for r in rows:
        if r.action == "retry":
            h.retries += 1
        elif r.action == "requeue" and r.state == "TIMEOUT" and r.exit_code != REQUEUE_EXIT_CODE:
            h.timeouts += 1
        elif r.action == "requeue":
            h.preemptions += 1
    return h


def read_tail(path: str | Path | None, max_bytes: int = 256_000) -> str:
    """The end of a log (errors are at the end; logs can be large)."""
    if not path:
        return ""
    p = Path(path)
    try:
        with p.open("rb") as fh:
            size = fh.seek(0, 2)
            fh.seek(max(0, size - max_bytes))
            return fh.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


# ------------------------------------------------------------------------------------------------ status

@dataclass
class RunStatus:
    study: str
    run: str
    run_id: str
    nodes: int
    run_dir: str
    train_iters: int | None
    job: JobRow | None
    iteration: int | None = None
    loss: float | None = None
    iter_source: str | None = None  # store | metrics.jsonl
    checkpoint: int | None = None  # iteration of the run's latest complete checkpoint (what a requeue resumes)


def last_iteration_from_metrics(path: Path) -> tuple[int, float] | None:
    """The newest iteration record in metrics.jsonl (for runs not ingested yet): read the tail only."""
    import json

    text = read_tail(path, 64_000)
    for line in reversed(text.splitlines()):
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if isinstance(d, dict) and d.get("kind", "iteration") == "iteration" and "iteration" in d:
            return int(d["iteration"]), float(d["loss"]) if d.get("loss") is not None else float("nan")
    return None


def last_checkpoint_iteration(run_dir: Path, spec: dict) -> int | None:
    """The iteration of the run's `latest` complete checkpoint (manifest only; no torch is imported)."""
    from mimo_jobs.trainer.checkpoint import latest_checkpoint

    d = Path((spec.get("trainer") or {}).get("checkpoint_dir") or run_dir / "checkpoints")
    info = latest_checkpoint(d if d.is_absolute() else run_dir / d)
    return None if info is None else info.iteration


def run_statuses(con, study: str | None = None) -> list[RunStatus]:
    import json

    q = "SELECT study, name, run_id, nodes, run_dir, spec_json FROM runs"
    rows = con.execute(q + (" WHERE study = ?" if study else "") + " ORDER BY study, idx, name",
                       [study] if study else []).fetchall()
    latest = latest_jobs(con, [r[2] for r in rows])
    last = {}
    if rows:
        cols = {c[0] for c in con.execute("DESCRIBE iterations").fetchall()}
        live = " AND NOT coalesce(superseded, false)" if "superseded" in cols else ""
        for rid, it, loss in con.execute(
                f"""SELECT run_id, iteration, loss FROM iterations WHERE run_id IN (SELECT unnest(?)){live}
                    QUALIFY row_number() OVER (PARTITION BY run_id ORDER BY iteration DESC) = 1""",
                [[r[2] for r in rows]]).fetchall():
            last[rid] = (it, loss)
    out = []
    for st, name, rid, nodes, run_dir, spec in rows:
        spec = json.loads(spec) if isinstance(spec, str) else (spec or {})
        rs = RunStatus(st, name, rid, nodes, run_dir, (spec.get("trainer") or {}).get("train_iters"),
                       latest.get(rid))
        if run_dir:
            rs.checkpoint = last_checkpoint_iteration(Path(run_dir), spec)
        if rid in last:
            rs.iteration, rs.loss, rs.iter_source = last[rid][0], last[rid][1], "store"
        elif run_dir:
            m = last_iteration_from_metrics(Path(run_dir) / "metrics.jsonl")
            if m:
                rs.iteration, rs.loss, rs.iter_source = m[0], m[1], "metrics.jsonl"
        out.append(rs)
    return out

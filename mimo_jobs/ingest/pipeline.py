"""Ingest: stream run dirs and log files into the store (iterations, events, jobs from sacct).

- Files are read a block of complete lines at a time, never whole (readers.py); only candidate lines
  (logparse.ALL_TRIGGERS) are looked at, and with the compiled scanner iteration lines never reach Python.
  This module decides what each line means (_LogScanner: events, tracebacks, iterations); staging.py
  collects the rows and merges them into the store.
- Bad input is counted, not fatal: invalid UTF-8 (lines decoded with replacement and counted), a truncated
  last line (counted, left for the next ingest in case the file is still growing), malformed JSON lines,
  interleaved/garbled iteration lines.
- Idempotent: `ingested_files` keeps size, mtime, the byte offset consumed and a hash of the file's head.
  Unchanged files are skipped; grown files resume at the offset; rewritten files are re-read. Rows are
  keyed (iterations: run/job/iteration, kept unique by staging.merge; events: file/line/kind) so
  re-reading never duplicates.
- Each file commits in one transaction (rows + its ingested_files row); runs of small files (per-rank
  logs) share one, GROUP_FILES at a time, and a group with a failing file is redone file by file, so the
  failure still costs only its own file. DuckDB lets one process write a store at a time; store.connect
  waits for the lock, so two ingests at once serialize.
- Attempts stitch: within a job a later attempt replaces an iteration it re-ran; across jobs of one run
  the older rows are marked `superseded`, and the report reads only the rest.
"""

from __future__ import annotations

from mimo_jobs.errors import MimoJobsError

import hashlib
import json
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Callable, Iterable

from mimo_jobs.store import catalog
from . import logparse
from . import readers
from .readers import FileState, ScanError
from mimo_jobs.contract import PHASES
from mimo_jobs.plan.rundir import RunDir
from .staging import Stage

HEAD = 4096
LOG_SUFFIXES = (".out", ".err", ".log", ".txt")


class IngestError(MimoJobsError, ValueError):
    """Bad ingest input (missing path, unreadable run.yaml): raised before anything is written."""


@dataclass
class IngestStats:
    files: int = 0
    lines: int = 0
    iterations: int = 0
    events: int = 0
    bad_lines: int = 0
    undecodable: int = 0
    skipped_unchanged: int = 0
    truncated_files: int = 0
    runs_registered: int = 0
    problems: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        from dataclasses import asdict

        return asdict(self)


@dataclass(frozen=True)
class LogRunInfo:
    """What the user says about logs that come without a run.yaml (upstream Megatron-LM output)."""

    study: str = "logs"
    name: str | None = None
    nodes: int | None = None
    gpus_per_node: int | None = None
    seq_length: int | None = None


@dataclass
class _RunCtx:
    run_id: str
    gpus_per_node: int | None
    has_metrics: bool  # metrics.jsonl carries the iterations: log lines then only give events


@dataclass
class _Target:
    path: Path
    kind: str  # metrics | log | sacct
    run_dir: Path | None
    src: str = ""  # the resolved path (the file's key in the store), set by discover: resolving costs lstats


# ----------------------------------------------------------------------------------------- discovery


def _run_dir_of(path: Path) -> Path | None:
    for d in [path if path.is_dir() else path.parent, *path.resolve().parents][:10]:
        if (d / "run.yaml").is_file():
            return d
    return None


def _kind_of(path: Path) -> str | None:
    n = path.name
    if n.endswith(".jsonl"):
        return "metrics"
    if "sacct" in n:
        return "sacct"
    if n.endswith(LOG_SUFFIXES):
        return "log"
    return None


def _run_dir_targets(rd: Path) -> list[_Target]:
    out = []
    m = RunDir(rd).metrics
    if m.is_file():
        out.append(_Target(m, "metrics", rd))
    logs = RunDir(rd).logs
    if logs.is_dir():
        for p in sorted(logs.rglob("*")):
            k = _kind_of(p) if p.is_file() else None
            if k:
                out.append(_Target(p, k, rd))
    return out


def discover(paths: Iterable[Path]) -> list[_Target]:
    """Files to read: run dirs (run.yaml inside), trees of run dirs, or single log/jsonl/sacct files."""
    targets: list[_Target] = []
    missing = [str(p) for p in paths if not Path(p).exists()]
    if missing:
        raise IngestError(f"no such file or directory: {', '.join(missing)}")
    for p in map(Path, paths):
        if p.is_dir():
            if (p / "run.yaml").is_file():
                targets += _run_dir_targets(p)
                continue
            run_dirs = sorted({y.parent for y in p.rglob("run.yaml")})
            if run_dirs:
                for rd in run_dirs:
                    targets += _run_dir_targets(rd)
            else:
                for f in sorted(p.rglob("*")):
                    k = _kind_of(f) if f.is_file() else None
                    if k:
                        targets.append(_Target(f, k, None))
        else:
            targets.append(_Target(p, _kind_of(p) or "log", _run_dir_of(p)))
    seen: set[str] = set()
    uniq = []
    for t in targets:
        t.src = str(t.path.resolve())
        if t.src not in seen:
            seen.add(t.src)
            uniq.append(t)
    return uniq


# ----------------------------------------------------------------------------------------- run registration


def _register_runs(con, targets: list[_Target], log_run: LogRunInfo | None, stats: IngestStats) -> dict:
    """Run dirs first (all run.yaml files parsed before anything is written), then bare logs."""
    from mimo_jobs.plan.runspec import load_run_yaml

    ctx: dict[Path | str, _RunCtx] = {}
    specs = {}
    for rd in sorted({t.run_dir for t in targets if t.run_dir is not None}):
        try:
            specs[rd] = load_run_yaml(rd / "run.yaml")
        except Exception as e:  # noqa: BLE001 - any parse/validation failure names the file
            raise IngestError(f"{rd / 'run.yaml'}: cannot read run description: {e}") from None
    for rd, (spec, doc) in specs.items():
        known = con.execute("SELECT 1 FROM runs WHERE run_id = ?", [spec.run_id]).fetchone()
        if not known:
            catalog.ensure_study(con, spec.study, description="(recorded by ingest from run.yaml)")
            catalog.record_run(con, spec, str(rd.resolve()), provenance=doc.get("provenance") or {})
            stats.runs_registered += 1
        ctx[rd] = _RunCtx(spec.run_id, spec.layout.gpus_per_node, RunDir(rd).metrics.is_file())
    info = log_run or LogRunInfo()
    for t in targets:
        if t.run_dir is None:
            key = t.src
            # One run per file unless the user names the run (then all given files are its attempts).
            ident = f"{info.study}/{info.name}" if info.name else key
            rid = "log-" + hashlib.sha1(ident.encode()).hexdigest()[:10]
            name = info.name or t.path.stem
            known = con.execute("SELECT 1 FROM runs WHERE run_id = ?", [rid]).fetchone()
            catalog.ensure_study(con, info.study, description="(logs ingested without a run.yaml)")
            catalog.record_log_run(
                con,
                rid,
                info.study,
                name,
                str(Path(t.src).parent),
                nodes=info.nodes,
                gpus_per_node=info.gpus_per_node,
                seq_length=info.seq_length,
            )
            if not known:
                stats.runs_registered += 1
            ctx[key] = _RunCtx(rid, info.gpus_per_node, False)
    return ctx


def _float(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _ts(t: datetime | None) -> str | None:
    return t.isoformat(sep=" ") if t else None


def _parse_iso(s) -> datetime | None:
    if not s or not isinstance(s, str):
        return None
    try:
        t = datetime.fromisoformat(s.replace("Z", "+00:00"))
    except ValueError:
        return logparse.find_time(s)
    if t.tzinfo is not None:  # the store keeps naive UTC
        from datetime import timezone

        t = t.astimezone(timezone.utc).replace(tzinfo=None)
    return t


def _metrics_rows(text: str, first: int, st: FileState, ctx: _RunCtx, stage: Stage, src: str) -> None:
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
                it = int(r["iteration"])
                phases = r.get("phases_ms") or {}
                extras = r.get("extras") or {}
                job = str(r.get("job_id") or "unknown")
                t = _parse_iso(r.get("time"))
                stage.iteration(
                    [
                        ctx.run_id,
                        job,
                        it,
                        _ts(t),
                        r.get("elapsed_ms"),
                        r.get("loss"),
                        r.get("lr"),
                        r.get("grad_norm"),
                        r.get("consumed_samples"),
                        r.get("gbs"),
                        r.get("loss_scale"),
                        r.get("skipped"),
                        r.get("nan"),
                        r.get("samples_per_s"),
                        r.get("tokens_per_s"),
                        r.get("tokens_per_s_per_gpu"),
                        r.get("tflops_per_gpu"),
                        r.get("moe_aux_loss"),
                        json.dumps(phases),
                        json.dumps(extras),
                        "jsonl",
                        int(r.get("attempt") or 0),
                        r.get("train_iters"),
                        src,
                        *[_float(phases.get(p)) for p in PHASES],
                    ]
                )
                st.last_time = _ts(t) or st.last_time
            elif kind in ("start", "end"):
                msg = {k: v for k, v in r.items() if k not in ("kind", "run_id", "job_id", "time")}
                stage.event(
                    [
                        ctx.run_id,
                        str(r.get("job_id") or "unknown"),
                        None,
                        None,
                        _ts(_parse_iso(r.get("time"))),
                        kind,
                        json.dumps(msg, default=str)[:2000],
                        src,
                        line_no,
                    ]
                )
        except (ValueError, KeyError, TypeError):
            st.bad += 1


class _LogScanner:
    """Turns candidate lines (from grep, or from the pure-Python scan) into staged iterations and events.
    Only lines containing a trigger (logparse.ALL_TRIGGERS) ever reach Python."""

    def __init__(
        self,
        st: FileState,
        ctx: _RunCtx,
        job: str,
        pinfo: logparse.PathInfo,
        stage: Stage,
        src: str,
        want_iters: bool,
    ) -> None:
        self.st, self.ctx, self.job, self.pinfo, self.stage, self.src = st, ctx, job, pinfo, stage, src
        self.want_iters = want_iters
        self.tracker = logparse.TracebackTracker()
        self.base_attempt = pinfo.attempt or 0
        stage.log_const = (ctx.run_id, job, src)
        self._root: list | None = None  # torchrun "Root Cause" block being read

    def _rank(self, origin: logparse.Origin) -> tuple[int | None, int | None]:
        p = self.pinfo
        if (
            origin.rank is None
            and origin.local_rank is None
            and origin.task is None
            and p.local_rank is not None
        ):
            origin = logparse.Origin(local_rank=p.local_rank)
        node = origin.task if origin.task is not None else p.node
        return origin.global_rank(self.ctx.gpus_per_node, p.node), node

    def _last_time(self) -> datetime | None:
        return datetime.fromisoformat(self.st.last_time) if self.st.last_time else None

    def _emit(self, origin: logparse.Origin, line_no: int, ev: logparse.Event) -> None:
        rank, node = self._rank(origin)
        self.stage.event(
            [
                self.ctx.run_id,
                self.job,
                rank,
                node,
                _ts(ev.time or self._last_time()),
                ev.kind,
                ev.message,
                self.src,
                line_no,
            ]
        )

    def line(self, line_no: int, line: str) -> None:
        """One candidate line (1-based number, no newline)."""
        if not self.tracker.pending and self._root is None and "iteration" in line:
            # fast path for the bulk of a big log: an iteration line needs no origin (prefixes are
            # skipped by the head regex; the fields are parsed later in SQL)
            head = logparse.iteration_head(line)
            if head is not None:
                self._iteration(head, line, line_no)
                return
        origin, body = logparse.split_origin(line)
        if self._root is not None:  # torchrun summary: its fields follow the "Root Cause" line
            self._root[2].append(body)
            if len(self._root[2]) >= 12 or "exitcode" in body:
                self._finish_root()
        key = (origin.task, origin.local_rank, origin.rank)
        if self.tracker.active(key) and "Traceback (most recent call last)" not in body:
            done = self.tracker.feed(key, body)
            if done:
                self._emit(origin, done[0], done[1])
            if body[:1] in (" ", "\t"):
                return
        if "iteration" in body:
            head = logparse.iteration_head(body)
            if head is not None:
                self._iteration(head, body, line_no)
                return
        if "Traceback (most recent call last)" in body:
            if not self.tracker.active(key):
                lt = self._last_time()
                self.tracker.start(key, line_no, logparse.find_time(body, lt.year if lt else None) or lt)
            return
        if "Root Cause (first observed failure)" in body:
            self._root = [line_no, origin, []]
            return
        lt = self._last_time()
        for ev in logparse.classify_line(body, lt.year if lt else None):
            self._emit(origin, line_no, ev)

    def fast(self) -> bool:
        """Whether iteration lines may skip the origin/traceback bookkeeping (the C scanner's fast mode)."""
        return not self.tracker.pending and self._root is None

    def _iteration(self, head: tuple, text: str, line_no: int) -> None:
        it, total, ts, end = head
        st = self.st
        if ts:
            try:
                datetime.fromisoformat(ts)
            except ValueError:  # no such calendar time (2026-02-30): the line has no usable timestamp
                ts = None
        if ts:
            st.last_time = ts
        if st.last_iter is not None and it <= st.last_iter:
            st.restarts += 1  # the job resumed from a checkpoint and re-ran iterations
        st.last_iter = it
        if not self.want_iters:
            return
        fast = logparse.fast_fields(text[end:], as_text=True)
        if fast is not None:
            (elapsed, lr, gn, cs, gbs, ls, sk, nan, tf), loss, aux, extras = fast
        else:  # a non-numeric or non-finite value somewhere: the generic parser decides
            cols, losses, ex = logparse.parse_fields(text[end:])
            loss, aux = logparse.main_losses(losses)
            rest = logparse.extra_losses(losses)
            if rest:
                ex["losses"] = rest
            extras = json.dumps(ex)
            elapsed, lr, gn, cs, gbs, ls, sk, nan, tf = map(cols.get, logparse.FAST_COLUMNS)
        if elapsed is None:
            st.bad += 1  # garbled (e.g. interleaved with another rank's output)
            return
        self.stage.log_iteration(
            [
                it,
                ts,
                elapsed,
                loss,
                lr,
                gn,
                cs,
                gbs,
                ls,
                sk,
                nan,
                tf,
                aux,
                extras,
                self.base_attempt + st.restarts,
                total,
            ],
            line_no,
        )

    def _finish_root(self) -> None:
        line_no, origin, follow = self._root
        self._root = None
        rc = logparse.parse_root_cause(follow)
        if rc:
            r, ev = rc
            self.stage.event(
                [
                    self.ctx.run_id,
                    self.job,
                    r,
                    None,
                    _ts(ev.time or self._last_time()),
                    ev.kind,
                    ev.message,
                    self.src,
                    line_no,
                ]
            )

    def finish(self) -> None:
        if self._root is not None:
            self._finish_root()
        for ln, ev in self.tracker.flush():
            self._emit(logparse.Origin(), ln, ev)


def _sacct_rows(con, text: str, ctx: _RunCtx | None, src: str, st: FileState, stage: Stage) -> None:
    lines = text.split("\n")[:-1]
    try:
        recs = logparse.parse_sacct(lines)
    except ValueError as e:
        st.bad += len(lines)
        raise IngestError(f"{src}: {e}") from None
    if ctx is None:
        return
    for i, r in enumerate(recs):
        con.execute(
            """INSERT INTO jobs (run_id, job_id, executor, attempt, state, reason, exit_code, start_time,
                                 end_time, node_list, updated_at)
               VALUES (?, ?, 'slurm', ?, ?, ?, ?, ?, ?, ?, now())
               ON CONFLICT (run_id, job_id) DO UPDATE SET state = excluded.state,
                 exit_code = coalesce(excluded.exit_code, jobs.exit_code),
                 start_time = coalesce(excluded.start_time, jobs.start_time),
                 end_time = coalesce(excluded.end_time, jobs.end_time),
                 node_list = coalesce(excluded.node_list, jobs.node_list),
                 reason = coalesce(jobs.reason, excluded.reason), updated_at = now()""",
            [
                ctx.run_id,
                r.job_id,
                r.restarts or 0,
                r.state,
                r.reason,
                r.exit_code,
                r.start,
                r.end,
                r.node_list,
            ],
        )
        kind = logparse.SACCT_EVENT.get(r.state)
        if kind:
            stage.event(
                [
                    ctx.run_id,
                    r.job_id,
                    None,
                    None,
                    _ts(r.end or r.start),
                    kind,
                    f"sacct: job {r.job_id} {r.state}" + (f" ({r.reason})" if r.reason else ""),
                    src,
                    i + 2,
                ]
            )


# ----------------------------------------------------------------------------------------- driver


def _head_sha(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.sha1(f.read(HEAD)).hexdigest()


_KNOWN_COLS = 'size, mtime, "offset", head_sha, lines, bad_lines, undecodable_lines, state, truncated'


def _known_files(con, paths: list[str]) -> dict[str, tuple]:
    """What earlier ingests recorded about these files, in one query (a study can have thousands of per-rank
    logs: one lookup each cost more than reading them)."""
    rows = con.execute(
        f"SELECT path, {_KNOWN_COLS} FROM ingested_files WHERE path IN (SELECT unnest(?::VARCHAR[]))", [paths]
    ).fetchall()
    return {r[0]: tuple(r[1:]) for r in rows}


def _ingest_one(
    con,
    t: _Target,
    ctx: _RunCtx | None,
    stats: IngestStats,
    force: bool,
    on_bytes: Callable[[int], None] | None,
    row: tuple | None,
    mapped: bool | None = None,
    group: list | None = None,
) -> None:
    """One file, in its own transaction; or, with `group`, inside the caller's transaction with its
    ingested_files record appended to `group` (see _ingest_group)."""
    src = t.src
    stt = t.path.stat()
    size, mtime = stt.st_size, stt.st_mtime
    head = _head_sha(t.path)
    st = FileState()
    offset = 0
    if row and not force:
        psize, pmtime, poff, phead, plines, pbad, pund, pstate, ptrunc = row
        same_head = phead == head or (poff or 0) < HEAD  # a short file's head grows with appends
        if psize == size and pmtime == mtime and phead == head:
            stats.skipped_unchanged += 1
            if on_bytes:
                on_bytes(size)
            return
        if same_head and poff is not None and size >= poff:
            offset = poff
            s = json.loads(pstate) if pstate else {}
            st = FileState(
                lines=plines or 0,
                bad=(pbad or 0) - bool(ptrunc),  # the partial last line counted then is read now
                undecodable=pund or 0,
                last_iter=s.get("last_iter"),
                restarts=s.get("restarts", 0),
                last_time=s.get("last_time"),
            )
            if on_bytes:
                on_bytes(offset)
    stats.files += 1
    before = (st.lines, st.bad, st.undecodable)
    stage = Stage()
    try:
        if ctx is None:
            raise IngestError(f"{src}: no run for this file")
        pinfo = logparse.path_info(src)
        job = pinfo.job_id or t.path.stem
        scanner = _LogScanner(st, ctx, job, pinfo, stage, src, want_iters=not ctx.has_metrics)
        mode = readers.scan_mode(t.kind, size - offset)
        sacct_text: list[str] = []

        def on_block(first: int, text: str) -> None:  # metrics and sacct files, block by block
            if t.kind == "metrics":
                _metrics_rows(text, first, st, ctx, stage, src)
            else:
                sacct_text.append(text)

        from mimo_jobs.store.connection import transaction

        # One transaction per file (its rows + its ingested_files row), open while scanning: the C path
        # stores each segment's rows while it scans the next. Small files share their group's.
        with transaction(con) if group is None else nullcontext():
            if mode == "c":
                try:
                    end_offset, partial = readers.scan_compiled(
                        con, t.path, offset, size, st, scanner, stage, on_bytes, mapped
                    )
                except BaseException:
                    stage.drain()  # a batch still being stored must finish before the rollback uses `con`
                    raise
            else:
                end_offset, partial = readers.scan_python(
                    t.path, t.kind, offset, st, scanner, on_block, on_bytes, mode == "grep", stage.dir
                )
            scanner.finish()
            if partial:
                st.bad += 1  # truncated last line: counted; left unread so a growing file resumes cleanly
                stats.truncated_files += 1
            if offset == 0 and row:
                con.execute("DELETE FROM events WHERE source_file = ?", [src])  # file rewritten: start over
            if sacct_text:
                _sacct_rows(con, "".join(sacct_text), ctx, src, st, stage)
            n_it, n_ev = stage.load(con)
            if n_it and t.kind != "sacct":
                _restitch(con, ctx.run_id)
                # runs known only from logs learn their global batch size from the iteration lines
                con.execute(
                    """UPDATE runs SET gbs = (SELECT arg_max(gbs, iteration) FROM iterations
                                                     WHERE run_id = ? AND gbs IS NOT NULL)
                               WHERE run_id = ? AND gbs IS NULL""",
                    [ctx.run_id, ctx.run_id],
                )
            record = [src, ctx.run_id, size, mtime, st.lines, st.bad, st.undecodable, t.kind, end_offset, head,
                      partial, st.to_json()]
            if group is None:
                _record_files(con, [(record, bool(row))])
            else:
                group.append((record, bool(row)))
        stats.iterations += n_it
        stats.events += n_ev
        stats.lines += st.lines - before[0]
        stats.bad_lines += st.bad - before[1]
        stats.undecodable += st.undecodable - before[2]
    finally:
        stage.close()


def _ctx_of(ctx: dict, t: _Target):
    """The run a target belongs to (_register_runs keys run dirs by path, loose log files by resolved path)."""
    return ctx.get(t.run_dir) if t.run_dir is not None else ctx.get(t.src)


def _record_files(con, records: list[tuple[list, bool]]) -> None:
    """ingested_files rows (with whether one existed before) in one DELETE + one INSERT: DuckDB's INSERT OR
    REPLACE costs twice as much, and each statement ~1 ms."""
    old = [r[0] for r, had in records if had]
    if old:
        con.execute(f"DELETE FROM ingested_files WHERE path IN ({', '.join('?' * len(old))})", old)
    values = ", ".join("(?, ?, ?, ?, ?, ?, ?, now(), ?, ?, ?, ?, ?)" for _ in records)
    con.execute(
        f"""INSERT INTO ingested_files (path, run_id, size, mtime, lines, bad_lines, undecodable_lines,
              ingested_at, kind, "offset", head_sha, truncated, state) VALUES {values}""",
        [x for r, _ in records for x in r],
    )


# Files smaller than this are ingested GROUP_FILES at a time in one transaction: a study's per-rank logs are
# thousands of small files, and a DuckDB transaction plus its statements cost more than scanning one.
SMALL_FILE = 1 << 20
GROUP_FILES = 64


def _ingest_group(con, group: list[_Target], ctx: dict, stats: IngestStats, force: bool, on_bytes, known: dict,
                  at: Callable[[_Target], None]) -> bool:
    """Small files in one transaction. False (and nothing kept, `stats` as before) when any of them failed:
    the caller then takes them one by one, so a failure costs only its own file."""
    import copy

    from mimo_jobs.store.connection import transaction

    before = copy.deepcopy(stats)
    records: list = []
    try:
        with transaction(con):
            for t in group:
                at(t)
                c = _ctx_of(ctx, t)
                _ingest_one(con, t, c, stats, force, on_bytes, known.get(t.src), group=records)
            if records:
                _record_files(con, records)
    except Exception:  # noqa: BLE001 - rolled back; each file is retried alone and reports its own error
        for f in vars(before):
            setattr(stats, f, getattr(before, f))
        return False
    return True


def _restitch(con, run_id: str) -> None:
    """Across jobs of one run (a retry is a new job that resumed from a checkpoint), the newest attempt's
    row for each iteration is the curve; older rows are kept but marked superseded."""
    n = con.execute("SELECT count(DISTINCT job_id) FROM iterations WHERE run_id = ?", [run_id]).fetchone()[0]
    if n <= 1:
        con.execute("UPDATE iterations SET superseded = false WHERE run_id = ? AND superseded", [run_id])
        return
    con.execute(
        """UPDATE iterations SET superseded = (s.rn > 1)
           FROM (SELECT job_id, iteration, row_number() OVER (
                   PARTITION BY iteration ORDER BY attempt DESC NULLS LAST, time DESC NULLS LAST, job_id DESC) rn
                 FROM iterations WHERE run_id = ?) s
           WHERE iterations.run_id = ? AND iterations.job_id = s.job_id AND iterations.iteration = s.iteration
             AND iterations.superseded IS DISTINCT FROM (s.rn > 1)""",
        [run_id, run_id],
    )


def ingest_paths(
    con,
    paths: list[Path],
    force: bool = False,
    log_run: LogRunInfo | None = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> IngestStats:
    """Ingest run dirs / trees of run dirs / single files. `progress(name, bytes_done, bytes_total)` is
    called as bytes are read (the CLI draws a rich progress bar from it)."""
    stats = IngestStats()
    try:
        readers.forced_scanner()  # an unusable MIMO_JOBS_SCANNER is refused before anything is written
    except ScanError as e:
        raise IngestError(str(e)) from None
    targets = discover([Path(p) for p in paths])
    from mimo_jobs.store.connection import transaction

    with transaction(con):
        ctx = _register_runs(con, targets, log_run, stats)
    sizes = [t.path.stat().st_size for t in targets]
    total = sum(sizes)
    done = 0

    def on_bytes(n: int) -> None:
        nonlocal done
        done += n
        if progress:
            progress(cur, done, total)

    known = _known_files(con, [t.src for t in targets])

    def at(t: _Target) -> None:  # the file the progress bar names
        nonlocal cur
        cur = t.path.name

    def one(t: _Target) -> None:
        nonlocal done
        at(t)
        c = _ctx_of(ctx, t)
        done0 = done
        try:
            try:
                _ingest_one(con, t, c, stats, force, on_bytes, known.get(t.src))
            except readers.FileShrank:  # rolled back; read again unmapped: it ends where the file now ends
                stats.files -= 1
                done = done0
                _ingest_one(con, t, c, stats, force, on_bytes, known.get(t.src), mapped=False)
        except (IngestError, ScanError) as e:
            stats.problems.append(str(e))
        except OSError as e:
            stats.problems.append(f"{t.path}: {e.strerror or e}")

    cur = ""
    i = 0
    while i < len(targets):
        j = i
        while j < len(targets) and j - i < GROUP_FILES and sizes[j] < SMALL_FILE:
            j += 1
        if j - i > 1:  # a run of small files
            done0 = done
            if not _ingest_group(con, targets[i:j], ctx, stats, force, on_bytes, known, at):
                done = done0  # they are read again, one by one
                for t in targets[i:j]:
                    one(t)
            i = j
            continue
        one(targets[i])
        i += 1
    return stats

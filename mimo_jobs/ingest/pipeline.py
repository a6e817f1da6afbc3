"""Ingest: stream run dirs and log files into the store (iterations, events, jobs from sacct).

- Files are read a block of complete lines at a time, never whole (readers.py); only candidate lines
  (events.ALL_TRIGGERS) are looked at, and with the compiled scanner iteration lines never reach Python.
  lines.py decides what each log line means, metrics.py and sacct.py read the structured files;
  staging.py collects the rows and merges them into the store.
- Bad input is counted, not fatal: invalid UTF-8 (lines decoded with replacement and counted), a truncated
  last line (counted, left for the next ingest in case the file is still growing), malformed JSON lines,
  interleaved/garbled iteration lines.
- Idempotent: `ingested_files` keeps size, mtime, the byte offset consumed and a hash of the file's head.
  Unchanged files are skipped; grown files resume at the offset; rewritten files are re-read. Rows are
  keyed (iterations: run/job/iteration, kept unique by staging.merge; events: file/line/kind) so
  re-reading never duplicates.
- Each file commits in one transaction (rows + its ingested_files row); runs of small files (per-rank
  logs) share one, GROUP_FILES at a time, and a group with a failing file is redone file by file, so the
  failure still costs only its own file. The runs rows go into the first transaction that commits (runs.py
  Registration): a failure of the store itself (a full disk, the file-size limit: store/errors.py) stops
  the ingest and leaves the store as it was, with no run registered for rows it never got. DuckDB lets one process write a store at a time; store.connect
  waits for the lock, so two ingests at once serialize.
- Attempts stitch: within a job a later attempt replaces an iteration it re-ran; across jobs of one run
  the older rows are marked `superseded`, and the report reads only the rest.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path

from mimo_jobs.store.connection import transaction
from mimo_jobs.store.errors import StoreFull, full_errno, out_of_room
from mimo_jobs.submit.executors.slurm.sacct import parse_dump

from . import readers, sacct
from .discover import IngestError, Target, discover
from .lines import LineHandler
from .metrics import metrics_rows
from .origin import path_info
from .readers import FileState, ScanError, ScanOptions
from .runs import LogRunInfo, Registration, RunCtx, ctx_of, register_runs
from .staging import Stage

__all__ = ["IngestError", "IngestStats", "LogRunInfo", "ScanOptions", "ingest_paths"]

HEAD = 4096  # bytes of a file's head whose hash tells a rewritten file from a grown one
# Files smaller than this are ingested GROUP_FILES at a time in one transaction: a study's per-rank logs are
# thousands of small files, and a DuckDB transaction plus its statements cost more than scanning one.
SMALL_FILE = 1 << 20
GROUP_FILES = 64


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
    memory_rows: int = 0  # rank_memory rows written (per-rank memory facts of run dirs)
    problems: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)


class _Progress:
    """Bytes read so far (the `on_bytes` of the readers), reported as progress(file name, done, total)."""

    def __init__(self, callback: Callable[[str, int, int], None] | None, total: int) -> None:
        self.callback, self.total, self.done, self.name = callback, total, 0, ""

    def __call__(self, n: int) -> None:
        self.done += n
        if self.callback:
            self.callback(self.name, self.done, self.total)


@dataclass
class _Session:
    """What every file of one ingest_paths call shares."""

    con: object
    ctx: dict  # register_runs' RunCtx by run dir / loose log
    runs: Registration  # the runs rows, written by the first transaction that commits
    stats: IngestStats
    force: bool
    options: ScanOptions
    progress: _Progress
    known: dict  # _known_files


def ingest_paths(
    con,
    paths: list[Path],
    force: bool = False,
    log_run: LogRunInfo | None = None,
    progress: Callable[[str, int, int], None] | None = None,
    options: ScanOptions | None = None,
) -> IngestStats:
    """Ingest run dirs / trees of run dirs / single files. `progress(name, bytes_done, bytes_total)` is
    called as bytes are read (the CLI draws a rich progress bar from it). `options`: how files are scanned
    (default: what MIMO_JOBS_SCANNER says; an unusable setting is refused before anything is written)."""
    try:
        options = options or readers.scan_options()
    except ScanError as e:
        raise IngestError(str(e)) from None
    found = discover([Path(p) for p in paths])
    stats = IngestStats()
    reg = register_runs(con, found, log_run)
    stats.runs_registered = reg.new
    targets = [t for t in found if t.kind != "memory"]  # memory facts: _ingest_memory, per run
    sizes = [t.path.stat().st_size for t in targets]
    known = _known_files(con, [t.src for t in targets])
    s = _Session(con, reg.ctx, reg, stats, force, options, _Progress(progress, sum(sizes)), known)
    for i, j in _batches(sizes):
        if j - i > 1 and _ingest_group(s, targets[i:j]):
            continue
        for t in targets[i:j]:  # a large file, or the files of a group that failed, one by one
            _ingest_alone(s, t)
    _ingest_memory(s)
    if reg.writes:  # runs without a file that stored anything (a run dir holding only run.yaml)
        with transaction(con):
            reg.write(con)
        reg.written()
    return stats


def _ingest_memory(s: _Session) -> None:
    """Each run dir's per-rank memory facts (memory.py), one transaction per run."""
    from .memory import store_memory

    for key, rc in s.ctx.items():
        if not isinstance(key, Path):  # loose logs have no run dir
            continue
        with transaction(s.con):
            s.runs.write(s.con)
            n, problems = store_memory(s.con, key, rc.run_id)
        s.runs.written()
        s.stats.memory_rows += n
        s.stats.problems += problems


def _batches(sizes: list[int]):
    """(start, end) index ranges of the files to ingest together: runs of small files, GROUP_FILES at most,
    and every other file alone."""
    i = 0
    while i < len(sizes):
        j = i
        while j < len(sizes) and j - i < GROUP_FILES and sizes[j] < SMALL_FILE:
            j += 1
        j = max(j, i + 1)
        yield i, j
        i = j


def _ingest_alone(s: _Session, t: Target) -> None:
    """One file in its own transaction; its failure becomes a problem of the stats."""
    s.progress.name = t.path.name
    try:
        _ingest_one(s, t)
    except IngestError as e:
        s.stats.problems.append(str(e))
    except OSError as e:
        if full_errno(e) is not None:  # not this file's problem: every file after it would meet it too
            raise _out_of_room(e, t) from None
        s.stats.problems.append(f"{t.path}: {e.strerror or e}")


def _out_of_room(e: OSError, t: Target) -> StoreFull:
    """A full disk or the file-size limit met by the staged rows (temporary CSV files): the command stops
    and says so, as for the store itself (store/errors.py)."""
    import errno
    import tempfile

    code = full_errno(e)
    where = e.filename or tempfile.gettempdir()
    todo = (
        "raise the limit (ulimit -f)"
        if code == errno.EFBIG
        else "free space there, or set TMPDIR to a directory on another filesystem"
    )
    return StoreFull(out_of_room(code, f"staging the rows of {t.src} in {where}", todo), str(where))


def _ingest_group(s: _Session, group: list[Target]) -> bool:
    """Small files in one transaction. False (and nothing kept, stats and progress as before) when any of
    them failed: the caller then takes them one by one, so a failure costs only its own file."""
    before, done = copy.deepcopy(s.stats), s.progress.done
    records: list = []
    try:
        with transaction(s.con):
            s.runs.write(s.con)
            for t in group:
                s.progress.name = t.path.name
                _ingest_one(s, t, group=records)
            if records:
                _record_files(s.con, records)
    except Exception:  # noqa: BLE001 - rolled back; each file is retried alone and reports its own error
        for f in vars(before):
            setattr(s.stats, f, getattr(before, f))
        s.progress.done = done
        return False
    s.runs.written()
    return True


# ----------------------------------------------------------------------------------------- one file


def _ingest_one(s: _Session, t: Target, group: list | None = None) -> None:
    """One file, in its own transaction; or, with `group`, inside the caller's transaction with its
    ingested_files record appended to `group` (see _ingest_group)."""
    con, ctx, row = s.con, ctx_of(s.ctx, t), s.known.get(t.src)
    stt = t.path.stat()
    size, mtime = stt.st_size, stt.st_mtime
    # Same size and mtime as last time: unchanged, known from the stat alone (as rsync and make decide).
    same = row is not None and not s.force and row[0] == size and row[1] == mtime
    head = None if same else _head_sha(t.path)
    start = None if same else _start(row, s.force, size, mtime, head)
    if start is None:  # unchanged since the last ingest
        s.stats.skipped_unchanged += 1
        s.progress(size)
        return
    offset, st = start
    if offset:
        s.progress(offset)  # the part read by earlier ingests
    s.stats.files += 1
    before = (st.lines, st.bad, st.undecodable)
    stage = Stage()
    try:
        if ctx is None:
            raise IngestError(f"{t.src}: no run for this file")
        # One transaction per file (its rows + its ingested_files row), open while scanning: the C path
        # stores each segment's rows while it scans the next. Small files share their group's.
        with transaction(con) if group is None else nullcontext():
            if group is None:
                s.runs.write(con)
            end_offset, partial = _read(s, t, ctx, offset, size, st, stage)
            if partial:
                st.bad += 1  # truncated last line: counted; left unread so a growing file resumes cleanly
                s.stats.truncated_files += 1
            if offset == 0 and row:
                con.execute("DELETE FROM events WHERE source_file = ?", [t.src])  # rewritten: start over
            n_it, n_ev = _load(con, t, ctx, stage)
            record = [
                t.src,
                ctx.run_id,
                size,
                mtime,
                st.lines,
                st.bad,
                st.undecodable,
                t.kind,
                end_offset,
                head,
                partial,
                st.to_json(),
            ]
            if group is None:
                _record_files(con, [(record, bool(row))])
            else:
                group.append((record, bool(row)))
        if group is None:
            s.runs.written()
        _count(s.stats, st, before, n_it, n_ev)
    finally:
        stage.close()


def _start(
    row: tuple | None, force: bool, size: int, mtime: float, head: str
) -> tuple[int, FileState] | None:
    """Where reading a file starts, from what the last ingest recorded (`row`, see _known_files): None when
    the file is unchanged (skipped); (the stored offset, the stored state) when it only grew; else (0, a
    fresh state): a new or rewritten file, or `force`."""
    if not row or force:
        return 0, FileState()
    psize, pmtime, poff, phead, plines, pbad, pund, pstate, ptrunc = row
    if psize == size and pmtime == mtime and phead == head:
        return None
    same_head = phead == head or (poff or 0) < HEAD  # a short file's head grows with appends
    if not (same_head and poff is not None and size >= poff):
        return 0, FileState()
    saved = json.loads(pstate) if pstate else {}
    return poff, FileState(
        lines=plines or 0,
        bad=(pbad or 0) - bool(ptrunc),  # the partial last line counted then is read now
        undecodable=pund or 0,
        last_iter=saved.get("last_iter"),
        restarts=saved.get("restarts", 0),
        last_time=saved.get("last_time"),
        open_blocks=saved.get("open_blocks"),
    )


def _read(s: _Session, t: Target, ctx: RunCtx, offset: int, size: int, st: FileState, stage: Stage):
    """Read a file from `offset`: its rows are staged (the compiled scanner's iteration rows already stored),
    a sacct dump's jobs stored. Returns (offset after the last complete line, whether a partial last line
    was left)."""
    if t.kind == "metrics":

        def on_block(first: int, text: str) -> None:
            metrics_rows(text, first, st, ctx, stage, t.src)

        return readers.read_blocks(t.path, offset, st, on_block, s.progress, s.options.max_line)
    if t.kind == "sacct":
        blocks: list[str] = []
        end = readers.read_blocks(
            t.path, offset, st, lambda _, text: blocks.append(text), s.progress, s.options.max_line
        )
        _store_sacct(s.con, "".join(blocks), ctx, t.src, st, stage)
        return end
    pinfo = path_info(t.src)
    job = pinfo.job_id or t.path.stem
    handler = LineHandler(st, ctx, job, pinfo, stage, t.src, want_iters=not ctx.has_metrics)
    if s.options.scanner_for(t.kind) == "c":
        try:
            end = readers.scan_compiled(
                s.con, t.path, offset, size, st, handler, stage, s.progress, s.options
            )
        except BaseException:
            stage.drain()  # a batch still being stored must finish before the rollback uses `con`
            raise
        # The stage's thread may still be storing the last batch on `con`: whatever the caller does next
        # on the connection (delete a rewritten file's old events, load, record) waits for it here.
        stage.wait()
    else:
        end = readers.scan_python(t.path, offset, st, handler, s.progress, s.options)
    handler.finish()
    return end


def _store_sacct(con, text: str, ctx: RunCtx, src: str, st: FileState, stage: Stage) -> None:
    lines = text.split("\n")[:-1]
    try:
        records = parse_dump(lines)
    except ValueError as e:
        st.bad += len(lines)
        raise IngestError(f"{src}: {e}") from None
    sacct.store_dump(con, records, ctx.run_id, src, stage)


def _load(con, t: Target, ctx: RunCtx, stage: Stage) -> tuple[int, int]:
    """Add the staged rows to the store; new iterations restitch the run. Returns (iterations, events)."""
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
    return n_it, n_ev


def _count(stats: IngestStats, st: FileState, before: tuple[int, int, int], n_it: int, n_ev: int) -> None:
    stats.iterations += n_it
    stats.events += n_ev
    stats.lines += st.lines - before[0]
    stats.bad_lines += st.bad - before[1]
    stats.undecodable += st.undecodable - before[2]


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


# ----------------------------------------------------------------------------------------- ingested_files


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

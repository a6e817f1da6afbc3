"""Ingest: stream run dirs and log files into the store (iterations, events, jobs from sacct).

- Files are read in binary chunks cut at the last newline, never whole. Only candidate lines (found by
  substring search over the whole chunk, see logparse.TRIGGERS) are parsed in Python, so throughput stays
  close to a plain line count on large multi-rank logs.
- Bad input is counted, not fatal: invalid UTF-8 (lines decoded with replacement and counted), a truncated
  last line (counted, left for the next ingest in case the file is still growing), malformed JSON lines,
  interleaved/garbled iteration lines.
- Idempotent: `ingested_files` keeps size, mtime, the byte offset consumed and a hash of the file's head.
  Unchanged files are skipped; grown files resume at the offset; rewritten files are re-read. Rows are
  keyed (iterations: run/job/iteration; events: file/line/kind) so re-reading never duplicates.
- Each file commits in one transaction (rows + its ingested_files row). DuckDB lets one process write a
  store at a time; store.connect waits for the lock, so two ingests at once serialize.
- Attempts stitch: within a job a later attempt replaces an iteration it re-ran; across jobs of one run
  the older rows are marked `superseded`, and the report reads only the rest.
"""

from __future__ import annotations

import csv
import hashlib
import json
import mmap
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Callable, Iterable

from . import catalog, logparse
from .records import PHASES
from .rundir import RunDir

CHUNK = 8 << 20
# How log files are scanned for candidate lines: "c" (the compiled _logscan: one pass, iteration lines parsed
# in C), "grep" (a grep process finds candidates, Python parses them), "python" (substring scans in-process).
# None: "c" when the extension is built, else grep for big files. Tests pin each mode to compare their rows.
SCAN: str | None = os.environ.get("MIMO_JOBS_SCANNER") or None
GREP_MIN_BYTES = 4 << 20  # smaller files are scanned in-process (a process start costs more than the scan)
SEGMENT = 64 << 20  # bytes mapped at a time by the C path (> MAX_LINE: a longer run without newline is garbage)
# Rows of C-parsed iterations per stored batch: DuckDB writes a batch of at least one row group (122,880 rows)
# straight to the database file; smaller ones go through its write-ahead log and cost a checkpoint on commit.
ROW_BATCH = 131072
SIMD = True  # the C path's AVX2 filter where the CPU has it (tests compare it with the portable scalar one)
try:
    from . import _logscan
except ImportError:  # built without a C compiler: same results through grep/Python, slower
    _logscan = None
MAX_LINE = 16 << 20  # a "line" longer than this is binary garbage: counted and dropped
HEAD = 4096
LOG_SUFFIXES = (".out", ".err", ".log", ".txt")


class IngestError(ValueError):
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
        key = str(t.path.resolve())
        if key not in seen:
            seen.add(key)
            uniq.append(t)
    return uniq


# ----------------------------------------------------------------------------------------- run registration


def _register_runs(con, targets: list[_Target], log_run: LogRunInfo | None, stats: IngestStats) -> dict:
    """Run dirs first (all run.yaml files parsed before anything is written), then bare logs."""
    from .study import load_run_yaml

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
            key = str(t.path.resolve())
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
                str(t.path.resolve().parent),
                nodes=info.nodes,
                gpus_per_node=info.gpus_per_node,
                seq_length=info.seq_length,
            )
            if not known:
                stats.runs_registered += 1
            ctx[key] = _RunCtx(rid, info.gpus_per_node, False)
    return ctx


# ----------------------------------------------------------------------------------------- staging


ITER_TYPES = {
    "run_id": "VARCHAR",
    "job_id": "VARCHAR",
    "iteration": "INTEGER",
    "time": "TIMESTAMP",
    "elapsed_ms": "DOUBLE",
    "loss": "DOUBLE",
    "lr": "DOUBLE",
    "grad_norm": "DOUBLE",
    "consumed_samples": "BIGINT",
    "gbs": "INTEGER",
    "loss_scale": "DOUBLE",
    "skipped": "INTEGER",
    "nan": "INTEGER",
    "samples_per_s": "DOUBLE",
    "tokens_per_s": "DOUBLE",
    "tokens_per_s_per_gpu": "DOUBLE",
    "tflops_per_gpu": "DOUBLE",
    "moe_aux_loss": "DOUBLE",
    "phases": "VARCHAR",
    "extras": "VARCHAR",
    "source": "VARCHAR",
    "attempt": "INTEGER",
    "train_iters": "INTEGER",
    "source_file": "VARCHAR",
    "seq": "BIGINT",
}
# phase times as numbers next to the JSON (the report averages them over millions of rows)
PHASE_COLS = [f"{p}_ms" for p in PHASES]
ITER_TYPES = (
    {k: v for k, v in ITER_TYPES.items() if k != "seq"}
    | dict.fromkeys(PHASE_COLS, "DOUBLE")
    | {"seq": "BIGINT"}
)
ITER_COLS = [c for c in ITER_TYPES if c != "seq"]  # the iterations table's columns, in staging order
# Megatron log lines stage only what varies per line; run/job/file are constants added by the load query.
LOG_ITER_TYPES = {c: ITER_TYPES[c] for c in (
    "iteration", "time", "elapsed_ms", "loss", "lr", "grad_norm", "consumed_samples", "gbs", "loss_scale",
    "skipped", "nan", "tflops_per_gpu", "moe_aux_loss", "extras", "attempt", "train_iters", "seq",
)}
_LOG_ITER_SELECT = (
    "SELECT ? AS run_id, ? AS job_id, iteration, time, elapsed_ms, loss, lr, grad_norm, consumed_samples, gbs, "
    "loss_scale, skipped, nan, CASE WHEN gbs <> 0 AND elapsed_ms > 0 THEN gbs / (elapsed_ms / 1000.0) END "
    "AS samples_per_s, NULL::DOUBLE AS tokens_per_s, NULL::DOUBLE AS tokens_per_s_per_gpu, tflops_per_gpu, "
    "moe_aux_loss, NULL::VARCHAR AS phases, extras, 'megatron-log' AS source, attempt, train_iters, "
    "? AS source_file, " + ", ".join(f"NULL::DOUBLE AS {c}" for c in PHASE_COLS) + ", seq FROM {src}"
)
EVENT_COLS = ["run_id", "job_id", "rank", "node", "time", "kind", "message", "source_file", "line_no"]
EVENT_TYPES = {
    "run_id": "VARCHAR",
    "job_id": "VARCHAR",
    "rank": "INTEGER",
    "node": "INTEGER",
    "time": "TIMESTAMP",
    "kind": "VARCHAR",
    "message": "VARCHAR",
    "source_file": "VARCHAR",
    "line_no": "BIGINT",
}


def _merge(
    con,
    select: str,
    params: list,
    dedupe: bool,
    keys: list[tuple[str, str]] | None = None,
    fresh: bool = False,
) -> None:
    """Add staged iteration rows (`select`, ITER_COLS + seq) to the store. Within the staged rows the newest
    attempt wins, then the later line (`dedupe`: only needed when a key can repeat); against rows already
    stored, an older attempt (a re-ingested file) never overwrites a newer one. The iterations table has no
    primary key (its index cost more than the rest of a big-log ingest): this is the upsert. `fresh`: the
    caller knows no stored row shares a key with these (a plain insert)."""
    cols = ", ".join(ITER_COLS)
    sel = f"SELECT {cols} FROM ({select})"
    if dedupe:
        sel += """ QUALIFY row_number() OVER (PARTITION BY run_id, job_id, iteration
                                             ORDER BY attempt DESC NULLS LAST, seq DESC) = 1"""
    if fresh:
        con.execute(f"INSERT INTO iterations ({cols}) {sel}", params)
        return
    if keys is None:  # (run_id, job_id) pairs the rows belong to
        keys = con.execute(f"SELECT DISTINCT run_id, job_id FROM ({select})", params).fetchall()
    if not keys:
        return
    where = " OR ".join("(run_id = ? AND job_id = ?)" for _ in keys)
    flat = [x for k in keys for x in k]
    if not con.execute(f"SELECT count(*) FROM iterations WHERE {where}", flat).fetchall()[0][0]:
        con.execute(f"INSERT INTO iterations ({cols}) {sel}", params)  # the common case: all new
        return
    con.execute(f"CREATE OR REPLACE TEMP TABLE _staged AS {sel}", params)
    try:
        con.execute("""DELETE FROM iterations USING _staged n
                       WHERE iterations.run_id = n.run_id AND iterations.job_id = n.job_id
                         AND iterations.iteration = n.iteration
                         AND coalesce(n.attempt, 0) >= coalesce(iterations.attempt, 0)""")
        con.execute(f"""INSERT INTO iterations ({cols})
                        SELECT {", ".join("n." + c for c in ITER_COLS)} FROM _staged n
                        ANTI JOIN iterations i
                          ON i.run_id = n.run_id AND i.job_id = n.job_id AND i.iteration = n.iteration""")
    finally:
        con.execute("DROP TABLE IF EXISTS _staged")


# The C scanner's rows (a dict of numpy columns; NaN and NaT are NULL, all its values are finite) as the
# staged-log-row shape of LOG_ITER_TYPES.
_C_ROWS_SELECT = (
    "SELECT iteration, time_us AS time, elapsed_ms, loss, lr, grad_norm, "
    "CAST(consumed_samples AS BIGINT) AS consumed_samples, CAST(gbs AS INTEGER) AS gbs, loss_scale, "
    "CAST(skipped AS INTEGER) AS skipped, CAST(nan AS INTEGER) AS nan, tflops_per_gpu, moe_aux_loss, "
    "list_extract(?::VARCHAR[], extras_id + 1) AS extras, "
    "attempt, train_iters, seq FROM _c_rows"
)


def _c_columns(cols: dict):
    """numpy views of _logscan.Scanner.take()'s column bytes."""
    import numpy as np

    out = {"iteration": np.frombuffer(cols["iteration"], np.int32)}
    out["time_us"] = np.frombuffer(cols["time_us"], "datetime64[us]")
    for k in ("elapsed_ms", "loss", "lr", "grad_norm", "consumed_samples", "gbs", "loss_scale", "skipped", "nan",
              "tflops_per_gpu", "moe_aux_loss"):
        out[k] = np.frombuffer(cols[k], np.float64)
    out["extras_id"] = np.frombuffer(cols["extras_id"], np.int32)
    out["attempt"] = np.frombuffer(cols["attempt"], np.int32)
    out["train_iters"] = np.frombuffer(cols["train_iters"], np.int32)
    out["seq"] = np.frombuffer(cols["seq"], np.int64)
    return out


class _Stage:
    """Rows written to temp CSV files as they are parsed (memory stays flat on huge logs), then loaded
    with one bulk `INSERT ... SELECT FROM read_csv` each: far faster than executemany. Log iteration rows
    parsed by the C scanner arrive as numpy columns instead (no text round trip at all)."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="mimo-ingest-")
        self._it_f = open(os.path.join(self.dir, "it.csv"), "w", newline="")
        self._ev_f = open(os.path.join(self.dir, "ev.csv"), "w", newline="")
        self._lit_f = open(os.path.join(self.dir, "lit.csv"), "w", newline="")
        self.it = csv.writer(self._it_f)
        self.ev = csv.writer(self._ev_f)
        self.lit = csv.writer(self._lit_f)
        self.n_it = 0
        self.n_lit = 0
        self.n_c = 0  # rows parsed by _logscan, stored batch by batch (c_batch)
        self._untouched: bool | None = None  # the file's (run, job) had no rows before (known at batch 1)
        self._max_it: int | None = None  # highest iteration of the batches stored so far
        self._pool = None
        self._pending = None
        self.log_const: tuple[str, str, str] | None = None  # (run_id, job_id, source_file) of log rows
        self.n_ev = 0
        self._ev_keys: set[tuple[int, str]] = set()

    def iteration(self, row: list) -> None:
        self.n_it += 1
        self.it.writerow(row + [self.n_it])

    def log_iteration(self, row: list, seq: int) -> None:
        """A Megatron log iteration: LOG_ITER_TYPES columns without seq (the line number: later lines win)."""
        self.n_it += 1
        self.n_lit += 1
        row.append(seq)
        self.lit.writerow(row)

    def c_batch(self, con, cols: dict) -> None:
        """Store one batch of C-parsed rows (_logscan.Scanner.take()) in a background thread: DuckDB and the C
        scanner both release the GIL, so the next segment of the file is scanned while this one is written.
        One batch is in flight at a time, and the caller does not touch `con` meanwhile."""
        import numpy as np

        self.wait()
        c = _c_columns(cols)
        it = c["iteration"]
        n = len(it)
        if not n:
            return
        self.n_it += n
        self.n_c += n
        run_id, job, src = self.log_const
        if self._untouched is None:  # did this (run, job) have rows before this file's rows?
            self._untouched = not con.execute(
                "SELECT count(*) FROM iterations WHERE run_id = ? AND job_id = ?", [run_id, job]
            ).fetchall()[0][0]
        ordered = n == 1 or bool(np.all(it[1:] > it[:-1]))
        fresh = self._untouched and ordered and (self._max_it is None or int(it[0]) > self._max_it)
        dupes = not ordered and len(np.unique(it)) < n
        self._max_it = max(self._max_it if self._max_it is not None else -1, int(it.max()))
        if self._pool is None:
            from concurrent.futures import ThreadPoolExecutor

            self._pool = ThreadPoolExecutor(1, thread_name_prefix="mimo-ingest")
        self._pending = self._pool.submit(self._load_c, con, c, cols["extras_dict"], dupes, fresh)

    def _load_c(self, con, c: dict, extras: list, dupes: bool, fresh: bool) -> None:
        run_id, job, src = self.log_const
        con.register("_c_rows", c)
        try:
            sel = _LOG_ITER_SELECT.replace("{src}", f"({_C_ROWS_SELECT})")
            _merge(con, sel, [run_id, job, src, extras], dedupe=dupes, keys=[(run_id, job)], fresh=fresh)
        finally:
            con.unregister("_c_rows")

    def drain(self) -> None:
        """Wait for the batch in flight, ignoring its outcome (the caller is already failing)."""
        try:
            self.wait()
        except BaseException:  # noqa: BLE001 - the original error is the one to report
            pass

    def wait(self) -> None:
        """Wait for the batch in flight (its error, if any, is raised here)."""
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.result()

    def event(self, row: list) -> None:
        key = (row[-1], row[5])
        if key in self._ev_keys:
            return
        self._ev_keys.add(key)
        self.n_ev += 1
        self.ev.writerow(row)

    def _read(self, name: str, types: dict) -> str:
        cols = ", ".join(f"'{k}': '{v}'" for k, v in types.items())
        path = os.path.join(self.dir, name).replace("'", "''")
        return (
            f"read_csv('{path}', header=false, columns={{{cols}}}, quote='\"', escape='\"', "
            f"nullstr='', auto_detect=false, delim=',', strict_mode=false)"
        )

    def load(self, con) -> tuple[int, int]:
        self._it_f.close()
        self._ev_f.close()
        self._lit_f.close()
        self.wait()
        if self.n_it > self.n_lit + self.n_c:
            _merge(con, f"SELECT * FROM {self._read('it.csv', ITER_TYPES)}", [], dedupe=True)
        if self.n_lit:  # iteration lines parsed in Python (outside the C scanner's strict syntax)
            sel = _LOG_ITER_SELECT.replace("{src}", self._read("lit.csv", LOG_ITER_TYPES))
            run_id, job, src = self.log_const
            _merge(con, sel, [run_id, job, src], dedupe=True, keys=[(run_id, job)])
        if self.n_ev:
            con.execute(f"""INSERT INTO events ({", ".join(EVENT_COLS)})
                            SELECT * FROM {self._read("ev.csv", EVENT_TYPES)} ON CONFLICT DO NOTHING""")
        return self.n_it, self.n_ev

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        for f in (self._it_f, self._ev_f, self._lit_f):
            if not f.closed:
                f.close()
        for n in ("it.csv", "ev.csv", "lit.csv", "grep.out"):
            try:
                os.unlink(os.path.join(self.dir, n))
            except OSError:
                pass
        try:
            os.rmdir(self.dir)
        except OSError:
            pass


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


# ----------------------------------------------------------------------------------------- chunk reader


@dataclass
class _FileState:
    lines: int = 0  # complete lines consumed so far (line numbers continue after an append)
    bad: int = 0
    undecodable: int = 0
    last_iter: int | None = None
    restarts: int = 0
    last_time: str | None = None

    def to_json(self) -> str:
        return json.dumps(
            {"last_iter": self.last_iter, "restarts": self.restarts, "last_time": self.last_time}
        )


def _chunks(
    path: Path, offset: int, st: _FileState, on_bytes: Callable[[int], None] | None, need_text: bool = True
):
    """Yield (first_line_no, text) for blocks of complete lines starting at `offset` (text is None when
    not needed: lines are still counted and checked for invalid UTF-8 / NUL bytes). Returns (offset after
    the last complete line, whether a partial last line was left)."""
    consumed = offset
    carry = b""
    with open(path, "rb") as f:
        f.seek(offset)
        while True:
            buf = f.read(CHUNK)
            if on_bytes:
                on_bytes(len(buf))
            if not buf:
                break
            data = carry + buf if carry else buf
            cut = data.rfind(b"\n") + 1
            if cut == 0:
                carry = data
                if len(carry) > MAX_LINE:  # no newline in 16 MiB: binary garbage, drop it
                    st.bad += 1
                    consumed += len(carry)
                    carry = b""
                continue
            carry = data[cut:]
            block = data[:cut]
            if need_text or not block.isascii():
                text = _decode(block, st)
            else:
                text = None  # pure ASCII: nothing to count, and the candidate lines come from grep
                if b"\x00" in block:
                    st.bad += sum(1 for ln in block.split(b"\n") if b"\x00" in ln)
            first = st.lines
            st.lines += block.count(b"\n")
            consumed += cut
            yield first, (text if need_text else None)
    return consumed, bool(carry)


def _decode(block: bytes, st: _FileState) -> str:
    try:
        text = block.decode("utf-8")
    except UnicodeDecodeError:
        out = []
        for p in block.split(b"\n"):
            try:
                out.append(p.decode("utf-8"))
            except UnicodeDecodeError:
                st.undecodable += 1
                out.append(p.decode("utf-8", "replace"))
        text = "\n".join(out)
    if "\x00" in text:  # NUL bytes: binary garbage inside a text log (e.g. a crashed writer's page)
        st.bad += sum(1 for ln in text.split("\n") if "\x00" in ln)
        text = text.replace("\x00", "")
    return text


def _metrics_rows(text: str, first: int, st: _FileState, ctx: _RunCtx, stage: _Stage, src: str) -> None:
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
        st: _FileState,
        ctx: _RunCtx,
        job: str,
        pinfo: logparse.PathInfo,
        stage: _Stage,
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


def _python_candidates(text: str, first: int):
    """(line number, line) of every line holding a trigger: one substring scan per trigger over the block
    (the fallback when grep is not installed)."""
    starts: set[int] = set()
    for trig in logparse.ALL_TRIGGERS:
        pos = text.find(trig)
        while pos >= 0:
            starts.add(text.rfind("\n", 0, pos) + 1)
            le = text.find("\n", pos)
            if le < 0:
                break
            pos = text.find(trig, le + 1)
    line_no = first
    prev = 0
    for ls in sorted(starts):
        line_no += text.count("\n", prev, ls)
        prev = ls
        yield line_no + 1, text[ls : text.find("\n", ls)]


GREP = shutil.which("grep")


def _grep_start(path: Path, offset: int, out_path: str):
    """GNU/BSD grep finds the candidate lines (multi-pattern fixed-string search near `wc -l` speed) in a
    second process, while this one counts lines and checks encodings. Reads from `offset` via stdin."""
    args = [GREP, "-a", "-n", "-F"]
    for t in logparse.ALL_TRIGGERS:
        args += ["-e", t]
    f = open(path, "rb")  # noqa: SIM115 - handed to the child, closed by _grep_lines
    f.seek(offset)
    out = open(out_path, "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        args, stdin=f, stdout=out, stderr=subprocess.PIPE, env=dict(os.environ, LC_ALL="C")
    )
    return proc, f, out


def _grep_lines(proc, f, out, out_path: str, first: int, complete: int):
    proc.wait()
    f.close()
    out.close()
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if proc.returncode not in (0, 1):  # 1 = no match
        raise IngestError(f"grep failed ({proc.returncode}): {err.strip()[:200]}")
    with open(out_path, "rb") as g:
        for raw in g:
            n, _, rest = raw.partition(b":")
            k = int(n)
            if k > complete:  # the partial last line: left for the next ingest
                break
            yield first + k, rest.rstrip(b"\n").decode("utf-8", "replace").replace("\x00", "")


def _scan_mode(t: _Target, nbytes: int) -> str:
    if t.kind != "log":
        return "python"
    if SCAN is not None:
        if SCAN not in ("c", "grep", "python"):
            raise IngestError(f"MIMO_JOBS_SCANNER={SCAN!r}: use c, grep or python (or leave it unset)")
        if SCAN == "c" and _logscan is None:
            raise IngestError("MIMO_JOBS_SCANNER=c, but mimo_jobs._logscan is not built (no C compiler at install)")
        if SCAN == "grep" and GREP is None:
            raise IngestError("MIMO_JOBS_SCANNER=grep, but grep is not installed")
        return SCAN
    if _logscan is not None:
        return "c"
    return "grep" if GREP is not None and nbytes >= GREP_MIN_BYTES else "python"


def _line_text(raw: bytes) -> str:
    return raw.decode("utf-8", "replace").replace("\x00", "")


def _scan_with_python(
    t: _Target,
    offset: int,
    st: _FileState,
    ctx: _RunCtx,
    src: str,
    scanner: "_LogScanner",
    stage: _Stage,
    on_bytes: Callable[[int], None] | None,
    use_grep: bool,
    sacct_text: list[str],
) -> tuple[int, bool]:
    """Every file kind without the compiled scanner: read blocks of complete lines; metrics lines are parsed
    here, sacct text is collected, and log candidate lines come from grep (a second process) or from
    in-process substring scans."""
    grep = _grep_start(t.path, offset, os.path.join(stage.dir, "grep.out")) if use_grep else None
    first_line = st.lines
    gen = _chunks(t.path, offset, st, on_bytes, need_text=not use_grep)
    try:
        while True:
            try:
                first, text = next(gen)
            except StopIteration as e:
                end_offset, partial = e.value
                break
            if t.kind == "metrics":
                _metrics_rows(text, first, st, ctx, stage, src)
            elif t.kind == "sacct":
                sacct_text.append(text)
            elif not use_grep:
                for ln, line in _python_candidates(text, first):
                    scanner.line(ln, line)
    except BaseException:
        if grep is not None:
            grep[0].kill()
            grep[0].wait()
            grep[1].close()
            grep[2].close()
        raise
    if grep is not None:
        cand = _grep_lines(*grep, os.path.join(stage.dir, "grep.out"), first_line, st.lines - first_line)
        for ln, line in cand:
            scanner.line(ln, line)
    return end_offset, partial


def _scan_with_ext(
    con,
    path: Path,
    offset: int,
    size: int,
    st: _FileState,
    scanner: "_LogScanner",
    stage: _Stage,
    on_bytes: Callable[[int], None] | None,
) -> tuple[int, bool]:
    """The compiled path: map the file a segment at a time and let _logscan walk its lines; it hands back
    only the lines Python must see (events, tracebacks, iteration lines outside its strict syntax).
    Returns (offset after the last complete line, whether a partial last line was left)."""
    cs = _logscan.Scanner(
        tuple(x.encode() for x in logparse.ALL_TRIGGERS),
        tuple(
            (k.encode(), logparse.FAST_COLUMNS.index(c), c in logparse._INT_COLUMNS)
            for k, c in logparse._COLUMN_OF.items()
        ),
        scanner.want_iters,
        scanner.base_attempt,
        SIMD,
    )

    def to_c() -> None:
        cs.lines, cs.bad, cs.undecodable = st.lines, st.bad, st.undecodable
        cs.last_iter = -1 if st.last_iter is None else st.last_iter
        cs.restarts, cs.last_time = st.restarts, st.last_time

    def from_c() -> None:
        st.lines, st.bad, st.undecodable = cs.lines, cs.bad, cs.undecodable
        st.last_iter = None if cs.last_iter < 0 else cs.last_iter
        st.restarts, st.last_time = cs.restarts, cs.last_time

    to_c()
    pos, partial = offset, False
    gran = mmap.ALLOCATIONGRANULARITY
    populate = getattr(mmap, "MAP_POPULATE", 0)  # fault the pages in at map time (one kernel call)
    with open(path, "rb") as f:
        while pos < size:
            base = pos - pos % gran
            length = min(SEGMENT, size - base)
            with mmap.mmap(f.fileno(), length, flags=mmap.MAP_SHARED | populate, prot=mmap.PROT_READ,
                           offset=base) as mm:
                rel = pos - base
                cut = mm.rfind(b"\n", rel)
                if cut < 0:
                    if base + length < size:  # no newline in a whole segment: binary garbage up to the next
                        pos = _skip_garbage(f, base + length, size, st, cs)
                        continue
                    partial = True  # the last line is not finished (the file may still be growing)
                    break
                end = cut + 1
                p = rel
                fresh = True  # offsets restart in each mapped segment
                while True:
                    hit = cs.scan(mm, p, end, scanner.fast(), fresh)
                    fresh = False
                    if hit is None:
                        break
                    ls, le, line_no = hit
                    from_c()
                    scanner.line(line_no, _line_text(mm[ls:le]))
                    to_c()
                    p = le + 1
            if on_bytes:
                on_bytes(end - rel)
            pos = base + end
            if cs.rows >= ROW_BATCH:  # stored while the next segments are scanned
                stage.c_batch(con, cs.take())
    if cs.rows:
        stage.c_batch(con, cs.take())
    from_c()
    return pos, partial


def _skip_garbage(f, start: int, size: int, st: _FileState, cs) -> int:
    """A "line" longer than a segment: counted as one bad line and skipped up to its newline."""
    cs.bad += 1
    cs.lines += 1
    f.seek(start)
    pos = start
    while True:
        buf = f.read(CHUNK)
        if not buf:
            cs.lines -= 1  # ran into the end of the file: consumed, but not a complete line
            return size
        k = buf.find(b"\n")
        if k >= 0:
            return pos + k + 1
        pos += len(buf)


def _sacct_rows(con, text: str, ctx: _RunCtx | None, src: str, st: _FileState, stage: _Stage) -> None:
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


def _ingest_one(
    con,
    t: _Target,
    ctx: _RunCtx | None,
    stats: IngestStats,
    force: bool,
    on_bytes: Callable[[int], None] | None,
) -> None:
    src = str(t.path.resolve())
    stt = t.path.stat()
    size, mtime = stt.st_size, stt.st_mtime
    head = _head_sha(t.path)
    row = con.execute(
        """SELECT size, mtime, "offset", head_sha, lines, bad_lines, undecodable_lines, state, truncated
                         FROM ingested_files WHERE path = ?""",
        [src],
    ).fetchone()
    st = _FileState()
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
            st = _FileState(
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
    stage = _Stage()
    try:
        if ctx is None:
            raise IngestError(f"{src}: no run for this file")
        pinfo = logparse.path_info(src)
        job = pinfo.job_id or t.path.stem
        scanner = _LogScanner(st, ctx, job, pinfo, stage, src, want_iters=not ctx.has_metrics)
        mode = _scan_mode(t, size - offset)
        sacct_text: list[str] = []
        from .store import transaction

        # One transaction per file (its rows + its ingested_files row), open while scanning: the C path
        # stores each segment's rows while it scans the next.
        with transaction(con):
            if mode == "c":
                try:
                    end_offset, partial = _scan_with_ext(con, t.path, offset, size, st, scanner, stage, on_bytes)
                except BaseException:
                    stage.drain()  # a batch still being stored must finish before the rollback uses `con`
                    raise
            else:
                end_offset, partial = _scan_with_python(
                    t, offset, st, ctx, src, scanner, stage, on_bytes, mode == "grep", sacct_text
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
            con.execute(
                """INSERT OR REPLACE INTO ingested_files (path, run_id, size, mtime, lines, bad_lines,
                     undecodable_lines, ingested_at, kind, "offset", head_sha, truncated, state)
                   VALUES (?, ?, ?, ?, ?, ?, ?, now(), ?, ?, ?, ?, ?)""",
                [
                    src,
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
                ],
            )
        stats.iterations += n_it
        stats.events += n_ev
        stats.lines += st.lines - before[0]
        stats.bad_lines += st.bad - before[1]
        stats.undecodable += st.undecodable - before[2]
    finally:
        stage.close()


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
    targets = discover([Path(p) for p in paths])
    from .store import transaction

    with transaction(con):
        ctx = _register_runs(con, targets, log_run, stats)
    total = sum(t.path.stat().st_size for t in targets)
    done = 0

    def on_bytes(n: int) -> None:
        nonlocal done
        done += n
        if progress:
            progress(cur, done, total)

    for t in targets:
        cur = t.path.name
        c = ctx.get(t.run_dir) if t.run_dir is not None else ctx.get(str(t.path.resolve()))
        try:
            _ingest_one(con, t, c, stats, force, on_bytes)
        except IngestError as e:
            stats.problems.append(str(e))
        except OSError as e:
            stats.problems.append(f"{t.path}: {e.strerror or e}")
    return stats

"""Rows on their way into the store: the staging column maps, the Stage that collects a file's rows, and
the merge that adds them to `iterations` keeping (run_id, job_id, iteration) unique."""

from __future__ import annotations

import contextlib
import csv
import math
import os
import shutil
import tempfile
from contextlib import contextmanager

from mimo_jobs.contract.iteration import PHASE_COLUMNS, VALUE_COLUMNS

from .discover import IngestError

ITER_TYPES = {
    "run_id": "VARCHAR",
    "job_id": "VARCHAR",
    "iteration": "INTEGER",
    "time": "TIMESTAMP",
    **VALUE_COLUMNS,
    "phases": "VARCHAR",
    "extras": "VARCHAR",
    "source": "VARCHAR",
    "attempt": "INTEGER",
    "train_iters": "INTEGER",
    "source_file": "VARCHAR",
    "seq": "BIGINT",
}
# phase times as numbers next to the JSON (the report averages them over millions of rows)
PHASE_COLS = list(PHASE_COLUMNS)
ITER_TYPES = (
    {k: v for k, v in ITER_TYPES.items() if k != "seq"}
    | dict.fromkeys(PHASE_COLS, "DOUBLE")
    | {"seq": "BIGINT"}
)
ITER_COLS = [c for c in ITER_TYPES if c != "seq"]  # the iterations table's columns, in staging order
_ITERATION = ITER_COLS.index("iteration")
# Megatron log lines stage only what varies per line; run/job/file are constants added by the load query.
LOG_ITER_TYPES = {
    c: ITER_TYPES[c]
    for c in (
        "iteration",
        "time",
        "elapsed_ms",
        "loss",
        "lr",
        "grad_norm",
        "consumed_samples",
        "gbs",
        "loss_scale",
        "skipped",
        "nan",
        "tflops_per_gpu",
        "moe_aux_loss",
        "extras",
        "attempt",
        "train_iters",
        "seq",
    )
}
_LOG_ITER_SELECT = (
    "SELECT ? AS run_id, ? AS job_id, iteration, time, elapsed_ms, loss, lr, grad_norm, consumed_samples, gbs, "
    "loss_scale, skipped, nan, CASE WHEN gbs <> 0 AND elapsed_ms > 0 THEN gbs / (elapsed_ms / 1000.0) END "
    "AS samples_per_s, NULL::DOUBLE AS tokens_per_s, NULL::DOUBLE AS tokens_per_s_per_gpu, tflops_per_gpu, "
    "moe_aux_loss, NULL::BIGINT AS tokens, NULL::BIGINT AS carried_tokens, NULL::BIGINT AS image_tokens, "
    "NULL::VARCHAR AS phases, extras, 'megatron-log' AS source, attempt, train_iters, "
    "? AS source_file, " + ", ".join(f"NULL::DOUBLE AS {c}" for c in PHASE_COLS) + ", seq FROM {src}"
)
# The range of the store's integer types. Parsers give Python ints of any size; what does not fit a column is
# no value at all (the rest of its line is kept), and a row whose key does not fit is not stored. This is the
# one check between the parsers and the store: a value it lets through always converts.
INT_RANGE = {"INTEGER": 2**31 - 1, "BIGINT": 2**63 - 1}


def storable_int(value, sql_type: str) -> int | None:
    """`value` as a whole number that fits `sql_type` (INTEGER, BIGINT), else None (a bool is no number)."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        return None
    lim = INT_RANGE[sql_type]
    return value if -lim <= value <= lim else None


def _storable(value, sql_type: str):
    """A value of any parser as what its column takes, or None."""
    if sql_type in INT_RANGE:
        return storable_int(value, sql_type)
    if sql_type == "DOUBLE":
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return float(value) if ok else None  # NaN and infinity are values (a diverged loss)
    return value


def measured_time(value) -> bool:
    """Whether an iteration's elapsed time (a number, or its text) is one: finite and above zero. Anything
    else is a garbled line (a clock cannot measure zero, a negative or an infinite time)."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        return False
    return math.isfinite(x) and x > 0


class StagingError(IngestError):
    """Rows of a file that the store would not take (a value of the wrong type): the file is left out, the
    store is unchanged. A safety net behind the range check: it names the value, never a damaged store."""


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


def merge(
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
    for k in (
        "elapsed_ms",
        "loss",
        "lr",
        "grad_norm",
        "consumed_samples",
        "gbs",
        "loss_scale",
        "skipped",
        "nan",
        "tflops_per_gpu",
        "moe_aux_loss",
    ):
        out[k] = np.frombuffer(cols[k], np.float64)
    out["extras_id"] = np.frombuffer(cols["extras_id"], np.int32)
    out["attempt"] = np.frombuffer(cols["attempt"], np.int32)
    out["train_iters"] = np.frombuffer(cols["train_iters"], np.int32)
    out["seq"] = np.frombuffer(cols["seq"], np.int64)
    return out


class Stage:
    """Rows written to temp CSV files as they are parsed (memory stays flat on huge logs), then loaded
    with one bulk `INSERT ... SELECT FROM read_csv` each: far faster than executemany. Log iteration rows
    parsed by the C scanner arrive as numpy columns instead (no text round trip at all)."""

    def __init__(self) -> None:
        # the temp dir and each CSV file are made when first needed: most files of a study (per-rank logs)
        # stage no CSV row at all, and making them cost ~0.5 ms per file
        self._dir: str | None = None
        self._files: dict[str, object] = {}  # name -> open file
        self._writers: dict[str, object] = {}
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
        self._replaced: list[int] = []  # lines whose stored events this file's rows replace

    @property
    def dir(self) -> str:
        if self._dir is None:
            self._dir = tempfile.mkdtemp(prefix="mimo-ingest-")
        return self._dir

    def _writer(self, name: str):
        w = self._writers.get(name)
        if w is None:
            f = self._files[name] = open(os.path.join(self.dir, name), "w", newline="")
            w = self._writers[name] = csv.writer(f)
        return w

    def iteration(self, row: list) -> bool:
        """A row of ITER_COLS (values from a JSON record: any type). False, and nothing staged, when its
        iteration does not fit the store; any other value that does not fit its column is staged empty."""
        row = [_storable(v, ITER_TYPES[c]) for v, c in zip(row, ITER_COLS, strict=True)]
        if row[_ITERATION] is None:
            return False
        self.n_it += 1
        self._writer("it.csv").writerow(row + [self.n_it])
        return True

    def log_iteration(self, row: list, seq: int) -> bool:
        """A Megatron log iteration: LOG_ITER_TYPES columns without seq (the line number: later lines win).
        Its integer columns come range-checked (iterline) but for the head's iteration and total and the
        attempt: False, and nothing staged, when the iteration does not fit the store."""
        it = row[0] = storable_int(row[0], "INTEGER")
        if it is None:
            return False
        row[-1] = storable_int(row[-1], "INTEGER")  # train_iters
        row[-2] = storable_int(row[-2], "INTEGER")  # attempt
        self.n_it += 1
        self.n_lit += 1
        row.append(seq)
        self._writer("lit.csv").writerow(row)
        return True

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
        run_id, job, _ = self.log_const
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
            merge(con, sel, [run_id, job, src, extras], dedupe=dupes, keys=[(run_id, job)], fresh=fresh)
        except BaseException:
            # the failed write aborted the transaction, so unregistering fails too: the write's error (a
            # full disk, the file-size limit) is the one to report
            with contextlib.suppress(Exception):
                con.unregister("_c_rows")
            raise
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
            with _refused_rows():
                pending.result()

    def replace_events(self, line_nos: list[int]) -> None:
        """The events stored at these lines of the file (for blocks then still open) go at load."""
        self._replaced += line_nos

    def event(self, row: list) -> None:
        """A row of EVENT_COLS; a rank or node the store cannot hold is dropped (the event is kept)."""
        row[2] = storable_int(row[2], "INTEGER")
        row[3] = storable_int(row[3], "INTEGER")
        key = (row[-1], row[5])
        if key in self._ev_keys:
            return
        self._ev_keys.add(key)
        self.n_ev += 1
        self._writer("ev.csv").writerow(row)

    def _read(self, name: str, types: dict) -> str:
        cols = ", ".join(f"'{k}': '{v}'" for k, v in types.items())
        path = os.path.join(self.dir, name).replace("'", "''")
        return (
            f"read_csv('{path}', header=false, columns={{{cols}}}, quote='\"', escape='\"', "
            f"nullstr='', auto_detect=false, delim=',', strict_mode=false)"
        )

    def load(self, con) -> tuple[int, int]:
        for f in self._files.values():
            f.close()
        self.wait()
        with _refused_rows():
            return self._load(con)

    def _load(self, con) -> tuple[int, int]:
        if self._replaced:
            con.execute(
                "DELETE FROM events WHERE source_file = ? AND line_no IN (SELECT unnest(?::BIGINT[]))",
                [self.log_const[2], self._replaced],
            )
        if self.n_it > self.n_lit + self.n_c:
            merge(con, f"SELECT * FROM {self._read('it.csv', ITER_TYPES)}", [], dedupe=True)
        if self.n_lit:  # iteration lines parsed in Python (outside the C scanner's strict syntax)
            sel = _LOG_ITER_SELECT.replace("{src}", self._read("lit.csv", LOG_ITER_TYPES))
            run_id, job, src = self.log_const
            merge(con, sel, [run_id, job, src], dedupe=True, keys=[(run_id, job)])
        if self.n_ev:
            con.execute(f"""INSERT INTO events ({", ".join(EVENT_COLS)})
                            SELECT * FROM {self._read("ev.csv", EVENT_TYPES)} ON CONFLICT DO NOTHING""")
        return self.n_it, self.n_ev

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        for f in self._files.values():
            if not f.closed:
                f.close()
        if self._dir is not None:  # its CSV files
            shutil.rmtree(self._dir, ignore_errors=True)


@contextmanager
def _refused_rows():
    """DuckDB refusing a staged value (a conversion or CSV error) becomes a StagingError: it is about this
    file's rows, not the store (whose own failures keep their meaning)."""
    try:
        yield
    except Exception as e:
        if type(e).__name__ not in ("ConversionException", "InvalidInputException"):
            raise
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        raise StagingError(f"rows the store would not take ({first}); this file was left out") from None

"""The DuckDB store's connection: one embedded file (default ./mimo-jobs.duckdb; --db or MIMO_JOBS_DB).

Opening a file to write creates or migrates it (`schema.ensure`); opening it to read never writes it: a store
of an older schema is read through `schema.present_older`. Writers live with their data: `catalog` writes
studies and runs, `submit.jobs_table` jobs, `ingest` iterations, events and ingested_files. Every write that
touches more than one row runs in one `transaction` (tx.py), so a failure leaves nothing half-written.
"""

from __future__ import annotations

import itertools
import os
import sys
import time
from pathlib import Path

from mimo_jobs.errors import MimoJobsError

from . import schema
from .errors import NoStore, NotAStore, StoreCorrupt, StoreError, StoreLocked, explain, is_lock, lock_holder
from .tx import transaction

__all__ = ["NoStore", "StoreError", "StoreLocked", "connect", "db_path", "transaction"]


DEFAULT_DB = "mimo-jobs.duckdb"


def db_path(db: str | os.PathLike | None = None) -> Path:
    return Path(db or os.environ.get("MIMO_JOBS_DB") or DEFAULT_DB)


# Rows per row group of what a writer adds (DuckDB's default is 122,880). Ingest stores a big log's rows one
# row group at a time while it scans; the last, partial group is compressed after the scan, so smaller groups
# leave less of that work for the end (122,880 -> 32,768: -0.08 s on a 1 GiB log; 16,384 and 65,536 were
# slower). Not a file property: every writer opens the file with it.
ROW_GROUP = 32768


# How long a command waits for another process's write lock before giving up. Ingest and report wait
# longer (`LONG_WAIT_S`): a second ingest then simply runs after the first.
WAIT_S = 60.0
LONG_WAIT_S = 600.0


def connect(db: str | os.PathLike | None = None, read_only: bool = False, wait_s: float = WAIT_S):
    """Open (and create/migrate) the store. DuckDB allows one writing process per file: a second writer
    waits up to `wait_s` for the lock (saying so once on stderr) instead of failing, so two ingests at once
    serialize cleanly. Anything else wrong with the file (not a store, damaged, read-only, written by a
    newer mimo-jobs) is a StoreError at once."""
    path = db_path(db)
    _check_path(path, read_only)
    con = _open_waiting(path, read_only, lock_wait_s(wait_s))
    try:
        _check_schema(con, path, read_only)
    except BaseException:
        con.close()
        raise
    return con


def lock_wait_s(default: float) -> float:
    """MIMO_JOBS_LOCK_WAIT_S overrides how long any command waits for a lock (0: fail at once)."""
    raw = os.environ.get("MIMO_JOBS_LOCK_WAIT_S")
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 86400:
        raise MimoJobsError(f"MIMO_JOBS_LOCK_WAIT_S={raw!r}: give seconds between 0 and 86400", "environment")
    return value


def _check_path(path: Path, read_only: bool) -> None:
    if read_only and not path.exists():
        raise NoStore(f"no store at {path} (run `mimo-jobs submit` or `ingest` first, or pass --db)")
    if path.exists() and not path.is_file():
        what = "a directory" if path.is_dir() else "not a regular file"
        raise NotAStore(f"this is {what}, not a store file; pass --db with a file path", str(path))
    if not read_only:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise explain(e, path) from None


def _open_waiting(path: Path, read_only: bool, wait_s: float):
    import duckdb

    deadline = time.monotonic() + wait_s
    said = False
    for i in itertools.count():
        try:
            return _open(duckdb, path, read_only)
        except (duckdb.Error, OSError) as e:
            if not is_lock(e) or time.monotonic() >= deadline:
                raise _final(e, path, wait_s) from None
            if not said:
                _say_waiting(path, lock_holder(e), wait_s)
                said = True
            time.sleep(min(0.05 * (i + 1), 1.0, max(deadline - time.monotonic(), 0.01)))
    raise AssertionError("unreachable")


def _final(e: BaseException, path: Path, wait_s: float) -> StoreError:
    err = explain(e, path)
    if isinstance(err, StoreLocked):
        return StoreLocked(
            f"{err} and stayed locked for {wait_s:.0f} s; try again when it has finished", err.where
        )
    return err


def _say_waiting(path: Path, holder: str | None, wait_s: float) -> None:
    who = f"PID {holder}" if holder and holder.isdigit() else "another process"
    print(
        f"waiting for the store {path}: {who} holds its lock (up to {wait_s:.0f} s) ...",
        file=sys.stderr,
        flush=True,
    )


def _check_schema(con, path: Path, read_only: bool) -> None:
    """Refuse another application's database and a store from a newer mimo-jobs; bring a writable older
    store up to date, and show a read-only one in the current schema without writing it."""
    import duckdb

    try:
        foreign = schema.foreign_tables(con)
        if foreign:
            shown = ", ".join(foreign[:5]) + (", ..." if len(foreign) > 5 else "")
            raise NotAStore(
                f"this is not a mimo-jobs store (a DuckDB database of other tables: {shown}); it was left "
                "as it is: pass --db with a store path",
                str(path),
            )
        schema.refuse_newer(con, str(path))
        if not read_only:
            schema.ensure(con)
        elif schema.version_of(con) != schema.SCHEMA_VERSION:
            con.execute(f"USE {_SCRATCH}")
            schema.present_older(con, _STORE)
    except duckdb.Error as e:
        raise explain(e, path) from None
    except schema.BadVersion as e:
        raise StoreCorrupt(str(e), str(path)) from None


# The store file is attached under _STORE to an in-memory database (_SCRATCH: DuckDB's name for it), which
# holds the views of an older store opened to read.
_STORE = "store"
_SCRATCH = "memory"


def _open(duckdb, path: Path, read_only: bool):
    """A connection to the store file, attached read-only to read, and with this toolkit's row-group size
    to write."""
    con = duckdb.connect(":memory:")
    try:
        quoted = str(path).replace("'", "''")
        how = "READ_ONLY" if read_only else f"ROW_GROUP_SIZE {ROW_GROUP}"
        con.execute(f"ATTACH '{quoted}' AS {_STORE} ({how})")
        con.execute(f"USE {_STORE}")
    except BaseException:
        con.close()
        raise
    return con

"""The DuckDB store's connection: one embedded file (default ./mimo-jobs.duckdb; --db or MIMO_JOBS_DB).

Opening a file creates or migrates it (`schema`). Writers live with their data: `catalog` writes studies
and runs, `submit.jobs_table` jobs, `ingest` iterations, events and ingested_files. Every write that touches
more than one row runs in one transaction, so a failure leaves nothing half-written.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from mimo_jobs.errors import MimoJobsError

from . import schema


class NoStore(MimoJobsError, FileNotFoundError):
    """A command that only reads found no store file."""


class StoreLocked(MimoJobsError, RuntimeError):
    """Another process kept the store's write lock for longer than this one waited."""


DEFAULT_DB = "mimo-jobs.duckdb"


def db_path(db: str | os.PathLike | None = None) -> Path:
    return Path(db or os.environ.get("MIMO_JOBS_DB") or DEFAULT_DB)


# Rows per row group of what a writer adds (DuckDB's default is 122,880). Ingest stores a big log's rows one
# row group at a time while it scans; the last, partial group is compressed after the scan, so smaller groups
# leave less of that work for the end (122,880 -> 32,768: -0.08 s on a 1 GiB log; 16,384 and 65,536 were
# slower). Not a file property: every writer opens the file with it.
ROW_GROUP = 32768


def connect(db: str | os.PathLike | None = None, read_only: bool = False, retries: int = 50):
    """Open (and create/migrate) the store. DuckDB allows one writing process per file: a second writer
    waits for the lock (retries) instead of failing, so two ingests at once serialize cleanly."""
    import duckdb

    path = db_path(db)
    if read_only and not path.exists():
        raise NoStore(f"no store at {path} (run `mimo-jobs submit` or `ingest` first, or pass --db)")
    if not read_only:
        path.parent.mkdir(parents=True, exist_ok=True)
    last = None
    for i in range(retries):
        try:
            con = _open(duckdb, path, read_only)
            break
        except duckdb.IOException as e:  # lock held by another process
            last = e
            time.sleep(min(0.05 * (i + 1), 1.0))
    else:
        raise StoreLocked(f"store {path} is locked by another mimo-jobs process: {last}")
    if not read_only:
        schema.ensure(con)
    return con


def _open(duckdb, path: Path, read_only: bool):
    """A connection to the store file; a writer's is attached with this toolkit's row-group size."""
    if read_only:
        return duckdb.connect(str(path), read_only=True)
    con = duckdb.connect(":memory:")
    try:
        quoted = str(path).replace("'", "''")
        con.execute(f"ATTACH '{quoted}' AS store (ROW_GROUP_SIZE {ROW_GROUP})")
        con.execute("USE store")
    except BaseException:
        con.close()
        raise
    return con


@contextmanager
def transaction(con) -> Iterator:
    con.execute("BEGIN TRANSACTION")
    try:
        yield con
    except BaseException:
        con.execute("ROLLBACK")
        raise
    else:
        con.execute("COMMIT")

"""The DuckDB store: one embedded file (default ./mimo-jobs.duckdb; --db or MIMO_JOBS_DB).

This module owns the schema and the connection only. Writers live with their data: `launch`/`jobs` write
studies, runs and jobs; `ingest` writes iterations, events and ingested_files. Every write that touches
more than one row runs in one transaction, so a failure leaves nothing half-written.
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

DEFAULT_DB = "mimo-jobs.duckdb"
SCHEMA_VERSION = 2  # 2: iterations without a primary key (ingest keeps the key unique itself)

SCHEMA = [
    """CREATE TABLE IF NOT EXISTS meta (key VARCHAR PRIMARY KEY, value VARCHAR)""",
    """CREATE TABLE IF NOT EXISTS studies (
        name VARCHAR PRIMARY KEY,
        description VARCHAR,
        scaling VARCHAR,              -- strong | weak
        baseline_nodes INTEGER,
        source_path VARCHAR,
        spec_json JSON,               -- the resolved study
        created_at TIMESTAMP,
        updated_at TIMESTAMP)""",
    """CREATE TABLE IF NOT EXISTS runs (
        run_id VARCHAR PRIMARY KEY,   -- hash of the resolved run config
        study VARCHAR NOT NULL,
        name VARCHAR NOT NULL,        -- readable, e.g. 33n-e1x8-l2x8x128-g768
        idx INTEGER,
        repeat INTEGER,
        nodes INTEGER, gpus_per_node INTEGER, world INTEGER,
        enc_tp INTEGER, enc_pp INTEGER, enc_dp INTEGER,
        llm_tp INTEGER, llm_pp INTEGER, llm_ep INTEGER, llm_etp INTEGER, llm_dp INTEGER,
        gbs INTEGER, mbs INTEGER, seq_length INTEGER, model VARCHAR,
        accelerator VARCHAR,
        run_dir VARCHAR,
        spec_json JSON,               -- RunSpec.to_dict()
        script_sha256 VARCHAR,        -- hash of the rendered sbatch.sh (or launch.sh for local)
        pkg_version VARCHAR, git_sha VARCHAR,
        created_at TIMESTAMP)""",
    """CREATE TABLE IF NOT EXISTS jobs (
        run_id VARCHAR NOT NULL,
        job_id VARCHAR NOT NULL,      -- scheduler id (SLURM job id, or local-<n>)
        executor VARCHAR,             -- slurm | local
        attempt INTEGER,              -- 0 for the first submission; requeues/retries count up
        state VARCHAR,                -- PENDING RUNNING COMPLETED FAILED CANCELLED TIMEOUT PREEMPTED NODE_FAIL ...
        reason VARCHAR,               -- why it ended (sacct reason, first error from the log)
        exit_code INTEGER,
        submit_time TIMESTAMP, start_time TIMESTAMP, end_time TIMESTAMP,
        node_list VARCHAR,
        script_sha256 VARCHAR,
        updated_at TIMESTAMP,
        PRIMARY KEY (run_id, job_id))""",
    """CREATE TABLE IF NOT EXISTS iterations (
        run_id VARCHAR NOT NULL,
        job_id VARCHAR NOT NULL,
        iteration INTEGER NOT NULL,
        time TIMESTAMP,
        elapsed_ms DOUBLE,
        loss DOUBLE,
        lr DOUBLE,
        grad_norm DOUBLE,
        consumed_samples BIGINT,
        gbs INTEGER,
        loss_scale DOUBLE,
        skipped INTEGER, nan INTEGER,
        samples_per_s DOUBLE,
        tokens_per_s DOUBLE,
        tokens_per_s_per_gpu DOUBLE,
        tflops_per_gpu DOUBLE,
        moe_aux_loss DOUBLE,
        phases JSON,
        extras JSON,
        source VARCHAR,               -- jsonl | megatron-log
        attempt INTEGER,              -- restart count that wrote the row (a later attempt replaces it)
        train_iters INTEGER,
        superseded BOOLEAN DEFAULT false,  -- a later job of the same run re-ran this iteration
        source_file VARCHAR,
        -- records.PHASES as numbers (also in `phases`): the report averages millions of rows, and
        -- numeric columns are ~50x cheaper to aggregate than JSON
        enc_fwd_ms DOUBLE, enc_bwd_ms DOUBLE, bridge_wait_ms DOUBLE, llm_fwd_ms DOUBLE, llm_bwd_ms DOUBLE,
        optimizer_ms DOUBLE, data_ms DOUBLE)
        -- unique per (run_id, job_id, iteration), kept so by ingest's merge: a primary-key index cost
        -- more than all the rest of a big-log ingest""",
    """CREATE TABLE IF NOT EXISTS events (
        run_id VARCHAR,
        job_id VARCHAR,
        rank INTEGER,
        node INTEGER,                 -- when only the node is known (srun label of a per-node torchrun)
        time TIMESTAMP,
        kind VARCHAR,                 -- traceback nccl_timeout gloo_timeout oom time_limit preemption requeue
                                      -- node_fail checkpoint_saved checkpoint_loaded peer_lost cancelled
                                      -- child_failed task_exit segfault start end (see logparse.py)
        message VARCHAR,
        source_file VARCHAR NOT NULL,
        line_no BIGINT NOT NULL,
        PRIMARY KEY (source_file, line_no, kind))""",
    """CREATE TABLE IF NOT EXISTS ingested_files (
        path VARCHAR PRIMARY KEY,
        run_id VARCHAR,
        size BIGINT, mtime DOUBLE,
        lines BIGINT, bad_lines BIGINT, undecodable_lines BIGINT,
        ingested_at TIMESTAMP,
        kind VARCHAR,                 -- metrics | log | sacct
        "offset" BIGINT,              -- bytes consumed (end of the last complete line): appends resume here
        head_sha VARCHAR,             -- hash of the first bytes: a rewritten file is re-read from 0
        truncated BOOLEAN,            -- last line had no newline (left for the next ingest)
        state JSON)                   -- parser carry-over between appends (last iteration, restarts, time)
        """,
]


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
        raise FileNotFoundError(f"no store at {path} (run `mimo-jobs submit` or `ingest` first, or pass --db)")
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
        raise RuntimeError(f"store {path} is locked by another mimo-jobs process: {last}")
    if not read_only:
        try:
            v = con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchall()
        except duckdb.CatalogException:  # a new file
            v = []
        if not v or int(v[0][0]) != SCHEMA_VERSION:  # a store of this schema is left alone (no DDL per connect)
            for stmt in SCHEMA:
                con.execute(stmt)
            if v and int(v[0][0]) < 2:  # only stores made by schema 1 need the copy (a fresh one has no key)
                _migrate(con)
            con.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", [str(SCHEMA_VERSION)])
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


def _migrate(con) -> None:
    """Schema 1 -> 2: drop the iterations primary key (DuckDB cannot drop a constraint: copy the table)."""
    pk = con.execute("""SELECT count(*) FROM duckdb_constraints()
                         WHERE table_name = 'iterations' AND constraint_type = 'PRIMARY KEY'""").fetchone()[0]
    if not pk:
        return
    ddl = next(s for s in SCHEMA if "TABLE IF NOT EXISTS iterations" in s)
    with transaction(con):
        con.execute("ALTER TABLE iterations RENAME TO iterations_v1")
        con.execute(ddl)
        con.execute("INSERT INTO iterations BY NAME SELECT * FROM iterations_v1")
        con.execute("DROP TABLE iterations_v1")


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

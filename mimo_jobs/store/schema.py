"""The store's schema: every table's DDL and every migration, in one place.

`ensure(con)` brings a writable store to SCHEMA_VERSION: a new file gets every table; an older one gets what
its version lacks; a store already at this version gets no DDL at all (connecting stays cheap). Migration is
the write path's only: `present_older` shows a store of an older schema to a reader as the current schema
(views over the stored tables) without writing a byte, so a read-only copy can always be reported.
"""

from __future__ import annotations

from mimo_jobs.contract.iteration import PHASE_COLUMNS, VALUE_COLUMNS
from mimo_jobs.contract.memory import TIMING_COLUMNS
from mimo_jobs.contract.modules import study_name

from .tx import transaction

# 2: iterations without a primary key (ingest keeps the key unique itself)
# 3: jobs.action, next_job_id, first_error, log_path (what the submit policy decided for an ended job)
# 4: runs.colocated (a baseline layout: every rank runs both modules), meta.written_by
# 5: rank_memory (what each rank measured it holds: trainer/memory.py), iterations.pipeline_wait_ms
# 6: iterations.tokens, carried_tokens, image_tokens (the global batch's token counts)
# 7: rank_memory.role, timed_iterations, elapsed_s, <phase>_s (each rank's own phase timers)
# 8: run_modules (each encoder module of a run by its name; runs.enc_* hold a run of one encoder only)
# 9: runs.named_at (when a submit last named the run, from its run directory: the order of attempts);
#    rank_memory.module by the study's module names (vision, audio, llm: contract/modules.py), not the
#    trainer's (encoder, encoder.audio, language); rank_memory.module_saved_activation_peak_bytes
SCHEMA_VERSION = 9

# the iterations table's measured values and phase times: the contract owns their names and types
_VALUES = ",\n        ".join(f"{c} {sql}" for c, sql in VALUE_COLUMNS.items())
_PHASES = ", ".join(f"{c} DOUBLE" for c in PHASE_COLUMNS)
# rank_memory's timing fields: the contract owns their names and types
_TIMING = ", ".join(f"{c} {sql}" for c, sql in TIMING_COLUMNS.items())

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
        enc_tp INTEGER, enc_pp INTEGER, enc_dp INTEGER,  -- the one encoder (NULL for several: run_modules)
        llm_tp INTEGER, llm_pp INTEGER, llm_ep INTEGER, llm_etp INTEGER, llm_dp INTEGER,
        gbs INTEGER, mbs INTEGER, seq_length INTEGER, model VARCHAR,
        accelerator VARCHAR,
        run_dir VARCHAR,
        spec_json JSON,               -- RunSpec.to_dict()
        script_sha256 VARCHAR,        -- hash of the rendered sbatch.sh (or launch.sh for local)
        pkg_version VARCHAR, git_sha VARCHAR,
        created_at TIMESTAMP,
        colocated BOOLEAN DEFAULT false,  -- every rank runs the encoder and the LLM (no bridge)
        named_at TIMESTAMP)           -- when a submit last named it (its run dir's submissions.jsonl)""",
    """CREATE TABLE IF NOT EXISTS run_modules (
        run_id VARCHAR NOT NULL,
        module VARCHAR NOT NULL,      -- its name in the study: vision (what `encoder:` is), audio, ...
        position INTEGER,             -- rank order among the run's encoders (0 first)
        kind VARCHAR,                 -- the encoder's modality: image | audio (NULL: model not known)
        tp INTEGER, pp INTEGER, dp INTEGER,
        ranks INTEGER,                -- GPUs it runs on (colocated: every rank)
        rank_start INTEGER, rank_end INTEGER,  -- [start, end): encoders in order, then the LLM
        PRIMARY KEY (run_id, module))""",
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
        action VARCHAR,               -- what the policy decided when it ended: done | final | retry | requeue
        next_job_id VARCHAR,          -- the job that continued the run (retry or requeue)
        first_error VARCHAR,          -- the first error its log shows
        log_path VARCHAR,             -- its main output file
        PRIMARY KEY (run_id, job_id))""",
    """CREATE TABLE IF NOT EXISTS iterations (
        run_id VARCHAR NOT NULL,
        job_id VARCHAR NOT NULL,
        iteration INTEGER NOT NULL,
        time TIMESTAMP,
        """
    + _VALUES
    + """,
        phases JSON,
        extras JSON,
        source VARCHAR,               -- jsonl | megatron-log
        attempt INTEGER,              -- restart count that wrote the row (a later attempt replaces it)
        train_iters INTEGER,
        superseded BOOLEAN DEFAULT false,  -- a later job of the same run re-ran this iteration
        source_file VARCHAR,
        -- contract.iteration.PHASE_COLUMNS (also in `phases`)
        """
    + _PHASES
    + """)
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
                                      -- child_failed task_exit segfault start end (see ingest/events.py)
        message VARCHAR,
        source_file VARCHAR NOT NULL,
        line_no BIGINT NOT NULL,
        PRIMARY KEY (source_file, line_no, kind))""",
    """CREATE TABLE IF NOT EXISTS rank_memory (
        run_id VARCHAR NOT NULL,
        rank INTEGER NOT NULL,
        module VARCHAR NOT NULL,      -- its name in the study: vision, audio, ..., llm (a colocated rank
                                      -- has a row for each module it runs)
        tp_rank INTEGER, pp_rank INTEGER, dp_rank INTEGER,
        iteration INTEGER,            -- when it was measured (the end of the run, or a requeue stop)
        params BIGINT, param_bytes BIGINT, grad_buffer_bytes BIGINT, optimizer_state_bytes BIGINT,
        saved_activation_peak_bytes BIGINT,   -- the rank's, over every step (every module together)
        module_saved_activation_peak_bytes BIGINT,  -- this module's own (NULL: facts from before it)
        inflight_peak INTEGER,
        cuda_max_allocated_bytes BIGINT, cuda_max_reserved_bytes BIGINT,
        source_file VARCHAR, mtime DOUBLE,
        -- the rank's own (both modules' rows of a colocated rank hold the same): role encoder | llm |
        -- colocated, seconds summed over the iterations its job ran after its first (contract.memory)
        """
    + _TIMING
    + """,
        PRIMARY KEY (run_id, rank, module))""",
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

# Columns added after a table's first release: (table, column, type), added to stores that lack them.
ADDED_COLUMNS = [
    ("jobs", "action", "VARCHAR"),
    ("jobs", "next_job_id", "VARCHAR"),
    ("jobs", "first_error", "VARCHAR"),
    ("jobs", "log_path", "VARCHAR"),
    ("runs", "colocated", "BOOLEAN DEFAULT false"),
    ("runs", "named_at", "TIMESTAMP"),
    ("iterations", "pipeline_wait_ms", "DOUBLE"),
    ("iterations", "tokens", "BIGINT"),
    ("iterations", "carried_tokens", "BIGINT"),
    ("iterations", "image_tokens", "BIGINT"),
    *(("rank_memory", c, sql) for c, sql in TIMING_COLUMNS.items()),
    ("rank_memory", "module_saved_activation_peak_bytes", "BIGINT"),
]
# The version from which rank_memory names modules as the study does (older ones: the trainer's slots).
STUDY_MODULE_NAMES = 9


class BadVersion(ValueError):
    """The store's meta table holds a schema_version that is not a number."""


def version_of(con) -> int | None:
    """The schema version a store says it has (None: a new, empty file); BadVersion when it is not a number."""
    import duckdb

    try:
        v = con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchall()
    except duckdb.CatalogException:
        return None
    if not v:
        return None
    try:
        return int(v[0][0])
    except (TypeError, ValueError):
        raise BadVersion(
            f"its meta table's schema_version is {v[0][0]!r}, not a number (the file was edited by hand or by "
            "another program); it was left as it is"
        ) from None


def written_by(con) -> str | None:
    """The mimo-jobs version that last brought the store to its schema (None: stores from before 0.1)."""
    import duckdb

    try:
        v = con.execute("SELECT value FROM meta WHERE key = 'written_by'").fetchall()
    except duckdb.CatalogException:
        return None
    return v[0][0] if v else None


def refuse_newer(con, where: str) -> None:
    """A store from a newer schema is never rewritten (its new tables and columns would be lost or lie)."""
    from mimo_jobs import __version__

    from .errors import StoreTooNew

    version = version_of(con)
    if version is None or version <= SCHEMA_VERSION:
        return
    by = written_by(con)
    raise StoreTooNew(
        f"this store has schema {version}, written by mimo-jobs {by or 'a newer version'}; this is "
        f"mimo-jobs {__version__} (schema {SCHEMA_VERSION}): upgrade mimo-jobs to read or write it",
        where,
    )


def foreign_tables(con) -> list[str]:
    """The tables of a DuckDB file that is not a mimo-jobs store (no schema version, yet tables): another
    application's database, which no command may read as a store or write to. Empty for a store or a new,
    empty file."""
    if version_of(con) is not None:
        return []
    rows = con.execute(
        """SELECT table_name FROM duckdb_tables() WHERE database_name = current_database()
           UNION SELECT view_name FROM duckdb_views() WHERE database_name = current_database() AND NOT internal
           ORDER BY 1"""
    ).fetchall()
    return [r[0] for r in rows]


def present_older(con, stored: str) -> None:
    """In `con`'s own (in-memory) catalog, the current schema over the store attached read-only as
    `stored`: each stored table as a view, a column its schema lacks read as its default (NULL unless the
    DDL gives one), a table it lacks empty, rank_memory's trainer slot names (before schema 9) read as the
    study's module names. Nothing is written to the store."""
    for stmt in SCHEMA:
        con.execute(stmt)
    here = con.execute("SELECT current_database()").fetchone()[0]
    have = set(
        con.execute(
            "SELECT table_name, column_name FROM duckdb_columns() WHERE database_name = ?", [stored]
        ).fetchall()
    )
    tables = {t for t, _ in have}
    cols = con.execute(
        """SELECT table_name, column_name, data_type, column_default FROM duckdb_columns()
           WHERE database_name = ? ORDER BY table_name, column_index""",
        [here],
    ).fetchall()
    by_table: dict[str, list[str]] = {}
    for table, column, typ, default in cols:
        quoted = f'"{column}"'
        expr = quoted if (table, column) in have else f"CAST({default or 'NULL'} AS {typ}) AS {quoted}"
        by_table.setdefault(table, []).append(expr)
    slots = ("rank_memory" in tables) and _stored_version(con, stored) < STUDY_MODULE_NAMES
    for table, exprs in by_table.items():
        if table in tables:
            if table == "rank_memory" and slots:
                named = _study_names_sql(con, f'"{stored}".rank_memory')
                exprs = [f'{named} AS "module"' if e == '"module"' else e for e in exprs]
            con.execute(f"DROP TABLE {table}")
            con.execute(f'CREATE VIEW {table} AS SELECT {", ".join(exprs)} FROM "{stored}".{table}')


def _stored_version(con, stored: str) -> int:
    """The schema version of the store attached as `stored` (0: none that is a number)."""
    v = con.execute(f"SELECT value FROM \"{stored}\".meta WHERE key = 'schema_version'").fetchall()
    try:
        return int(v[0][0]) if v else 0
    except (TypeError, ValueError):
        return 0


def _slot_names(con, table: str) -> list[tuple[str, str]]:
    """(trainer slot name, the study's name) of each module name `table` holds that study_name renames."""
    names = [r[0] for r in con.execute(f"SELECT DISTINCT module FROM {table}").fetchall()]
    return [(n, study_name(n)) for n in names if study_name(n) != n]


def _study_names_sql(con, table: str) -> str:
    """`module` of an older store's rank_memory by the study's names: a CASE built from contract.modules'
    rule over the names the table holds."""

    def quote(x: str) -> str:
        return "'" + x.replace("'", "''") + "'"

    whens = " ".join(f"WHEN {quote(a)} THEN {quote(b)}" for a, b in _slot_names(con, table))
    return f'CASE "module" {whens} ELSE "module" END' if whens else '"module"'


def _rename_modules(con) -> None:
    """Schema 8 -> 9: rank_memory's trainer slot names become the study's (contract.modules.study_name)."""
    for old, new in _slot_names(con, "rank_memory"):
        con.execute("UPDATE rank_memory SET module = ? WHERE module = ?", [new, old])


def ensure(con) -> None:
    version = version_of(con)
    if version == SCHEMA_VERSION:
        return
    if version is not None and version > SCHEMA_VERSION:  # callers refuse first; never downgrade a store
        raise RuntimeError(f"store schema {version} is newer than {SCHEMA_VERSION}")
    for stmt in SCHEMA:
        con.execute(stmt)
    if version is not None and version < 2:  # only stores made by schema 1 need the copy
        _drop_iterations_key(con)
    _add_columns(con)
    if version is not None and version < 8:
        from .modules import backfill

        backfill(con)  # the one encoder of every run so far, from runs.enc_*
    if version is not None and version < STUDY_MODULE_NAMES:
        _rename_modules(con)
    if version is not None and version < STUDY_MODULE_NAMES:
        # facts files read before the timing columns (7) or each module's activation peak (9) existed may
        # hold them: the next ingest reads them again
        con.execute("UPDATE rank_memory SET mtime = NULL")
    from mimo_jobs import __version__

    con.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", [str(SCHEMA_VERSION)])
    con.execute("INSERT OR REPLACE INTO meta VALUES ('written_by', ?)", [__version__])


def _add_columns(con) -> None:
    have = set(con.execute("SELECT table_name, column_name FROM information_schema.columns").fetchall())
    for table, column, typ in ADDED_COLUMNS:
        if (table, column) not in have:
            con.execute(f"ALTER TABLE {table} ADD COLUMN {column} {typ}")


def _drop_iterations_key(con) -> None:
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

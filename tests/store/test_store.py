"""Store schema migrations: a store written by an older schema opens under the current one with its rows
intact (schema 1: iterations lose their primary key; schema 2: jobs gain the policy's columns; schema 7: each
run's one encoder, kept in runs.enc_*, becomes its row of run_modules)."""

import duckdb

from mimo_jobs.store import connection as store
from mimo_jobs.store.modules import ModuleRow, layout_text, modules_of
from mimo_jobs.store.schema import SCHEMA_VERSION

SCHEMA_1_ITERATIONS = """CREATE TABLE iterations (run_id VARCHAR NOT NULL, job_id VARCHAR NOT NULL,
    iteration INTEGER NOT NULL, elapsed_ms DOUBLE, loss DOUBLE, PRIMARY KEY (run_id, job_id, iteration))"""


def test_schema_1_store_is_migrated(tmp_path):
    db = tmp_path / "old.duckdb"
    con = duckdb.connect(str(db))
    con.execute("CREATE TABLE meta (key VARCHAR PRIMARY KEY, value VARCHAR)")
    con.execute("INSERT INTO meta VALUES ('schema_version', '1')")
    con.execute(SCHEMA_1_ITERATIONS)
    con.execute("INSERT INTO iterations VALUES ('r', '1', 1, 100.0, 5.0), ('r', '1', 2, 90.0, 4.5)")
    con.close()
    con = store.connect(db)
    pk = "SELECT count(*) FROM duckdb_constraints() WHERE table_name = 'iterations' AND constraint_type = 'PRIMARY KEY'"
    assert con.execute(pk).fetchone()[0] == 0
    rows = con.execute(
        "SELECT run_id, job_id, iteration, elapsed_ms, loss, superseded FROM iterations ORDER BY 3"
    )
    assert rows.fetchall() == [("r", "1", 1, 100.0, 5.0, False), ("r", "1", 2, 90.0, 4.5, False)]
    assert con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0] == str(
        SCHEMA_VERSION
    )
    con.close()


SCHEMA_2_JOBS = """CREATE TABLE jobs (run_id VARCHAR NOT NULL, job_id VARCHAR NOT NULL, executor VARCHAR,
    attempt INTEGER, state VARCHAR, reason VARCHAR, exit_code INTEGER, submit_time TIMESTAMP,
    start_time TIMESTAMP, end_time TIMESTAMP, node_list VARCHAR, script_sha256 VARCHAR, updated_at TIMESTAMP,
    PRIMARY KEY (run_id, job_id))"""


def test_schema_2_store_gains_the_job_policy_columns(tmp_path):
    db = tmp_path / "v2.duckdb"
    con = duckdb.connect(str(db))
    con.execute("CREATE TABLE meta (key VARCHAR PRIMARY KEY, value VARCHAR)")
    con.execute("INSERT INTO meta VALUES ('schema_version', '2')")
    con.execute(SCHEMA_2_JOBS)
    con.execute("INSERT INTO jobs (run_id, job_id, state) VALUES ('r', '7', 'COMPLETED')")
    con.close()
    con = store.connect(db)
    row = con.execute(
        "SELECT run_id, job_id, state, action, next_job_id, first_error, log_path FROM jobs"
    ).fetchall()
    assert row == [("r", "7", "COMPLETED", None, None, None, None)]
    assert con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0] == str(
        SCHEMA_VERSION
    )
    con.close()


def _schema_7_store(db) -> None:
    """A store as schema 7 wrote it: every table but run_modules, one encoder in runs.enc_*."""
    from mimo_jobs.store.schema import SCHEMA

    con = duckdb.connect(str(db))
    for stmt in SCHEMA:
        if "TABLE IF NOT EXISTS run_modules" not in stmt:
            con.execute(stmt)
    con.execute("INSERT INTO meta VALUES ('schema_version', '7')")
    cols = "run_id, study, name, idx, nodes, gpus_per_node, world, enc_tp, enc_pp, enc_dp, llm_tp, llm_dp, colocated"
    con.execute(
        f"""INSERT INTO runs ({cols}) VALUES
            ('het', 's', '33n-e1x8-l2x8x128-g768', 0, 33, 8, 264, 1, 1, 8, 2, 128, false),
            ('colo', 's', '2n-colo-l2x1x8-g256', 1, 2, 8, 16, 2, 1, 8, 2, 8, true),
            ('log', 's', 'a-log', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, false)"""
    )
    con.close()


OLD_MODULES = {
    "het": [ModuleRow("vision", 0, None, 1, 1, 8, 8, 0, 8)],
    "colo": [ModuleRow("vision", 0, None, 2, 1, 8, 16, 0, 16)],
}


def test_schema_7_store_reads_its_runs_modules_without_writing(tmp_path):
    db = tmp_path / "v7.duckdb"
    _schema_7_store(db)
    before = db.read_bytes()
    con = store.connect(db, read_only=True)
    assert modules_of(con) == OLD_MODULES  # the run known only from its logs has no encoder layout
    assert [layout_text(m) for m in modules_of(con, ["het"]).values()] == ["enc tp1 dp8"]
    con.close()
    assert db.read_bytes() == before


def test_schema_7_store_gains_the_module_table_with_its_runs_encoder(tmp_path):
    db = tmp_path / "v7.duckdb"
    _schema_7_store(db)
    con = store.connect(db)
    rows = con.execute(
        "SELECT run_id, module, position, kind, tp, pp, dp, ranks, rank_start, rank_end FROM run_modules ORDER BY 1"
    ).fetchall()
    assert rows == [
        ("colo", "vision", 0, None, 2, 1, 8, 16, 0, 16),
        ("het", "vision", 0, None, 1, 1, 8, 8, 0, 8),
    ]
    assert modules_of(con) == OLD_MODULES
    assert con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0] == str(
        SCHEMA_VERSION
    )
    con.close()

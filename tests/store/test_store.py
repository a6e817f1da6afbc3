"""Store schema migrations: a store written by an older schema opens under the current one with its rows
intact (schema 1: iterations lose their primary key; schema 2: jobs gain the policy's columns)."""

import duckdb

from mimo_jobs.store import connection as store
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

"""Store schema migration: a store written by schema 1 (iterations with a primary key) opens under schema 2
with its rows intact and without the key."""

import duckdb

from mimo_jobs.store import connection as store

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
    rows = con.execute("SELECT run_id, job_id, iteration, elapsed_ms, loss, superseded FROM iterations ORDER BY 3")
    assert rows.fetchall() == [("r", "1", 1, 100.0, 5.0, False), ("r", "1", 2, 90.0, 4.5, False)]
    assert con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0] == "2"
    con.close()

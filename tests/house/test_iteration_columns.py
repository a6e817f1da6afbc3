"""The iteration columns have one owner (contract.iteration.VALUE_COLUMNS, PHASE_COLUMNS): the record the
trainer writes, what ingest stages and the table a new store creates all follow it."""

from __future__ import annotations

import dataclasses

import duckdb

from mimo_jobs.contract.iteration import PHASE_COLUMNS, VALUE_COLUMNS, IterationRecord
from mimo_jobs.ingest import staging
from mimo_jobs.store.schema import SCHEMA


def _table_columns(name: str) -> list[str]:
    con = duckdb.connect()
    for ddl in SCHEMA:
        con.execute(ddl)
    return [r[0] for r in con.execute(f"DESCRIBE {name}").fetchall()]


def test_the_record_carries_every_value_column_under_its_name():
    fields = {f.name for f in dataclasses.fields(IterationRecord)}
    assert set(VALUE_COLUMNS) <= fields, set(VALUE_COLUMNS) - fields


def test_a_new_store_has_exactly_the_columns_ingest_stages():
    cols = _table_columns("iterations")
    assert [c for c in cols if c != "superseded"] == staging.ITER_COLS
    values = cols[cols.index("time") + 1 : cols.index("phases")]
    assert values == list(VALUE_COLUMNS)
    assert cols[-len(PHASE_COLUMNS) :] == list(PHASE_COLUMNS)

"""The one check between the parsers' numbers and the store's columns (staging), and its safety net."""

from __future__ import annotations

import duckdb
import pytest

from mimo_jobs.ingest import staging
from mimo_jobs.ingest.discover import IngestError


@pytest.mark.parametrize(
    "value, sql_type, out",
    [
        (2**31 - 1, "INTEGER", 2**31 - 1),
        (2**31, "INTEGER", None),
        (-(2**31) + 1, "INTEGER", -(2**31) + 1),
        (2**31, "BIGINT", 2**31),
        (2**63, "BIGINT", None),
        (3.0, "INTEGER", 3),
        (3.5, "INTEGER", None),
        (float("nan"), "INTEGER", None),
        (True, "INTEGER", None),
        ("7", "INTEGER", None),
        (None, "INTEGER", None),
    ],
)
def test_storable_int(value, sql_type, out):
    assert staging.storable_int(value, sql_type) == out


@pytest.mark.parametrize("value, ok", [(1.5, True), ("12", True), (0, False), (-1.0, False),
                                       ("nan", False), (float("inf"), False), ("x", False), (None, False)])  # fmt: skip
def test_measured_time(value, ok):
    assert staging.measured_time(value) is ok


def test_a_refused_value_is_the_files_error_not_the_stores():
    con = duckdb.connect()
    with pytest.raises(staging.StagingError, match="rows the store would not take") as e:
        with staging._refused_rows():
            con.execute("SELECT CAST('99999999999' AS INTEGER)").fetchall()
    assert isinstance(e.value, IngestError) and "damaged" not in str(e.value)


def test_an_event_keeps_its_line_without_a_rank_the_store_cannot_hold():
    st = staging.Stage()
    try:
        row = ["r", "j", 99_999_999_999, 2**40, None, "nccl_timeout", "m", "f", 3]
        st.event(row)
        assert row[2:4] == [None, None] and st.n_ev == 1
        assert st.log_iteration([3_000_000_000, None, "1.0"], 5) is False and st.n_it == 0
    finally:
        st.close()

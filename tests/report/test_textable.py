"""textable draws tables without rich; its text must be exactly what rich prints for the same table."""

from __future__ import annotations

import io
import string

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.console import Console

from helpers.scaling_store import build_store
from mimo_jobs.report import build
from mimo_jobs.report.render_text import render_table
from mimo_jobs.report.textable import RICH_LAYOUT, Column, Table, matches_rich, render, to_rich

# textable copies one rich release's layout; with another rich the report draws with rich itself
pytestmark = pytest.mark.skipif(
    not matches_rich(), reason=f"rich is not {RICH_LAYOUT}x: textable is not used"
)


def rich_text(table: Table, width: int) -> str:
    buf = io.StringIO()
    Console(file=buf, width=width, no_color=True, force_terminal=False).print(to_rich(table))
    return buf.getvalue()


def fast_text(table: Table, width: int) -> str | None:
    lines = render(table, width)
    return None if lines is None else "\n".join(lines) + "\n"


words = st.text(alphabet=string.ascii_letters + string.digits + ".,%()/|-_[]:*", min_size=1, max_size=30)
cells = st.lists(words, max_size=6).map(" ".join) | st.sampled_from(["", "-", " x ", "2,009.0"])
columns = st.builds(
    Column,
    header=st.text(alphabet=string.ascii_letters + " /*()", min_size=1, max_size=14),
    justify=st.sampled_from(["left", "right", "center"]),
    no_wrap=st.booleans(),
    overflow=st.sampled_from(["fold", "crop", "ellipsis"]),
)


@st.composite
def tables(draw):
    cols = draw(st.lists(columns, min_size=1, max_size=9))
    rows = draw(st.lists(st.lists(cells, min_size=len(cols), max_size=len(cols)), max_size=6))
    title = draw(st.sampled_from(["", "Runs", "Loss parity at equal consumed samples (vs baseline)"]))
    return Table(title, cols, rows)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tables(), st.integers(min_value=8, max_value=220))
def test_same_text_as_rich(table, width):
    fast = fast_text(table, width)
    if fast is not None:  # None: textable declined (too narrow, title wider than the table); rich draws it
        assert fast == rich_text(table, width)


def test_it_declines_rarely():
    # The property above would pass if render() always declined: on ordinary tables it must not.
    t = Table("Runs", [Column("run", no_wrap=False, overflow="fold"), Column("t med (ms)", "right")])
    t.add_row(["33n-e1x8-l2x8x128-g768", "2,009.0"])
    t.add_row(["a run with a long name " * 5, "12.5"])  # wider than 60 columns: wraps
    for width in (40, 60, 120):
        assert fast_text(t, width) == rich_text(t, width)
    assert render(Table("x", [Column("é")]), 80) is None  # non-ASCII: rich measures it


def test_report_table_is_rich_text(tmp_path):
    con, _ = build_store(tmp_path)
    rep = build(con, "scal", gpu="H100")
    con.close()
    for width in (200, 100, 60):
        assert render_table(rep, width=width) == render_table(rep, width=width, fast=False)
    assert "unexpected speed-up" in render_table(rep)


def test_cli_table_on_a_pipe_is_rich_text(tmp_path):
    # `mimo-jobs report` printing to a pipe (no colour): textable's lines interleave with rich's prints
    from typer.testing import CliRunner

    from mimo_jobs.cli.app import app

    con, _ = build_store(tmp_path)
    want = render_table(build(con, "scal"), width=120, fast=False)
    con.close()
    db = str(tmp_path / "store.duckdb")
    res = CliRunner().invoke(app, ["report", "scal", "--db", db], env={"COLUMNS": "120", "NO_COLOR": "1"})
    assert res.exit_code == 0, res.output
    assert res.output == want

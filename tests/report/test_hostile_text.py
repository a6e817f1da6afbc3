"""Text the report did not write (run and study names, flags, log excerpts) in each format: never a formula
in CSV, never markup in markdown, never a control character on a terminal; and no figure cut to fit a
narrow table. The CLI-level cases are in tests/hostile/test_hostile_names.py."""

from __future__ import annotations

import csv
import io
import re
import string
from datetime import datetime

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers.scaling_store import build_store
from mimo_jobs.report import build, fmt
from mimo_jobs.report.layout import TEXT_MIN, fit
from mimo_jobs.report.model import ParityRow, Report, RunRow, StudyInfo, TriageRow
from mimo_jobs.report.render_data import render_csv
from mimo_jobs.report.render_text import print_table, render_md, render_table
from mimo_jobs.report.textable import Column, Table, column_widths, matches_rich, render
from mimo_jobs.textsafe import PIPE_WIDTH, console_width, visible

HOSTILE = [
    '=HYPERLINK("http://x","y")',
    "<script>alert(1)</script>",
    "a|b",
    "a\\|b",
    "`x` *y* [z](http://e) _u_ ~~s~~",
    "red\x1b[31mred\x1b[0m",
    "\x1b]0;title\x07",
    "two\nlines\r\n",
    "\ttab",
    "abc\u202edcba",
    "   ",
    "",
    "[/]",
    ":smile:",
    "名前ü",
    "x" * 120,
]


def row(name: str, study: str = "s", **kw) -> RunRow:
    """A completed run of 300 nodes with the figures of tests/hostile's, its final loss negative."""
    r = RunRow(
        study,
        f"rid-{name!r}",
        name,
        300,
        2400,
        128,
        4096,
        "tiny",
        "-",
        "COMPLETED",
        "derived",
        300,
        300,
        1,
        31,
    )
    r.t_median_ms, r.t_mean_ms, r.t_std_ms = 5003.0, 5003.02, 2.0
    r.samples_per_s, r.slots_per_s, r.slots_per_s_per_gpu = 25.58, 104794.7, 43.66
    r.final_loss, r.efficiency = -4.0, 1.0
    for k, v in kw.items():
        setattr(r, k, v)
    return r


def report(runs: list[RunRow], notes: tuple[str, ...] = ()) -> Report:
    studies = sorted({r.study for r in runs})
    return Report(
        datetime(2026, 1, 1),
        [StudyInfo(s, "strong", 300, [], "tokens/s/GPU") for s in studies],
        runs,
        [],
        [],
        {},
        list(notes),
        {},
    )


# -- the rule for terminals


@pytest.mark.parametrize(
    "raw, shown",
    [
        ("plain-name_1", "plain-name_1"),
        ("a\x1b[31mb", "a\\x1b[31mb"),
        ("\x1b]0;t\x07", "\\x1b]0;t\\x07"),
        ("x\ny\rz\tw", "x\\ny\\rz\\tw"),
        ("\x00\x7f\x9b", "\\x00\\x7f\\x9b"),
        ("abc\u202edcba", "abc\\u202edcba"),
        ("a\u200bb\u00a0c\u2028", "a\\u200bb\\xa0c\\u2028"),
        ("\udcff", "\\udcff"),  # a surrogate from undecodable bytes: printing it would raise
        ("名前 ünï", "名前 ünï"),  # printable non-ASCII stays
        ("   ", "   "),
    ],
)
def test_visible(raw, shown):
    assert visible(raw) == shown


@given(st.text())
def test_visible_leaves_nothing_unprintable(s):
    v = visible(s)
    assert all(c.isprintable() for c in v) and visible(v) == v


def test_console_width_on_a_pipe(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    assert console_width(io.StringIO()) == PIPE_WIDTH
    monkeypatch.setenv("COLUMNS", "60")
    assert console_width(io.StringIO()) is None  # rich reads COLUMNS itself
    monkeypatch.setenv("COLUMNS", "")
    assert console_width(io.StringIO()) == PIPE_WIDTH


# -- CSV


@pytest.mark.parametrize("lead", ["=", "+", "-", "@", "\t", "\r"])
def test_csv_cell_quotes_formula_text(lead):
    assert fmt.csv_cell(lead + "1+1") == "'" + lead + "1+1"
    assert fmt.csv_cell(lead + "cmd|' /C calc'!A0") == "'" + lead + "cmd|' /C calc'!A0"


@pytest.mark.parametrize(
    "v", [-4.0, -1, 0, 3.5, float("nan"), "-", "-5", "-1.25", "-1e-05", "", "a=1", "1-2"]
)
def test_csv_cell_keeps_numbers_and_plain_text(v):
    assert fmt.csv_cell(v) is v


def test_csv_is_what_csv_writer_writes(tmp_path):
    # render_csv writes lines itself (to quote a lone "\r"): on ordinary data, exactly csv.writer's text
    con, _ = build_store(tmp_path)
    rep = build(con, "scal")
    con.close()
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    for r in csv.reader(io.StringIO(render_csv(rep))):
        w.writerow(r)
    assert render_csv(rep) == buf.getvalue()
    rows = list(csv.DictReader(io.StringIO(render_csv(rep))))
    assert rows[0]["t_median_ms"] == "405.0" and rows[1]["share_llm_fwd"] == ""


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(), min_size=1, max_size=4), st.text())
def test_csv_round_trips_any_name(names, study):
    rep = report([row(n, study) for n in names])
    with io.StringIO(render_csv(rep), newline="") as f:
        got = list(csv.DictReader(f))
    assert [r["name"] for r in got] == [fmt.csv_cell(n) for n in names]
    assert {r["study"] for r in got} == {fmt.csv_cell(study)}
    assert [r["final_loss"] for r in got] == ["-4.0"] * len(names)  # a negative number stays a number
    for r in got:
        for v in r.values():
            assert v == "-" or not v.startswith(("=", "+", "@", "\t", "\r", "-")) or float(v) < 0


# -- markdown


def md_cells(line: str) -> list[str]:
    """A markdown table line's cells, split where a pipe is not escaped."""
    return re.findall(r"((?:[^\\|]|\\.)*)\|", line)[1:]


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_md_text_is_literal(s):
    m = fmt.md_text(s)
    assert all(c.isprintable() for c in m)
    assert not re.search(r"[<>]", m)
    # every markup character is escaped: drop escaped pairs, and none is left
    assert not re.search(r"[`*_\[\]|~\\]", re.sub(r"\\.", "", m))
    assert len(md_cells(f"| {m} | x |")) == 2


@pytest.mark.parametrize("name", HOSTILE)
def test_md_table_keeps_its_shape(name):
    rep = report([row(name, name), row("plain")], notes=(f"{name}: baseline has no data",))
    md = render_md(rep)
    runs = md.split("## Runs\n\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert len(runs) == 4 and all(len(md_cells(x)) == len(fmt.RUN_HEADERS) for x in runs)
    assert "<script>" not in md and "\x1b" not in md and "\u202e" not in md


# -- the terminal table


def _figures(r: RunRow) -> list[str]:
    cells = fmt.run_cells(r)
    return [c for c, h in zip(cells, fmt.RUN_HEADERS) if h not in ("study", "run", "flags")]


def _whole(fig: str, text: str) -> bool:
    return re.search(rf"[│ ]{re.escape(fig)} +│", text) is not None


@pytest.mark.parametrize("width", [200, 120, 80, 60, 40])
@pytest.mark.parametrize("fast", [True, False])
def test_no_figure_is_cut(width, fast):
    runs = [
        row("x" * 120, "y" * 50),
        row("short", "y" * 50, iterations=3, train_iters=300, flags=["slow"] * 9),
    ]
    text = render_table(report(runs), width=width, fast=fast)
    for r in runs:
        for fig in _figures(r):
            assert _whole(fig, text), (fig, width, text)
    assert max(len(x) for x in text.splitlines()) <= width
    assert "xxxxxxxx" in text and "300/300" in text and "3/300" in text


def test_store_report_at_any_width(tmp_path):
    con, _ = build_store(tmp_path)
    rep = build(con, "scal", gpu="H100")
    con.close()
    for width in (200, 100, 60, 40):
        text = render_table(rep, width=width)
        for r in rep.runs:
            for fig in _figures(r):
                assert _whole(fig, text), (fig, width)
        for p in rep.parity:  # lists of figures wrap between figures, never inside one
            for fig in fmt.parity_cells(p)[2].split(", "):
                assert re.search(rf"[│ ]{re.escape(fig)},? ", text), (fig, width)
        assert max(len(x) for x in text.splitlines()) <= width


def test_a_part_wider_than_asked_only_when_one_figure_needs_it():
    t = Table("T", [Column("run", key=True), Column("a" * 30, no_wrap=True)])
    t.add_row(["r" * 40, "1"])
    ((part, w),) = fit(t, 20)
    assert w == 30 + 2 + (TEXT_MIN + 2) + 3 and "a" * 30 in "\n".join(render(part, w))


words = st.text(alphabet=string.ascii_letters + string.digits + ".,%/-", min_size=1, max_size=12)
cells = st.lists(words, min_size=1, max_size=4).map(" ".join)
columns = st.builds(
    Column,
    header=st.text(alphabet=string.ascii_letters + " /", min_size=1, max_size=12),
    no_wrap=st.booleans(),
    overflow=st.sampled_from(["fold", "ellipsis"]),
    key=st.booleans(),
    figures=st.booleans(),
)


@st.composite
def tables(draw):
    cols = draw(st.lists(columns, min_size=1, max_size=12))
    rows = draw(st.lists(st.lists(cells, min_size=len(cols), max_size=len(cols)), min_size=1, max_size=4))
    return Table("T", cols, rows)


@pytest.mark.skipif(not matches_rich(), reason="column_widths is rich 15's layout")
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tables(), st.integers(min_value=20, max_value=200))
def test_fit_keeps_every_figure(table, width):
    parts = fit(table, width)
    shown = {c.header for p, _ in parts for c in p.columns}
    assert shown == {c.header for c in table.columns}  # every column is in some part
    for part, w in parts:
        widths = column_widths(part, w)
        for i, (c, cw) in enumerate(zip(part.columns, widths)):
            texts = [c.header, *(r[i] for r in part.rows)]
            if c.no_wrap:
                assert cw - 2 >= max(map(len, texts))
            elif c.figures:
                assert cw - 2 >= max(len(x) for t in texts for x in t.split())
        if w > width:  # wider than asked only when the part has one column besides its keys
            assert sum(not c.key for c in part.columns) <= 1


# -- markup and control characters never act


@pytest.mark.parametrize("name", HOSTILE)
@pytest.mark.parametrize("fast", [True, False])
def test_table_shows_names_as_text(name, fast):
    rep = report([row(name, name)], notes=(f"{name}: baseline 2 nodes has no data",))
    text = render_table(rep, width=200, fast=fast)
    assert all(c.isprintable() for c in text.replace("\n", ""))
    assert visible(name)[:20] in text  # markup ([/], :smile:) printed as written


def test_print_table_on_a_pipe_is_full_width(monkeypatch, capsys):
    monkeypatch.delenv("COLUMNS", raising=False)
    print_table(report([row("x" * 120)]))
    out = capsys.readouterr().out
    assert _whole("300/300", out) and _whole("2,400", out)
    assert 120 < max(len(x) for x in out.splitlines()) <= PIPE_WIDTH


def test_print_table_on_a_narrow_pipe(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "60")
    rep = report([row("x" * 120)])
    print_table(rep)
    out = capsys.readouterr().out
    assert all(_whole(f, out) for f in _figures(rep.runs[0]))
    assert max(len(x) for x in out.splitlines()) <= 60


def test_triage_and_parity_rows_are_visible():
    rep = report([row("r")])
    rep.triage = [
        TriageRow("s", "rid", "r\x1b[2J", "7", "FAILED", 3, None, "failed", "why\x07", None, "ev\x1b]0;x\x07")
    ]
    rep.parity = [ParityRow("s", "rid", "p\u202e", 2, [1.0], [2.0], [2.0], 0.0, 0.0)]
    table, md = render_table(rep), render_md(rep)
    for text in (table, md):
        assert "\x1b" not in text and "\x07" not in text and "\u202e" not in text
    assert "r\\x1b[2J" in table and "p\\u202e" in table
    assert "r\\\\x1b\\[2J" in md and "p\\\\u202e" in md  # visible, then its backslash escaped


def _on_a_terminal(argv: list[str]) -> str:
    """The bytes `mimo-jobs <argv>` writes to a terminal (a pseudo-terminal as its stdout)."""
    import os
    import pty
    import subprocess
    import sys

    main, sub = pty.openpty()
    p = subprocess.Popen([sys.executable, "-m", "mimo_jobs.cli", *argv], stdout=sub, stderr=sub)
    os.close(sub)
    chunks = []
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # the other end closed: the command has ended
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(main)
    assert p.wait(timeout=60) == 0, b"".join(chunks)[-2000:]
    return b"".join(chunks).decode("utf-8", "replace")


# OSC 0 (window title), OSC 8 (hyperlink), OSC 52 (clipboard write), and a C1 CSI (U+009B)
ESCAPES = "\x1b]0;owned\x07\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\\x1b]52;c;ZXZpbA==\x07\u009b31mred"


@pytest.mark.parametrize("fmt_", ["csv", "md", "json"])
def test_a_document_printed_to_a_terminal_carries_no_control_sequence(fmt_, tmp_path):
    import subprocess
    import sys

    import duckdb

    from helpers import TESTS

    db = tmp_path / "s.duckdb"
    log = str(TESTS / "ingest" / "fixtures" / "slurm-4242.out")
    subprocess.run([sys.executable, "-m", "mimo_jobs.cli", "ingest", log, "--db", str(db)], check=True)
    con = duckdb.connect(str(db))
    con.execute("UPDATE events SET message = ? || message", [ESCAPES])
    con.close()
    out = _on_a_terminal(["report", "--db", str(db), "-f", fmt_])
    assert "\x1b]" not in out and "\u009b" not in out and "\x07" not in out, repr(out[:2000])
    assert "failed" in out  # the flag is there, made visible

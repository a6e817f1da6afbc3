"""Hostile run and study names through `report`: spreadsheet formulas in CSV, markup and HTML in markdown,
terminal escape sequences and control characters in the table, names too long for the screen. One line
per case (see tests/helpers/hostile.py); each runs the real CLI on a pipe (COLUMNS unset unless a case
sets it) and must end cleanly, with every figure whole and no name acting as anything but text."""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

import pytest

from helpers.hostile import Case, run_case
from mimo_jobs.report import fmt

DB = "{tmp}/s.duckdb"
LONG = "r" * 60 + "-" + "x" * 59  # 120 characters
# The one run's figures as the table prints them (300 nodes x 8 GPUs, 300 iterations of ~5 s, gbs 128,
# sequence 4096, loss from 10 down to 7).
FIGURES = ("300", "2,400", "COMPLETED", "300/300", "5,003.0", "25.58", "43.7", "7.0000")  # 43.7: slots/s/GPU


def megatron_log(path: Path, loss0: float = 10.0, n: int = 300) -> None:
    """An upstream Megatron-LM log of n iterations (what `ingest` reads without a run.yaml)."""
    lines = [
        f" [2024-04-06 02:{i // 60:02d}:{i % 60:02d}] iteration {i:8d}/{n:8d} | consumed samples: "
        f"{i * 128:12d} | elapsed time per iteration (ms): {5000 + i % 7:.1f} | learning rate: 1.0E-05 | "
        f"global batch size:   128 | lm loss: {loss0 - i * 0.01:.6E} | loss scale: 1.0 | grad norm: 1.0 |"
        for i in range(1, n + 1)
    ]
    path.write_text("\n".join(lines) + "\n")


def store(*runs: tuple[str, str] | tuple[str, str, float]):
    """setup: a store holding one run per (study, name[, first loss]), each ingested from its own log."""

    def setup(tmp: Path) -> None:
        from mimo_jobs.ingest import pipeline
        from mimo_jobs.store.connection import connect

        con = connect(tmp / "s.duckdb")
        try:
            for i, (study, name, *loss0) in enumerate(runs):
                log = tmp / f"run{i}.log"
                megatron_log(log, *loss0)
                info = pipeline.LogRunInfo(
                    study=study, name=name, nodes=300, gpus_per_node=8, seq_length=4096
                )
                st = pipeline.ingest_paths(con, [log], log_run=info)
                assert st.iterations == 300 and not st.problems, st
        finally:
            con.close()

    return setup


def one(name: str, study: str = "s"):
    return store((study, name))


def log_file(filename: str):
    """setup: a store holding the run of one log ingested without --name: the run is named after the file
    (a name no command-line check sees)."""

    def setup(tmp: Path) -> None:
        from mimo_jobs.ingest import pipeline
        from mimo_jobs.store.connection import connect

        megatron_log(tmp / filename)
        con = connect(tmp / "s.duckdb")
        try:
            info = pipeline.LogRunInfo(study="s", nodes=300, gpus_per_node=8, seq_length=4096)
            assert pipeline.ingest_paths(con, [tmp / filename], log_run=info).iterations == 300
        finally:
            con.close()

    return setup


# -- checks on the output


def csv_rows(out: str, tmp: Path | None = None) -> list[dict]:
    """The CSV's rows: from the file `--out {tmp}/c` wrote, else from the output (which a text pipe has
    read with universal newlines: a carriage return in it is a line feed by then)."""
    f = tmp / "c" / "report.csv" if tmp is not None else None
    if f is not None and f.exists():
        with open(f, newline="", encoding="utf-8") as fh:
            return list(csv.DictReader(fh))
    return list(csv.DictReader(io.StringIO(out)))


def csv_says(**want: str):
    """check: the (only) CSV row has these cells, exactly."""

    def check(tmp: Path, out: str) -> None:
        (row,) = csv_rows(out, tmp)
        for k, v in want.items():
            assert row[k] == v, (k, row[k], v)
        assert (row["nodes"], row["gpus"], row["iterations"]) == (
            "300",
            "2400",
            "300",
        )  # numbers stay numbers

    return check


def neutralised(tmp: Path, out: str) -> None:
    """check: no cell of the CSV starts with a character a spreadsheet reads as a formula, unless it is a
    number written as one or the "-" of no value."""
    for row in csv_rows(out, tmp):
        for v in row.values():
            if v[:1] in ("=", "+", "-", "@", "\t", "\r") and v != "-":  # "-": no value
                float(v)  # a number (a negative loss, say): no formula


def figures_whole(*extra: str, width: int = 200):
    """check: every figure of the run appears whole in the table, between cell borders, and no line is
    wider than `width`."""

    def check(tmp: Path, out: str) -> None:
        for fig in (*FIGURES, *extra):
            assert re.search(rf"[│ ]{re.escape(fig)} +│", out), f"{fig!r} is not whole in:\n{out}"
        wide = [ln for ln in out.splitlines() if len(ln) > width]
        assert not wide, f"{len(wide)} line(s) wider than {width}:\n{out}"

    return check


def inert(*gone: str):
    """check: no control character reaches the terminal (escape, bell, C1, bidi override) and none of
    `gone` appears as written."""

    def check(tmp: Path, out: str) -> None:
        bad = [c for c in out if c not in "\n" and not c.isprintable()]
        assert not bad, f"control characters reached the output: {bad!r}"
        for g in gone:
            assert g not in out, f"{g!r} reached the output"

    return check


def md_cells(line: str) -> list[str]:
    """A markdown table line's cells, split where a pipe is not escaped."""
    cells, cur, i = [], "", 0
    while i < len(line):
        if line[i] == "\\" and i + 1 < len(line):
            cur, i = cur + line[i : i + 2], i + 2
            continue
        if line[i] == "|":
            cells.append(cur)
            cur = ""
        else:
            cur += line[i]
        i += 1
    return cells[1:]


def md_runs_table(runs: int = 1):
    """check: the markdown Runs table is header, rule and one line per run, each of one cell per column."""

    def check(tmp: Path, out: str) -> None:
        lines = out.split("## Runs\n\n", 1)[1].split("\n\n", 1)[0].splitlines()
        assert len(lines) == 2 + runs, lines
        for ln in lines:
            assert len(md_cells(ln)) == len(fmt.RUN_HEADERS), (ln, md_cells(ln))

    return check


def all_of(*checks):
    def check(tmp: Path, out: str) -> None:
        for c in checks:
            c(tmp, out)

    return check


def html_file(*has: str, lacks: tuple[str, ...] = ()):
    def check(tmp: Path, out: str) -> None:
        text = (tmp / "h" / "report.html").read_text()
        assert all(h in text for h in has) and not any(x in text for x in lacks), text[-3000:]

    return check


def json_name(name: str):
    """check: JSON, the exact export, keeps the name exactly."""

    def check(tmp: Path, out: str) -> None:
        (run,) = json.loads(out)["runs"]
        assert run["name"] == name

    return check


CSV = ["report", "--db", DB, "-f", "csv"]
CSV_FILE = [*CSV, "--out", "{tmp}/c"]
MD = ["report", "--db", DB, "-f", "md"]
TABLE = ["report", "--db", DB]
HYPERLINK = '=HYPERLINK("http://x","y")'
SCRIPT = "<script>alert(1)</script>"
ESCAPES = "a\x1b[31mred\x1b[0m\x1b]0;title\x07"

CASES = [
    # A: CSV cells a spreadsheet would evaluate
    Case("csv-hyperlink-name", CSV, 0, setup=one(HYPERLINK), check=csv_says(name="'" + HYPERLINK)),
    Case("csv-hyperlink-study", CSV, 0, setup=one("r", HYPERLINK), check=csv_says(study="'" + HYPERLINK)),
    Case("csv-plus", CSV, 0, setup=one("+1+1"), check=csv_says(name="'+1+1")),
    Case(
        "csv-minus",
        CSV,
        0,
        setup=one("-2+3+cmd|' /C calc'!A0"),
        check=csv_says(name="'-2+3+cmd|' /C calc'!A0"),
    ),
    Case("csv-at", CSV, 0, setup=one("@SUM(A1:A9)"), check=csv_says(name="'@SUM(A1:A9)")),
    Case("csv-tab", CSV_FILE, 0, setup=one("\t=1+1"), check=csv_says(name="'\t=1+1")),
    Case("csv-cr", CSV_FILE, 0, setup=one("\r=1+1"), check=csv_says(name="'\r=1+1")),
    Case("csv-log-file-name", CSV, 0, setup=log_file("=1+1.log"), check=csv_says(name="'=1+1")),
    Case("csv-inner-equals-is-text", CSV, 0, setup=one("a=1+1"), check=csv_says(name="a=1+1")),
    Case("csv-negative-number-name", CSV, 0, setup=one("-5"), check=csv_says(name="-5")),
    Case(
        "csv-negative-loss-stays-number",
        CSV,
        0,
        setup=store(("s", "=neg", -1.0)),
        check=all_of(csv_says(name="'=neg", final_loss="-4.0"), neutralised),
    ),
    Case(
        "json-keeps-formula-name",
        ["report", "--db", DB, "-f", "json"],
        0,
        setup=one(HYPERLINK),
        check=json_name(HYPERLINK),
    ),
    # B: figures whole, on a pipe (full width) and on a narrow terminal
    Case("table-long-name-piped", TABLE, 0, ("Runs",), setup=one(LONG), check=figures_whole()),
    Case(
        "table-long-name-columns-60",
        TABLE,
        0,
        ("Runs (1/",),
        setup=one(LONG),
        check=figures_whole(width=60),
        env={"COLUMNS": "60"},
    ),
    Case(
        "table-long-study-and-name-columns-60",
        TABLE,
        0,
        setup=one(LONG, LONG),
        check=figures_whole(width=60),
        env={"COLUMNS": "60"},
    ),
    Case(
        "table-two-runs-columns-40",
        TABLE,
        0,
        setup=store(("s", LONG), ("s", "b")),
        check=figures_whole(width=40),
        env={"COLUMNS": "40"},
    ),
    Case(
        "table-out-file",
        ["report", "--db", DB, "--out", "{tmp}/t"],
        0,
        ("report.txt",),
        setup=one(LONG),
        check=lambda tmp, out: figures_whole()(tmp, (tmp / "t" / "report.txt").read_text()),
    ),
    # C: names that would act on the terminal or in markdown
    Case("table-escape-sequences", TABLE, 0, ("a\\x1b[31mred",), setup=one(ESCAPES, ESCAPES), check=inert()),
    Case(
        "table-c0-c1-controls",
        TABLE,
        0,
        ("\\x00n\\x08u\\x7fl\\x9b",),
        setup=one("\x00n\x08u\x7fl\x9b"),
        check=inert(),
    ),
    Case(
        "table-newline-name",
        TABLE,
        0,
        ("two\\nlines",),
        setup=one("two\nlines"),
        check=all_of(inert(), figures_whole()),
    ),
    Case("table-tab-name", TABLE, 0, ("a\\tb",), setup=one("a\tb"), check=all_of(inert(), figures_whole())),
    Case(
        "table-rtl-override", TABLE, 0, ("abc\\u202edcba",), setup=one("abc\u202edcba"), check=inert("\u202e")
    ),
    Case(
        "table-zero-width-and-nbsp",
        TABLE,
        0,
        ("a\\u200bb\\xa0c",),
        setup=one("a\u200bb\u00a0c"),
        check=inert(),
    ),
    Case(
        "table-whitespace-only-name",
        TABLE,
        0,
        setup=one("   ", " \t "),
        check=all_of(inert(), figures_whole()),
    ),
    Case(
        "table-rich-markup-names",
        TABLE,
        0,
        ("[/]", "[bold red]x[/]", ":smile:"),
        setup=one("[bold red]x[/] :smile:", "[/]"),
    ),
    Case("table-unicode-name", TABLE, 0, ("ünïcödé-名前",), setup=one("ünïcödé-名前"), check=figures_whole()),
    Case(
        "md-script",
        MD,
        0,
        ("&lt;script&gt;",),
        setup=one(SCRIPT, SCRIPT),
        check=all_of(inert(SCRIPT), md_runs_table()),
    ),
    Case("md-pipe", MD, 0, ("a\\|b",), setup=one("a|b", "s|t"), check=md_runs_table()),
    Case("md-backslash-pipe", MD, 0, ("a\\\\\\|b",), setup=one("a\\|b"), check=md_runs_table()),
    Case(
        "md-inline-markup",
        MD,
        0,
        ("\\`x\\`", "\\*em\\*", "\\[l\\](http://e)", "\\_u\\_", "\\~\\~s\\~\\~", "&amp;lt;"),
        setup=one("`x` *em* [l](http://e) _u_ ~~s~~ &lt;"),
        check=md_runs_table(),
    ),
    Case(
        "md-newline-name",
        MD,
        0,
        ("two\\\\nlines",),
        setup=one("two\nlines", "st\nudy"),
        check=md_runs_table(),
    ),
    Case(
        "table-log-file-name",
        TABLE,
        0,
        ("a\\x1b]0;t\\x07",),
        setup=log_file("a\x1b]0;t\x07.log"),
        check=inert(),
    ),
    Case(
        "md-log-file-name",
        MD,
        0,
        ("&lt;img src=x onerror=alert(1)&gt;",),
        setup=log_file("<img src=x onerror=alert(1)>.log"),
        check=inert("<img"),
    ),
    Case("md-escape-sequences", MD, 0, setup=one(ESCAPES, ESCAPES), check=all_of(inert(), md_runs_table())),
    Case("md-rtl-override", MD, 0, ("\\u202e",), setup=one("abc\u202edcba"), check=inert("\u202e")),
    Case(
        "html-script",
        ["report", "--db", DB, "-f", "html", "--out", "{tmp}/h"],
        0,
        ("report.html",),
        setup=one(SCRIPT, SCRIPT + "\u202e"),
        check=html_file("&lt;script&gt;", "\\u202e", lacks=(SCRIPT, "\u202e")),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_names(case: Case, tmp_path: Path) -> None:
    run_case(case, tmp_path)

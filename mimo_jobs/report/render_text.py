"""Terminal table (textable, or rich on a colour terminal) and markdown renderings of a Report.

Names, flags and log excerpts are text the report did not write: in the table they are made visible
(textable.Table does it for every cell), in markdown escaped (fmt.md_text), and neither is ever read as
rich markup. Figures are never cut: layout.fit draws a table too wide for the console in parts.
"""

from __future__ import annotations

import io
import sys

from mimo_jobs.textsafe import console_width, visible

from . import fmt, sections
from .layout import fit
from .model import Report
from .textable import Column, Table

# A line of text between the tables: (text, rich style) pieces, the text literal (never rich markup).
Line = tuple[tuple[str, str | None], ...]
TEXT_COLUMNS = (
    "study",
    "run",
    "run id",
    "flags",
)  # the runs table's columns of text; the others hold figures


def _tables(report: Report) -> list[Table | Line]:
    """What the table rendering prints, in order: tables and lines."""
    out: list[Table | Line] = [_runs_table(report)]
    for s in report.studies:
        out.append(((s.name, "bold"), (fmt.study_line(s), None)))
    out += _phase_table(report) + _section_tables(report) + _parity_table(report) + _triage_table(report)
    for n in report.notes:
        out.append(((f"* {n}" if n.startswith("per-GPU") else f"  {n}", None),))
    return out


def _runs_table(report: Report):
    """One row per run, styled by its state (yellow: running or no data, red: failed)."""
    ids = fmt.names_repeat(report.runs)
    t = Table(
        "Runs",
        [
            Column(h, overflow="fold", no_wrap=h not in TEXT_COLUMNS, key=h in ("study", "run", "run id"))
            for h in fmt.run_headers(ids)
        ],
    )
    for r in report.runs:
        style = (
            None if r.state in ("COMPLETED",) else ("yellow" if r.state in ("RUNNING", "NO DATA") else "red")
        )
        t.add_row(fmt.run_cells(r, ids), style)
    return t


def _phase_table(report: Report) -> list:
    """Each run's share of the phase time per phase (no table when no run has phases)."""
    names = fmt.phase_names(report)
    if not names:
        return []
    pt = Table(
        "Phase time shares (steady state)",
        [Column("study", overflow="fold", key=True), Column("run", overflow="fold", key=True)]
        + [Column(p, "right", no_wrap=True) for p in names],
    )
    for row in fmt.phase_rows(report, names):
        pt.add_row(row)
    return [pt]


def _section_tables(report: Report) -> list:
    """Layouts of one size, heterogeneous vs colocated, measured memory (sections.py), each followed by its
    lines."""
    out: list = []
    for sec in sections.all_sections(report):
        t = Table(
            sec.title,
            [
                Column(
                    h,
                    overflow="fold",
                    no_wrap=h not in sections.TEXT_HEADS,
                    key=h in ("study", "run", "heterogeneous"),
                )
                for h in sec.headers
            ],
        )
        for row in sec.rows:
            t.add_row(row)
        out.append(t)
        out += [((line, None),) for line in sec.lines]
    return out


def _parity_table(report: Report) -> list:
    """Loss parity against the baseline run (no table when there is none)."""
    if not report.parity:
        return []
    heads = ("run", "nodes", "samples", "loss", "baseline loss", "max |diff|", "max rel diff")
    lists = ("samples", "loss", "baseline loss")  # a figure per parity point: they wrap between figures
    lt = Table(
        "Loss parity at equal consumed samples (vs baseline)",
        [
            Column(h, overflow="fold", no_wrap=h not in ("run", *lists), key=h == "run", figures=h in lists)
            for h in heads
        ],
    )
    for p in report.parity:
        lt.add_row(fmt.parity_cells(p))
    return [lt]


def _triage_table(report: Report) -> list:
    """Why each failed or hung run stopped (no table when none did)."""
    if not report.triage:
        return []
    heads = ("run", "job", "state", "rank", "why", "evidence")
    tt = Table(
        "Failure triage (first rank that failed or went silent)",
        [Column(h, overflow="fold", no_wrap=h in ("job", "state", "rank"), key=h == "run") for h in heads],
    )
    for x in report.triage:
        who = str(x.rank) if x.rank is not None else (f"node {x.node}" if x.node is not None else "-")
        tt.add_row([x.name, x.job_id or "-", x.state, who, x.reason, x.evidence])
    return [tt]


def _plain_console(console) -> bool:
    """A console that prints no colour with a box-drawing encoding: textable's lines are exactly what
    rich would print there."""
    return console.color_system is None and not console.legacy_windows and console.encoding.startswith("utf")


def print_table(report: Report, console=None, fast: bool = True) -> None:
    """Print the report's tables. On a plain console (no colour: a file, a pipe, NO_COLOR) the tables are
    drawn by textable (same text, ~18x faster than rich); on a colour terminal (failed runs in red) or
    with fast=False, by rich. Without a console: one on stdout, as wide as the CLI's consoles are."""
    from rich.console import Console
    from rich.text import Text

    from .textable import matches_rich, render, to_rich

    console = console or Console(highlight=False, width=console_width(sys.stdout))
    plain = fast and _plain_console(console) and matches_rich()
    for x in _tables(report):
        if not isinstance(x, Table):
            console.print(Text.assemble(*((visible(t), s) for t, s in x)))
            continue
        for part, width in fit(x, console.width):
            lines = render(part, width) if plain else None
            if lines is not None:
                console.file.write("\n".join(lines) + "\n")
            else:
                _print_at(console, to_rich(part), width)


def _print_at(console, renderable, width: int) -> None:
    """Print at `width`, wider than the console when a part of a table needs it (rich would crop it)."""
    if width <= console.width:
        console.print(renderable)
        return
    narrow = console.width
    console.width = width
    try:
        console.print(renderable)
    finally:
        console.width = narrow


def render_table(report: Report, width: int = 200, fast: bool = True) -> str:
    from rich.console import Console

    buf = io.StringIO()
    print_table(report, Console(file=buf, width=width, no_color=True, force_terminal=False), fast=fast)
    return buf.getvalue()


def _md_row(cells: list[str]) -> str:
    return "| " + " | ".join(map(fmt.md_text, cells)) + " |"


def render_md(report: Report) -> str:
    """The report as markdown: the study list, the runs table and its notes, then the other tables. Every
    piece of text from the store goes through fmt.md_text: it reads as the text it is."""
    md = fmt.md_text
    lines = [f"# Scaling report ({report.generated_at:%Y-%m-%d %H:%M} UTC)", ""]
    for s in report.studies:
        lines.append(f"- **{md(s.name)}**{md(fmt.study_line(s))}")
    ids = fmt.names_repeat(report.runs)
    lines += _md_table("Runs", fmt.run_headers(ids), [fmt.run_cells(r, ids) for r in report.runs])
    lines += [""] + [f"\\* {md(n)}" if n.startswith("per-GPU") else f"- {md(n)}" for n in report.notes]
    names = fmt.phase_names(report)
    if names:
        lines += _md_table("Phase time shares", ["study", "run", *names], fmt.phase_rows(report, names))
    for sec in sections.all_sections(report):
        lines += _md_table(sec.title, sec.headers, sec.rows)
        lines += [""] + [f"- {md(x)}" for x in sec.lines] if sec.lines else []
    if report.parity:
        lines += _md_table(
            "Loss parity at equal consumed samples",
            ["run", "nodes", "samples", "loss", "baseline", "max rel diff"],
            [fmt.parity_cells(p, abs_diff=False) for p in report.parity],
        )
    if report.triage:
        lines += _md_table(
            "Failure triage",
            ["run", "job", "state", "rank", "why", "evidence"],
            [
                [
                    x.name,
                    x.job_id or "-",
                    x.state,
                    "-" if x.rank is None else str(x.rank),
                    x.reason,
                    x.evidence,
                ]
                for x in report.triage
            ],
        )
    return "\n".join(lines) + "\n"


def _md_table(title: str, headers: list[str], rows: list[list[str]]) -> list[str]:
    """A "## title" section holding a markdown table."""
    return ["", f"## {title}", "", _md_row(headers), _md_row(["---"] * len(headers)), *map(_md_row, rows)]

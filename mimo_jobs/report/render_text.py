"""Terminal table (textable, or rich on a colour terminal) and markdown renderings of a Report."""

from __future__ import annotations

import io

from . import fmt
from .model import Report
from .textable import Column, Table


def _tables(report: Report) -> list:
    """What the table rendering prints, in order: tables (textable.Table) and lines of rich markup."""
    out: list = [_runs_table(report)]
    for s in report.studies:
        out.append(
            f"[bold]{s.name}[/]: {s.scaling} scaling, baseline N0={s.baseline_nodes} nodes, "
            f"P(N) = {s.metric}, E(N) = P(N)/P(N0)"
        )
    out += _phase_table(report) + _parity_table(report) + _triage_table(report)
    for n in report.notes:
        out.append(f"* {n}" if n.startswith("per-GPU") else f"  {n}")
    return out


def _runs_table(report: Report):
    """One row per run, styled by its state (yellow: running or no data, red: failed)."""
    t = Table(
        "Runs", [Column(h, overflow="fold", no_wrap=h not in ("flags", "run")) for h in fmt.RUN_HEADERS]
    )
    for r in report.runs:
        style = (
            None if r.state in ("COMPLETED",) else ("yellow" if r.state in ("RUNNING", "NO DATA") else "red")
        )
        t.add_row(fmt.run_cells(r), style)
    return t


def _phase_table(report: Report) -> list:
    """Each run's share of the phase time per phase (no table when no run has phases)."""
    names = fmt.phase_names(report)
    if not names:
        return []
    pt = Table("Phase time shares (steady state)", [Column("run")] + [Column(p, "right") for p in names])
    for r in report.runs:
        if r.phase_share:
            pt.add_row([r.name, *[fmt.pct(r.phase_share.get(p)) for p in names]])
    return [pt]


def _parity_table(report: Report) -> list:
    """Loss parity against the baseline run (no table when there is none)."""
    if not report.parity:
        return []
    heads = ("run", "nodes", "samples", "loss", "baseline loss", "max |diff|", "max rel diff")
    lt = Table("Loss parity at equal consumed samples (vs baseline)", [Column(h) for h in heads])
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
        [Column(h, overflow="fold") for h in heads],
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
    with fast=False, by rich."""
    from rich.console import Console

    from .textable import matches_rich, render, to_rich

    console = console or Console()
    plain = fast and _plain_console(console) and matches_rich()
    for x in _tables(report):
        if isinstance(x, Table):
            lines = render(x, console.width) if plain else None
            if lines is not None:
                console.file.write("\n".join(lines) + "\n")
                continue
            x = to_rich(x)
        console.print(x)


def render_table(report: Report, width: int = 200, fast: bool = True) -> str:
    from rich.console import Console

    buf = io.StringIO()
    print_table(report, Console(file=buf, width=width, no_color=True, force_terminal=False), fast=fast)
    return buf.getvalue()


def _md_row(cells: list[str]) -> str:
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def render_md(report: Report) -> str:
    """The report as markdown: the study list, the runs table and its notes, then the other tables."""
    lines = [f"# Scaling report ({report.generated_at:%Y-%m-%d %H:%M} UTC)", ""]
    for s in report.studies:
        lines.append(
            f"- **{s.name}**: {s.scaling} scaling, baseline N0 = {s.baseline_nodes} nodes, "
            f"P(N) = {s.metric}, E(N) = P(N)/P(N0)"
        )
    lines += _md_table("Runs", fmt.RUN_HEADERS, [fmt.run_cells(r) for r in report.runs])
    lines += [""] + [f"\\* {n}" if n.startswith("per-GPU") else f"- {n}" for n in report.notes]
    names = fmt.phase_names(report)
    if names:
        shares = [
            [r.name, *[fmt.pct(r.phase_share.get(p)) for p in names]] for r in report.runs if r.phase_share
        ]
        lines += _md_table("Phase time shares", ["run", *names], shares)
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

"""A Versus (versus.py) in every format the report has: table, md, json, csv, html. Every format holds the
same cells, the code versions of both sides among them."""

from __future__ import annotations

import io
import json

from . import fmt
from .render_data import _csv_line, finite
from .sections import Section, _gib
from .versus import Versus

FORMATS = ("table", "md", "html", "json", "csv")
HEADERS = ["layout", "base run", "other run", "base version", "other version", "t base (ms)", "t other (ms)",
           "time other/base", "throughput other/base", "memory other/base", "loss max rel diff", "noise",
           "verdict"]  # fmt: skip


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def section(v: Versus) -> Section:
    rows = [
        [r.layout, r.base_run, r.other_run, r.base_version, r.other_version, fmt.num(r.base_ms),
         fmt.num(r.other_ms), _x(r.time_ratio), _x(r.throughput_ratio),
         _x(r.memory_ratio) + ("" if r.other_memory is None else f" ({_gib(r.other_memory)})"),
         fmt.pct(r.loss_max_rel_diff), f"{r.noise:.1%}", r.verdict]
        for r in v.rows
    ]  # fmt: skip
    bad = [r for r in v.rows if r.regressions]
    lines = [
        f"{len(bad)} of {len(v.rows)} matched runs regressed beyond the noise"
        + (": " + ", ".join(r.other_run for r in bad) if bad else ""),
        f"ratios are OTHER / BASE; noise = the runs' 95% intervals of the mean iteration time combined, at "
        f"least {v.noise_floor:.0%}; throughput: {v.rows[0].metric if v.rows else '-'}",
        *[f"unmatched: {u}" for u in v.unmatched],
    ]
    return Section(f"{v.other} against {v.base}, run by run (matched by layout)", HEADERS, rows, lines)


def render(v: Versus, form: str) -> str:
    sec = section(v)
    if form == "json":
        return json.dumps(finite(v.to_dict()), indent=2, allow_nan=False) + "\n"
    if form == "csv":
        cols = list(v.rows[0].__dataclass_fields__) if v.rows else ["layout"]
        out = [_csv_line(cols)]
        for r in v.rows:
            d = r.__dict__
            out.append(
                _csv_line(
                    ["; ".join(d[c]) if c == "regressions" else ("" if d[c] is None else d[c]) for c in cols]
                )
            )
        return "".join(out)
    if form == "md":
        md = fmt.md_text

        def row(cells: list[str]) -> str:
            return "| " + " | ".join(map(md, cells)) + " |"

        lines = [
            f"# {md(sec.title)}",
            "",
            row(sec.headers),
            row(["---"] * len(sec.headers)),
            *map(row, sec.rows),
        ]
        return "\n".join(lines + [""] + [f"- {md(x)}" for x in sec.lines]) + "\n"
    if form == "html":
        from .render_html import CSS, _table

        notes = "".join(f'<p class="note">{fmt.html_text(x)}</p>' for x in sec.lines)
        rows = [(cells, "bad" if r.regressions else "") for cells, r in zip(sec.rows, v.rows)]
        return (
            f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>mimo-jobs compare</title>'
            f"<style>{CSS}</style></head><body><h1>{fmt.html_text(sec.title)}</h1>"
            f"{_table(sec.headers, rows)}{notes}</body></html>\n"
        )
    return _table_text(sec)


def _table_text(sec: Section, width: int = 200) -> str:
    from rich.console import Console

    from .layout import fit
    from .textable import Column, Table, to_rich
    from .textable import render as draw

    t = Table(
        sec.title,
        [
            Column(h, overflow="fold", no_wrap=h not in ("layout", "verdict"), key=h == "layout")
            for h in sec.headers
        ],
    )
    for r in sec.rows:
        t.add_row(r)
    buf = io.StringIO()
    con = Console(file=buf, width=width, no_color=True, force_terminal=False)
    for part, w in fit(t, con.width):
        lines = draw(part, w)
        if lines is None:  # a table textable cannot draw exactly as rich would: rich draws it
            con.print(to_rich(part))
        else:
            buf.write("\n".join(lines) + "\n")
    buf.write("".join(f"{x}\n" for x in sec.lines))
    return buf.getvalue()

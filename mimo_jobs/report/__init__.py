"""The scaling-study report: build(con, study) -> Report; render(report, fmt, out) -> text or file path.

Formats: table (rich, the default in the CLI), md, json, csv (one row per run), html (self-contained,
inline SVG plots; opens offline in any browser).
"""

from __future__ import annotations

from pathlib import Path

from .build import ReportError, build
from .model import Report

FORMATS = ("table", "md", "html", "json", "csv")
_EXT = {"table": "txt", "md": "md", "html": "html", "json": "json", "csv": "csv"}

__all__ = ["FORMATS", "Report", "ReportError", "build", "render"]


def render(report: Report, fmt: str, out: Path | None = None) -> str | Path:
    """Render to a string, or write `out`/report.<ext> (out is a directory) and return its path."""
    if fmt not in FORMATS:
        raise ReportError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if fmt == "table":
        from .render_text import render_table

        text = render_table(report)
    elif fmt == "md":
        from .render_text import render_md

        text = render_md(report)
    elif fmt == "json":
        from .render_data import render_json

        text = render_json(report)
    elif fmt == "csv":
        from .render_data import render_csv

        text = render_csv(report)
    else:
        from .render_html import render_html

        text = render_html(report)
    if out is None:
        return text
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ReportError(f"--out {out}: exists and is not a directory")
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"report.{_EXT[fmt]}"
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)  # atomic: a reader never sees half a report
    return path

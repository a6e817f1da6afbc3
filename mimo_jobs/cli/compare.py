"""`mimo-jobs compare BASE OTHER`: two studies, or one study at two code versions (two stores), run by run."""

from __future__ import annotations

from pathlib import Path

import typer

from .output import DB_HELP, OUT_FLAGS, echo_document, fail, reports_errors


def compare_cmd(
    base: str = typer.Argument(..., help="the BASE study (read from --db)"),
    other: str = typer.Argument(..., help="the OTHER study (read from --other-db, else from --db)"),
    db: Path | None = typer.Option(None, "--db", help=DB_HELP),
    other_db: Path | None = typer.Option(
        None, "--other-db", help="the store holding OTHER (one study at two code versions: two stores)"
    ),
    fmt: str = typer.Option("table", "--format", "-f", help="table | md | html | json | csv"),
    out: Path | None = typer.Option(None, *OUT_FLAGS, help="write <out>/compare.<ext> instead of printing"),
    noise_floor: float | None = typer.Option(
        None, "--noise-floor", help="the smallest relative change called a regression, 0 to 1 (default 0.03)"
    ),
) -> None:
    """OTHER against BASE, matched by layout: ratios of iteration time, throughput/GPU, memory and loss at
    equal samples, with each side's code version; regressions beyond the noise are flagged (exit 1)."""
    from mimo_jobs.report import build
    from mimo_jobs.report.render_versus import FORMATS, render
    from mimo_jobs.report.versus import compared, versus
    from mimo_jobs.store.connection import LONG_WAIT_S, connect, db_path

    if fmt not in FORMATS:
        fail(f"--format {fmt!r}: choose one of {', '.join(FORMATS)}")
    from mimo_jobs.report.figures import NOISE_FLOOR

    noise_floor = NOISE_FLOOR if noise_floor is None else noise_floor
    if not 0 <= noise_floor < 1:  # NaN fails too
        fail(f"--noise-floor {noise_floor}: give a share from 0 to 1, e.g. 0.03")
    reports = []
    for study, path in ((base, db), (other, other_db or db)):
        con = connect(path, read_only=True, wait_s=LONG_WAIT_S)
        try:
            reports.append((build(con, study), f"{study} ({db_path(path)})"))
        finally:
            con.close()
    (rb, nb), (ro, no) = reports
    v = versus(rb, ro, nb, no, noise_floor)
    text = render(v, fmt)
    if out is None:
        echo_document(text)
    else:
        path = _write(out, text, fmt)
        typer.echo(f"wrote {path}")
    if not compared(v):  # no verdict at all is no pass
        fail(
            f"nothing compared: {len(v.rows)} run(s) matched by layout, none with a steady-state time on both "
            f"sides; {len(v.unmatched)} unmatched",
            where=f"compare {other} against {base}",
            code=1,
        )
    if any(r.regressions for r in v.rows):
        raise typer.Exit(1)


def _write(out: Path, text: str, fmt: str) -> Path:
    ext = {"table": "txt"}.get(fmt, fmt)
    if out.exists() and not out.is_dir():
        fail("exists and is not a directory", where=f"--out {out}")
    try:
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"compare.{ext}"
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)  # atomic: a reader never sees half a file
    except OSError as e:
        fail(f"cannot write there: {e.strerror or e}", where=f"--out {out}", code=1)
    return path


def register(app: typer.Typer) -> None:
    app.command("compare")(reports_errors(compare_cmd))

"""How the CLI talks to people: consoles that keep whole rows when piped, and one way to report an error.

Every error reaches the user as `error: <where>: <what>` on stderr with an exit code: EXIT_INVALID (2) for
bad input (nothing was written), EXIT_FAILED (1) when something ran and failed. Commands either call
`fail(...)` or let a `MimoJobsError` escape: `reports_errors` (applied to every command by `register`)
prints it the same way with the error's own exit code.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, NoReturn

import typer

from mimo_jobs.errors import MimoJobsError

if TYPE_CHECKING:
    from mimo_jobs.study.diagnose import Problem

EXIT_FAILED = 1
EXIT_INVALID = 2
# Every command that writes files into a directory takes it under the same spellings.
OUT_FLAGS = ("--out", "-o", "--output")
DB_HELP = "DuckDB store file (default: $MIMO_JOBS_DB or ./mimo-jobs.duckdb)."
RUNS_HELP = (
    "Runs root: run dirs go to <root>/<study>/<run name>-<run id>/ (default: $MIMO_JOBS_RUNS_DIR or ./runs)."
)


def console(stderr: bool = False):
    from rich.console import Console

    from mimo_jobs.textsafe import console_width

    stream = sys.stderr if stderr else sys.stdout
    # Piped output (CI logs, files) keeps whole rows instead of rich's 80-column default.
    return Console(stderr=stderr, highlight=False, width=console_width(stream))


def echo_document(text: str) -> None:
    """Print a rendered document (a report's csv, md or json). On a terminal every line goes through the
    visible-text rule (text from logs must not drive the terminal); to a pipe or a file it goes as is, so a
    CSV keeps every name exactly."""
    from mimo_jobs.textsafe import visible

    try:
        tty = sys.stdout.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        tty = False
    if tty:
        text = "\n".join(visible(line) for line in text.split("\n"))
    typer.echo(text, nl=False)


# Runs a command's table shows before it summarises the rest: drawing a rich table costs ~0.5 ms a row and
# pricing a run ~2 ms, so a 10,000-run study would take many seconds to print rows nobody reads one by one.
TABLE_ROWS = 50


def table_runs(runs: list, show_all: bool) -> tuple[list, str | None]:
    """The runs a table shows (the first TABLE_ROWS unless --all) and the line that says what was left out."""
    shown = runs if show_all else runs[:TABLE_ROWS]
    if len(shown) == len(runs):
        return shown, None
    more = (
        f"... and {len(runs) - len(shown):,} more run(s) (--all lists every run; --json prints each in full)"
    )
    return shown, more


def print_json(doc) -> None:
    """A command's JSON: never NaN or Infinity (not JSON; a figure that is not finite is null)."""
    import json

    from mimo_jobs.report.render_data import finite

    typer.echo(json.dumps(finite(doc), indent=2, allow_nan=False))


def _say(text: str) -> None:
    console(stderr=True).print(text, style="red", markup=False, soft_wrap=True)


def fail(what: str, where: str | None = None, code: int = EXIT_INVALID) -> NoReturn:
    """Print `error: <where>: <what>` and exit with `code`."""
    _say(f"error: {where}: {what}" if where else f"error: {what}")
    raise typer.Exit(code)


def print_problems(source: str, problems: list[Problem]) -> None:
    """Every problem of a study or a render, one per line, with the value that would fit."""
    con = console(stderr=True)
    con.print(f"error: {source}: {len(problems)} problem(s)", style="bold red", markup=False)
    for p in problems:
        fit = f"\n      -> {p.fit}" if p.fit else ""
        con.print(f"  {p.path}: [{p.rule}] {p.message}{fit}", markup=False, soft_wrap=True)


def fail_problems(source: str, problems: list[Problem]) -> NoReturn:
    print_problems(source, problems)
    raise typer.Exit(EXIT_INVALID)


def fail_with(err: MimoJobsError) -> NoReturn:
    problems = getattr(err, "problems", None)
    if problems and all(hasattr(p, "rule") for p in problems):  # a render's problems, listed like validate's
        fail_problems(err.where or "render", problems)
    fail(err.describe(), code=err.exit_code)


def reports_errors(command: Callable) -> Callable:
    """Wrap a command so that a MimoJobsError it raises is reported by `fail_with`."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except MimoJobsError as e:
            fail_with(e)
        except Exception as e:
            if not _from_duckdb(e):
                raise
            # a damaged store can open cleanly and fail only when a query reaches the bad part
            from mimo_jobs.store.connection import db_path
            from mimo_jobs.store.errors import explain

            fail_with(explain(e, db_path(kwargs.get("db"))))

    return wrapper


def _from_duckdb(e: BaseException) -> bool:
    return type(e).__module__.split(".")[0] in ("duckdb", "_duckdb")

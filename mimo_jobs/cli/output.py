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
DB_HELP = "DuckDB store file (default: $MIMO_JOBS_DB or ./mimo-jobs.duckdb)."
RUNS_HELP = "Runs root: run dirs go to <root>/<study>/<run>/ (default: $MIMO_JOBS_RUNS_DIR or ./runs)."


def console(stderr: bool = False):
    from rich.console import Console

    from mimo_jobs.textsafe import console_width

    stream = sys.stderr if stderr else sys.stdout
    # Piped output (CI logs, files) keeps whole rows instead of rich's 80-column default.
    return Console(stderr=stderr, highlight=False, width=console_width(stream))


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

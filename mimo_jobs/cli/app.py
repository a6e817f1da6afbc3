"""The `mimo-jobs` command line. Commands live in mimo_jobs/cli/*, one module per command group; each keeps
its heavy imports (duckdb, submitit, torch) inside the command body so `mimo-jobs --help` starts fast.
Errors are reported one way, by `cli.output`."""

from __future__ import annotations

import typer

from mimo_jobs import __version__

from . import compare, data, export, jobs, plan, predict, results, study

app = typer.Typer(
    name="mimo-jobs",
    help="Scaling studies of heterogeneous multimodal (MIMO) training: validate, render, submit, ingest, report.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

for _mod in (study, predict, plan, jobs, results, compare, data, export):
    _mod.register(app)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"mimo-jobs {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """mimo-jobs: study file -> validated sbatch/torchrun scripts -> jobs -> DuckDB -> scaling report."""


def main() -> None:
    app()


if __name__ == "__main__":
    main()

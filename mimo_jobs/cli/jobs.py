"""`submit`, `status`, `cancel` and `demo`: studies -> scheduler jobs recorded in the store, followed to the end.

Exit codes: 0 ok, 1 a job ended badly (--wait/demo) or the scheduler refused, 2 bad input.
Heavy imports (duckdb, submitit, rich.live) stay inside the commands so `mimo-jobs --help` starts fast.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Optional

import typer

from .plan import EXIT_INVALID, _console, _diagnose, _print_problems

EXIT_FAILED = 1
DB_HELP = "DuckDB store file (default: $MIMO_JOBS_DB or ./mimo-jobs.duckdb)."
RUNS_HELP = "Runs root: run dirs go to <root>/<study>/<run>/ (default: $MIMO_JOBS_RUNS_DIR or ./runs)."


def _runs_dir(d: Path | None) -> Path:
    return Path(d or os.environ.get("MIMO_JOBS_RUNS_DIR") or "runs")


def _err(msg: str, code: int = EXIT_INVALID):
    _console(stderr=True).print(msg, style="red", markup=False, soft_wrap=True)
    raise typer.Exit(code)


def _fmt_elapsed(s: float | None) -> str:
    if s is None:
        return "-"
    s = int(s)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


_STYLE = {"COMPLETED": "green", "RUNNING": "cyan", "PENDING": "yellow", "SUBMITTED": "yellow",
          "FAILED": "red", "TIMEOUT": "red", "CANCELLED": "magenta", "NODE_FAIL": "red", "OUT_OF_MEMORY": "red"}


def status_table(statuses, title: str):
    from rich.table import Table
    from rich.text import Text

    t = Table(title=title, title_justify="left")
    for col, just in (("run", "left"), ("nodes", "right"), ("executor", "left"), ("job", "left"),
                      ("state", "left"), ("attempt", "right"), ("elapsed", "right"), ("iteration", "right"),
                      ("loss", "right"), ("checkpoint", "right"), ("reason", "left")):
        t.add_column(col, justify=just, overflow="fold")
    for s in statuses:
        j = s.job
        it = "-" if s.iteration is None else f"{s.iteration}/{s.train_iters or '?'}"
        loss = "-" if s.loss is None else f"{s.loss:.4f}"
        reason = ""
        if j is not None and j.state not in ("COMPLETED",) and not j.active:
            reason = (j.reason or "") + (f" | {j.first_error}" if j.first_error else "")
        state = Text(j.state if j else "not submitted", style=_STYLE.get(j.state if j else "", ""))
        t.add_row(s.run if len(statuses) < 2 or s.study == statuses[0].study else f"{s.study}/{s.run}",
                  str(s.nodes), j.executor if j else "-", j.job_id if j else "-", state,
                  str(j.attempt) if j else "-", _fmt_elapsed(j.elapsed_s() if j else None), it, loss,
                  "-" if s.checkpoint is None else str(s.checkpoint), reason)
    return t


def _study_name(study: str | None) -> str | None:
    """STUDY may be a study file or a study name."""
    if study is None:
        return None
    p = Path(study)
    if p.suffix in (".yaml", ".yml") and p.is_file():
        diag = _diagnose(p)
        if diag.study is None:
            _print_problems(diag.source, diag.problems)
            raise typer.Exit(EXIT_INVALID)
        return diag.study.name
    return study


def follow(db: Path | None, study: str | None, title: str, interval: float = 2.0) -> list:
    """Refresh + live table until every run (of the study, or of the store) has ended: submit --wait,
    status --watch, demo. The store is opened per refresh and closed while sleeping, so another
    `mimo-jobs status` (DuckDB allows one writer at a time) is never locked out for long."""
    from rich.console import Group
    from rich.live import Live
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from mimo_jobs.submit import status
    from mimo_jobs.submit import launch
    from mimo_jobs.store.connection import connect

    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    task = progress.add_task(f"{study or 'all studies'}: runs ended", total=None)
    with Live(console=_console(), refresh_per_second=4, transient=False) as live:
        while True:
            con = connect(db)
            try:
                launch.refresh(con, study)
                sts = status.run_statuses(con, study)
            finally:
                con.close()
            ended = sum(1 for s in sts if s.job is not None and not s.job.active)
            progress.update(task, total=len(sts), completed=ended)
            live.update(Group(status_table(sts, title), progress))
            if all(s.job is None or not s.job.active for s in sts):
                return sts
            time.sleep(interval)


def submit(
    study_file: Path = typer.Argument(..., help="Study YAML file."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Render and print what would be submitted; submit nothing."),
    only: Optional[list[str]] = typer.Option(  # noqa: UP045 (typer needs Optional on 3.10)
        None, "--only", help="Submit only this run (name or run id); repeatable."),
    executor_name: Optional[str] = typer.Option(  # noqa: UP045
        None, "--executor", help="slurm or local (default: the study's cluster.executor)."),
    force: bool = typer.Option(False, "--force", help="Submit runs that are pending, running or completed again."),
    runs_dir: Optional[Path] = typer.Option(None, "--runs-dir", help=RUNS_HELP),  # noqa: UP045
    db: Optional[Path] = typer.Option(None, "--db", help=DB_HELP),  # noqa: UP045
    wait: bool = typer.Option(False, "--wait", help="Follow the jobs until they end; exit 1 if one did not complete."),
    templates: Optional[Path] = typer.Option(  # noqa: UP045
        None, "--templates", help="Directory whose sbatch.sh.j2 / launch.sh.j2 override the packaged ones."),
) -> None:
    """Render and submit a study's runs (skips runs already pending, running or completed)."""
    from mimo_jobs.submit import launch
    from mimo_jobs.submit.executors import SubmitError
    from mimo_jobs.plan.render import RenderError
    from mimo_jobs.store.connection import connect, db_path

    diag = _diagnose(study_file)
    if not diag.ok or diag.study is None:
        _print_problems(diag.source, diag.problems)
        raise typer.Exit(EXIT_INVALID)
    study, source = diag.study, diag.source
    ex_name = executor_name or study.cluster.executor
    if ex_name not in ("slurm", "local"):
        _err(f"--executor {ex_name!r}: use slurm or local")
    try:
        runs = launch.select_runs(diag.runs, only, source)
        launch.check_executor(runs, ex_name)
    except launch.LaunchError as e:
        _err(str(e))
    root = _runs_dir(runs_dir)
    out = _console()

    if dry_run:
        # Read the store if there is one (which runs would be skipped), never write it.
        sel = launch.Selection(submit=runs)
        if db_path(db).exists():
            con = connect(db, read_only=True)
            if "action" in {c[0] for c in con.execute("DESCRIBE jobs").fetchall()}:
                sel = launch.plan_submit(con, runs, force)
            con.close()
        try:
            prepared = launch.prepare(sel.submit, root, ex_name, templates)
        except RenderError as e:
            _print_problems(source, e.problems)
            raise typer.Exit(EXIT_INVALID) from None
        for r, j in sel.keep:
            out.print(f"skip {r.name}: job {j.job_id} is {j.state} (--force submits it again)", markup=False)
        ex = launch.executor(ex_name)
        for p in prepared:
            out.rule(f"{p.spec.name} ({p.spec.run_id}): {p.script}", characters="=")
            out.print("$ " + " ".join(ex.submit_command(p.rd)), markup=False, soft_wrap=True)
            out.print(p.script.read_text(), markup=False, highlight=False, soft_wrap=True)
        out.print(f"dry run: {len(prepared)} run(s) would be submitted with --executor {ex_name}, "
                  f"{len(sel.keep)} skipped; nothing submitted", markup=False)
        return

    con = connect(db)
    launch.refresh(con, study.name)  # settles earlier jobs so 'keep' sees their final states
    sel = launch.plan_submit(con, runs, force)
    for r, j in sel.keep:
        out.print(f"skip {r.name}: job {j.job_id} is {j.state} (--force submits it again)", markup=False)
    try:
        prepared = launch.prepare(sel.submit, root, ex_name, templates)
    except RenderError as e:
        _print_problems(source, e.problems)
        raise typer.Exit(EXIT_INVALID) from None
    ex = launch.executor(ex_name)

    def said(s: launch.Submitted) -> None:
        out.print(f"submitted {s.spec.name} ({s.spec.run_id}) as {ex_name} job {s.job_id}, attempt {s.attempt}",
                  markup=False)

    try:
        launch.submit_runs(con, study, str(Path(source).resolve()), prepared, sel, ex, on_submit=said)
    except (launch.LaunchError, SubmitError) as e:
        _err(str(e), EXIT_FAILED)
    if not prepared:
        out.print(f"{study.name}: nothing to submit ({len(sel.keep)} run(s) pending, running or completed)",
                  markup=False)
    con.close()
    if wait:
        sts = follow(db, study.name, f"{study.name} ({db_path(db)})")
        if any(s.job is None or s.job.state != "COMPLETED" for s in sts):
            raise typer.Exit(EXIT_FAILED)


def status(
    study: Optional[str] = typer.Argument(None, help="Study name or file (default: every study in the store)."),  # noqa: UP045
    watch: bool = typer.Option(False, "--watch", help="Refresh continuously until every job has ended."),
    interval: float = typer.Option(2.0, "--interval", help="Seconds between refreshes with --watch."),
    db: Optional[Path] = typer.Option(None, "--db", help=DB_HELP),  # noqa: UP045
) -> None:
    """State, attempt, elapsed time, last iteration and loss of every run (polls the scheduler, ingests
    finished runs)."""
    from mimo_jobs.submit import status
    from mimo_jobs.submit import launch
    from mimo_jobs.store.connection import connect, db_path

    name = _study_name(study)
    if not db_path(db).exists():
        _err(f"no store at {db_path(db)} (submit something first, or pass --db)")
    con = connect(db)
    if name is not None and not con.execute("SELECT 1 FROM runs WHERE study = ?", [name]).fetchone():
        known = ", ".join(r[0] for r in con.execute("SELECT DISTINCT study FROM runs ORDER BY 1").fetchall())
        _err(f"study {name!r} has no runs in {db_path(db)} (known: {known or 'none'})")
    title = f"{name or 'all studies'} ({db_path(db)})"
    if watch:
        con.close()
        follow(db, name, title, interval)
        return
    launch.refresh(con, name)
    _console().print(status_table(status.run_statuses(con, name), title))


def cancel(
    study: str = typer.Argument(..., help="Study name or file."),
    run: Optional[str] = typer.Option(None, "--run", help="Cancel only this run (name or run id)."),  # noqa: UP045
    db: Optional[Path] = typer.Option(None, "--db", help=DB_HELP),  # noqa: UP045
) -> None:
    """Cancel the pending/running jobs of a study (or of one run): scancel, or stop the local runner."""
    from mimo_jobs.submit import launch
    from mimo_jobs.store.connection import connect, db_path

    name = _study_name(study)
    if not db_path(db).exists():
        _err(f"no store at {db_path(db)} (pass --db)")
    con = connect(db)
    launch.refresh(con, name)
    try:
        done = launch.cancel(con, name, run)
    except launch.LaunchError as e:
        _err(str(e))
    out = _console()
    for run_name, job_id, ex in done:
        out.print(f"cancelled {run_name}: {ex} job {job_id}", markup=False)
    if not done:
        out.print(f"{name}: no pending or running job to cancel", markup=False)


def demo(
    db: Optional[Path] = typer.Option(None, "--db", help=DB_HELP),  # noqa: UP045
    runs_dir: Optional[Path] = typer.Option(None, "--runs-dir", help=RUNS_HELP),  # noqa: UP045
    study_file: Optional[Path] = typer.Option(  # noqa: UP045
        None, "--study", help="Study to run instead of the packaged cpu_local.yaml."),
) -> None:
    """The main job: run the packaged CPU study locally, follow it, ingest it and print the scaling report."""
    from mimo_jobs.submit import launch
    from mimo_jobs.submit.executors import SubmitError
    from mimo_jobs.plan.render import RenderError, packaged_studies
    from mimo_jobs.store.connection import connect, db_path

    path = study_file or packaged_studies() / "cpu_local.yaml"
    diag = _diagnose(path)
    if not diag.ok or diag.study is None:
        _print_problems(diag.source, diag.problems)
        raise typer.Exit(EXIT_INVALID)
    study, root = diag.study, _runs_dir(runs_dir)
    try:
        launch.check_executor(diag.runs, "local")
    except launch.LaunchError as e:
        _err(str(e))
    out = _console()
    out.print(f"demo: study {study.name} ({len(diag.runs)} runs, {path}) on this machine; store {db_path(db)}, "
              f"runs under {root}", markup=False)
    con = connect(db)
    launch.refresh(con, study.name)
    sel = launch.plan_submit(con, diag.runs, force=False)
    try:
        prepared = launch.prepare(sel.submit, root, "local")
        launch.submit_runs(con, study, str(Path(path).resolve()), prepared, sel, launch.executor("local"))
    except RenderError as e:
        _print_problems(diag.source, e.problems)
        raise typer.Exit(EXIT_INVALID) from None
    except (launch.LaunchError, SubmitError) as e:
        _err(str(e), EXIT_FAILED)
    con.close()
    sts = follow(db, study.name, f"{study.name} ({db_path(db)})")
    con = connect(db)
    launch.ingest_runs(con, [launch.RunDir(Path(s.run_dir)) for s in sts if s.run_dir])
    from mimo_jobs import report

    try:
        typer.echo(report.render(report.build(con, study.name), "table"))
    except report.ReportError as e:
        _err(f"demo: report: {e}", EXIT_FAILED)
    bad = [s for s in sts if s.job is None or s.job.state != "COMPLETED"]
    if bad:
        _err("demo: " + ", ".join(f"{s.run} {s.job.state if s.job else 'not submitted'}" for s in bad), EXIT_FAILED)


def register(app: typer.Typer) -> None:
    app.command("submit")(submit)
    app.command("status")(status)
    app.command("cancel")(cancel)
    app.command("demo")(demo)

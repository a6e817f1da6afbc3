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

from .output import DB_HELP, EXIT_FAILED, RUNS_HELP, console, fail, fail_problems, reports_errors
from .study import diagnose_file, study_or_fail


def _runs_dir(d: Path | None) -> Path:
    return Path(d or os.environ.get("MIMO_JOBS_RUNS_DIR") or "runs")


def _fmt_elapsed(s: float | None) -> str:
    if s is None:
        return "-"
    s = int(s)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def _style(state: str | None) -> str:
    """A state's colour, by what the job-state table (contract/jobstates.py) says it is."""
    from mimo_jobs.contract import jobstates

    if state is None:
        return ""
    if state in (jobstates.RUNNING, jobstates.CANCELLED):
        return {jobstates.RUNNING: "cyan", jobstates.CANCELLED: "magenta"}[state]
    if jobstates.is_success(state):
        return "green"
    return "yellow" if jobstates.is_active(state) else "red"


def _ingest_runs(con, rds: list) -> None:
    """Ingest run dirs (idempotent) so the policy, status and report read the store. A run dir ingest
    refuses (e.g. its run.yaml was removed) is reported and skipped: following jobs goes on."""
    import sys

    from mimo_jobs.ingest.pipeline import IngestError, ingest_paths

    for rd in rds:
        try:
            ingest_paths(con, [rd.root])
        except IngestError as e:
            print(f"mimo-jobs: not ingested {rd.root}: {e}", file=sys.stderr)


def _explain(text: str) -> str | None:
    from mimo_jobs.ingest.events import first_error  # its patterns compile at import: only settling pays

    return first_error(text)


def _refresh(con, study: str | None) -> list[str]:
    """Poll, ingest what ended, settle it: the submit service with ingest's steps passed in."""
    from mimo_jobs.submit import service

    return service.refresh(con, study, service.Follow(ingest=_ingest_runs, explain=_explain))


def status_table(statuses, title: str, failing: dict | None = None, problems: dict | None = None):
    """The runs' table; `failing`: (run id, job id) -> the failing line triage found in the job's events;
    `problems`: run id -> what is wrong with the run's own files (a damaged submit intent), in its row.
    A name that several runs share (a resubmission) gets a run id column; a superseded run says so."""
    from rich.table import Table
    from rich.text import Text

    failing = failing or {}
    names = [(s.study, s.run) for s in statuses]
    repeated = len(set(names)) < len(names)
    t = Table(title=title, title_justify="left")
    for col, just in (
        ("run", "left"),
        *((("run id", "left"),) if repeated else ()),
        ("nodes", "right"),
        ("executor", "left"),
        ("job", "left"),
        ("state", "left"),
        ("attempt", "right"),
        ("elapsed", "right"),
        ("iteration", "right"),
        ("loss", "right"),
        ("checkpoint", "right"),
        ("reason", "left"),
    ):
        t.add_column(col, justify=just, overflow="fold")
    for s in statuses:
        j = s.job
        it = "-" if s.iteration is None else f"{s.iteration}/{s.train_iters or '?'}"
        loss = "-" if s.loss is None else f"{s.loss:.4f}"
        reason = ""
        if j is not None and not j.active and not _is_success(j.state):
            why = failing.get((s.run_id, j.job_id)) or j.first_error
            reason = (j.reason or "") + (f" | {why}" if why else "")
        elif j is not None and j.active and j.reason:
            # why an active job waits or runs unusually, as its executor says: SLURM's pending reason,
            # Kueue's or a pod's (ImagePullBackOff, CrashLoopBackOff), a local job's lost runner
            reason = j.reason
        state = Text(j.state if j else "not submitted", style=_style(j.state if j else None))
        if s.shown_superseded:
            state = Text("superseded", style="dim")
            was = j.state if j else "not submitted"
            reason = f"{was}; latest attempt: run {s.superseded_by}"
        if (problems or {}).get(s.run_id):
            reason = (reason + " | " if reason else "") + problems[s.run_id]
        t.add_row(
            _plain(s.run if len(statuses) < 2 or s.study == statuses[0].study else f"{s.study}/{s.run}"),
            *((_plain(s.run_id),) if repeated else ()),
            "-" if s.nodes is None else str(s.nodes),
            j.executor if j else "-",
            _plain(j.job_id if j else "-"),
            state,
            str(j.attempt) if j else "-",
            _fmt_elapsed(j.elapsed_s() if j else None),
            it,
            loss,
            "-" if s.checkpoint is None else str(s.checkpoint),
            _plain(reason),
        )
    return t


def failing_lines(con, statuses) -> dict[tuple[str, str], str]:
    """(run id, job id) -> the failing line of each ended, failed job: report triage's verdict on the
    events ingest stored for the job (the rank and its exception line), where it stored any."""
    from mimo_jobs.report.queries import job_events
    from mimo_jobs.report.triage import triage

    keys = [
        (s.run_id, s.job.job_id)
        for s in statuses
        if s.job is not None and not s.job.active and not _is_success(s.job.state) and not s.shown_superseded
    ]
    found = job_events(con, keys)
    return {k: triage(found[k]).reason for k in keys if found.get(k)}


def _is_success(state: str | None) -> bool:
    from mimo_jobs.contract import jobstates

    return state is not None and jobstates.is_success(state)


def _plain(text: str):
    """Names and log excerpts as literal text: never rich markup, escape sequences shown, not obeyed."""
    from rich.text import Text

    from mimo_jobs.textsafe import visible

    return Text(visible(text))


def _study_name(study: str | None) -> str | None:
    """STUDY may be a study file or a study name; a path that exists but is no file (a directory, a FIFO)
    is neither and is refused before anything is opened (reading a FIFO would hang)."""
    if study is None:
        return None
    p = Path(study)
    if p.suffix in (".yaml", ".yml") and p.is_file():
        diag = diagnose_file(p)
        if diag.study is None:
            fail_problems(diag.source, diag.problems)
        return diag.study.name
    if p.suffix in (".yaml", ".yml") or os.sep in study:
        _regular_file(p)
    return study


def _regular_file(p: Path) -> None:
    """A study file argument that exists but is a directory or a FIFO/device is refused (reading a FIFO
    would block forever); a missing one is left to the study loader, which says so."""
    if p.exists() and not p.is_file():
        fail(f"{p}: not a study file ({'a directory' if p.is_dir() else 'not a regular file'})")


def _check_study(con, name: str | None, db: Path | None) -> None:
    """An unknown study name is an error that lists the studies the store knows (status and cancel alike)."""
    from mimo_jobs.store.connection import db_path

    if name is None or con.execute("SELECT 1 FROM runs WHERE study = ?", [name]).fetchone():
        return
    known = ", ".join(r[0] for r in con.execute("SELECT DISTINCT study FROM runs ORDER BY 1").fetchall())
    con.close()
    looks_like_file = Path(name).suffix in (".yaml", ".yml")
    what = "no study file or study" if looks_like_file else "study"
    fail(f"{what} {name!r}: no runs in {db_path(db)} (known: {known or 'none'})")


def _check_interval(interval: float) -> None:
    if not 0.1 <= interval <= 86_400:  # NaN fails too
        fail(f"--interval {interval}: give seconds between refreshes, from 0.1 to 86400")


def follow(db: Path | None, study: str | None, title: str, interval: float = 2.0) -> list:
    """Refresh + live table until every run (of the study, or of the store) has ended: submit --wait,
    status --watch, demo. The store is opened per refresh and closed while sleeping, so another
    `mimo-jobs status` (DuckDB allows one writer at a time) is never locked out for long."""
    from rich.console import Group
    from rich.live import Live
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    out = console()
    if not out.is_terminal:
        # A pipe or a file gets the final table once and a whole progress line: rich's live display
        # would end its bar without a newline, running it into whatever is printed next.
        while not _all_ended((sts := _poll(db, study))[0]):
            time.sleep(interval)
        sts, failing = sts
        out.print(status_table(sts, title, failing))
        out.print(f"{study or 'all studies'}: runs ended {_ended(sts)}/{len(sts)}", markup=False)
        return sts
    progress = Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()
    )
    task = progress.add_task(f"{study or 'all studies'}: runs ended", total=None)
    with Live(console=out, refresh_per_second=4, transient=False) as live:
        while True:
            sts, failing = _poll(db, study)
            progress.update(task, total=len(sts), completed=_ended(sts))
            live.update(Group(status_table(sts, title, failing), progress))
            if _all_ended(sts):
                return sts
            time.sleep(interval)


def _poll(db: Path | None, study: str | None) -> tuple[list, dict]:
    """One refresh of the store from the scheduler, the runs' statuses and their failing lines."""
    from mimo_jobs.store.connection import connect
    from mimo_jobs.submit import status

    con = connect(db)
    try:
        _refresh(con, study)
        sts = status.run_statuses(con, study)
        return sts, failing_lines(con, sts)
    finally:
        con.close()


def _ended(sts: list) -> int:
    return sum(1 for s in sts if s.job is not None and not s.job.active)


def _all_ended(sts: list) -> bool:
    return all(s.job is None or not s.job.active for s in sts)


def submit(
    study_file: Path = typer.Argument(..., help="Study YAML file."),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Render and print what would be submitted; submit nothing."
    ),
    only: Optional[list[str]] = typer.Option(  # noqa: UP045 (typer needs Optional on 3.10)
        None, "--only", help="Submit only this run (name or run id); repeatable."
    ),
    executor_name: Optional[str] = typer.Option(  # noqa: UP045
        None,
        "--executor",
        help="An executor's name, e.g. slurm or local (another is refused with the list of them); default: "
        "the study's cluster.executor.",
    ),
    force: bool = typer.Option(
        False,
        "--force",
        help="Ask for every run again: a pending or running one is still kept, and a completed one is refused "
        "with what to do instead (never run twice: its job would replace what it measured). Failed and "
        "cancelled runs are submitted again without it.",
    ),
    runs_dir: Optional[Path] = typer.Option(None, "--runs-dir", help=RUNS_HELP),  # noqa: UP045
    db: Optional[Path] = typer.Option(None, "--db", help=DB_HELP),  # noqa: UP045
    wait: bool = typer.Option(
        False,
        "--wait",
        help="Follow the jobs until they end; exit 1 if the latest attempt of a run did not complete.",
    ),
    templates: Optional[Path] = typer.Option(  # noqa: UP045
        None, "--templates", help="Directory whose sbatch.sh.j2 / launch.sh.j2 override the packaged ones."
    ),
) -> None:
    """Render and submit a study's runs (skips runs already pending, running or completed)."""
    from mimo_jobs.store.connection import db_path

    _regular_file(study_file)
    diag = study_or_fail(study_file)
    ex_name = _executor_name(executor_name or diag.study.cluster.executor)
    runs = _selected_runs(diag, only, ex_name)
    root = _runs_dir(runs_dir)
    if dry_run:
        _dry_run(diag, runs, root, ex_name, templates, db, force)
        return
    _submit_for_real(diag, runs, root, ex_name, templates, db, force)
    if wait:
        from mimo_jobs.submit.status import unfinished

        sts = follow(db, diag.study.name, f"{diag.study.name} ({db_path(db)})")
        if unfinished(sts):  # the latest attempt of each point: an earlier, superseded failure does not count
            raise typer.Exit(EXIT_FAILED)


def _executor_name(name: str) -> str:
    from mimo_jobs.submit.executors.registry import REGISTRY, names

    if name not in REGISTRY:
        fail(f"--executor {name!r}: use one of {names()}")
    return name


def _selected_runs(diag, only: list[str] | None, ex_name: str) -> list:
    """The runs --only names (all by default), checked to suit the executor."""
    from mimo_jobs.submit import service

    runs = service.select_runs(diag.runs, only, diag.source)
    service.check_executor(runs, ex_name)
    return runs


def _print_kept(sel) -> None:
    from mimo_jobs.contract import jobstates

    for r, j in sel.keep:
        again = (
            ""
            if j.state in jobstates.ACTIVE
            else " (the latest attempt of its point again; a completed run is not run twice)"
        )
        console().print(f"skip {r.name}: job {j.job_id} is {j.state}{again}", markup=False)
    for note in sel.notes:  # runs that continue a completed one
        console().print(note, markup=False, soft_wrap=True)


def _prepare(diag, runs: list, root: Path, ex_name: str, templates: Path | None) -> list:
    """Render the runs' directories; a render problem is reported like validate's."""
    from mimo_jobs.study.render import RenderError
    from mimo_jobs.submit import service

    try:
        return service.prepare(runs, root, ex_name, templates)
    except RenderError as e:
        fail_problems(diag.source, e.problems)


def _dry_run(
    diag, runs: list, root: Path, ex_name: str, templates: Path | None, db: Path | None, force: bool
) -> None:
    """Print each script that would be submitted and the command that would submit it. Scripts are rendered
    in memory; only an executor's own manifests (the Kubernetes executor's trainjob.yaml) are written, into
    the run directories, so they can be applied by hand; no store, nothing else."""
    from mimo_jobs.store.connection import connect, db_path
    from mimo_jobs.submit import service

    sel = service.Selection(submit=runs)
    if db_path(db).exists():  # which runs would be skipped: read the store, never write it
        con = connect(db, read_only=True)
        if "action" in {c[0] for c in con.execute("DESCRIBE jobs").fetchall()}:
            sel = service.plan_submit(con, runs, force)
        con.close()
    from mimo_jobs.study.render import RenderError

    try:
        prepared = service.preview(sel.submit, root, ex_name, templates)
    except RenderError as e:
        fail_problems(diag.source, e.problems)
    _print_kept(sel)
    out, ex = console(), service.executor(ex_name)
    for p in prepared:
        for path, text in p.own_files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            out.print(f"wrote {path}", markup=False, soft_wrap=True)
        out.rule(f"{p.spec.name} ({p.spec.run_id}): {p.script}", characters="=")
        out.print("$ " + " ".join(ex.submit_command(p.rd)), markup=False, soft_wrap=True)
        out.print(p.text, markup=False, highlight=False, soft_wrap=True)
        if p.command is not None:  # launch.sh runs it under torchrun on every node
            out.print(
                f"# training command (launch.sh, torchrun --no-python): {p.command}",
                markup=False,
                soft_wrap=True,
            )
    out.print(
        f"dry run: {len(prepared)} run(s) would be submitted with --executor {ex_name}, "
        f"{len(sel.keep)} skipped; nothing submitted",
        markup=False,
    )


def _submit_for_real(
    diag, runs: list, root: Path, ex_name: str, templates: Path | None, db: Path | None, force: bool
) -> None:
    """Settle earlier jobs, then render and submit the runs that need a job, recording each in the store."""
    from mimo_jobs.store.connection import connect
    from mimo_jobs.submit import service

    study, out = diag.study, console()
    con = connect(db)
    try:
        _refresh(con, study.name)  # settles earlier jobs so 'keep' sees their final states
        sel = service.plan_submit(con, runs, force)
        _print_kept(sel)
        prepared = _prepare(diag, sel.submit, root, ex_name, templates)

        def said(s: service.Submitted) -> None:
            out.print(
                f"submitted {s.spec.name} ({s.spec.run_id}) as {ex_name} job {s.job_id}, attempt {s.attempt}",
                markup=False,
            )

        service.submit_runs(
            con,
            study,
            str(Path(diag.source).resolve()),
            prepared,
            sel,
            service.executor(ex_name),
            on_submit=said,
        )
        if not prepared:
            out.print(
                f"{study.name}: nothing to submit ({len(sel.keep)} run(s) pending, running or completed)",
                markup=False,
            )
    finally:
        con.close()


def _open_existing_store(db: Path | None):
    from mimo_jobs.store.connection import connect, db_path

    if not db_path(db).exists():
        fail(f"no store at {db_path(db)} (submit something first, or pass --db)")
    return connect(db)


def status(
    study: str | None = typer.Argument(None, help="Study name or file (default: every study in the store)."),  # noqa: UP045
    watch: bool = typer.Option(False, "--watch", help="Refresh continuously until every job has ended."),
    interval: float = typer.Option(2.0, "--interval", help="Seconds between refreshes with --watch."),
    db: Optional[Path] = typer.Option(None, "--db", help=DB_HELP),  # noqa: UP045
) -> None:
    """State, attempt, elapsed time, last iteration and loss of every run (polls the scheduler, ingests
    finished runs)."""
    from mimo_jobs.store.connection import db_path
    from mimo_jobs.submit import service
    from mimo_jobs.submit import status as run_status
    from mimo_jobs.submit.lineage import study_links
    from mimo_jobs.textsafe import visible

    _check_interval(interval)
    name = _study_name(study)
    con = _open_existing_store(db)
    _check_study(con, name, db)
    title = f"{name or 'all studies'} ({db_path(db)})"
    if watch:
        con.close()
        follow(db, name, title, interval)
        return
    _refresh(con, name)
    statuses = run_status.run_statuses(con, name)
    out = console()
    problems = service.intent_problems(con, name)
    out.print(status_table(statuses, title, failing_lines(con, statuses), problems))
    for link in study_links(con, name):  # runs that started from another run's checkpoint
        out.print(visible(f"lineage: {link.line()}"), markup=False, soft_wrap=True)
    for cmd in run_status.tensorboard_commands(statuses):
        out.print(f"live curves: {cmd}", markup=False, soft_wrap=True)


def cancel(
    study: str = typer.Argument(..., help="Study name or file."),
    run: Optional[str] = typer.Option(None, "--run", help="Cancel only this run (name or run id)."),  # noqa: UP045
    db: Optional[Path] = typer.Option(None, "--db", help=DB_HELP),  # noqa: UP045
) -> None:
    """Cancel the pending/running jobs of a study (or of one run): scancel, or stop the local runner."""
    from mimo_jobs.submit import service

    name = _study_name(study)
    con = _open_existing_store(db)
    _check_study(con, name, db)
    _refresh(con, name)
    done = service.cancel(con, name, run)
    out = console()
    for run_name, job_id, ex in done:
        out.print(f"cancelled {run_name}: {ex} job {job_id}", markup=False)
    if not done:
        out.print(f"{name}: no pending or running job to cancel", markup=False)


def demo(
    db: Optional[Path] = typer.Option(None, "--db", help=DB_HELP),  # noqa: UP045
    runs_dir: Optional[Path] = typer.Option(None, "--runs-dir", help=RUNS_HELP),  # noqa: UP045
    study_file: Optional[Path] = typer.Option(  # noqa: UP045
        None, "--study", help="Study to run instead of the packaged cpu_local.yaml."
    ),
) -> None:
    """The main job: run the packaged CPU study locally, follow it, ingest it and print the scaling report."""
    from mimo_jobs import report
    from mimo_jobs.store.connection import connect, db_path
    from mimo_jobs.study.render import packaged_studies
    from mimo_jobs.submit import service

    path = study_file or packaged_studies() / "cpu_local.yaml"
    _regular_file(path)
    diag = study_or_fail(path)
    root = _runs_dir(runs_dir)
    service.check_executor(diag.runs, "local")
    console().print(
        f"demo: study {diag.study.name} ({len(diag.runs)} runs, {path}) on this machine; store "
        f"{db_path(db)}, runs under {root}",
        markup=False,
    )
    _submit_for_real(diag, diag.runs, root, "local", None, db, force=False)
    sts = follow(db, diag.study.name, f"{diag.study.name} ({db_path(db)})")
    con = connect(db)
    try:
        _ingest_runs(con, [service.RunDir(Path(s.run_dir)) for s in sts if s.run_dir])
        try:
            typer.echo(report.render(report.build(con, diag.study.name), "table"))
        except report.ReportError as e:
            fail(str(e), "demo: report", EXIT_FAILED)
    finally:
        con.close()
    from mimo_jobs.submit.status import unfinished

    bad = unfinished(sts)
    if bad:
        fail(
            ", ".join(f"{s.run} {s.job.state if s.job else 'not submitted'}" for s in bad),
            "demo",
            EXIT_FAILED,
        )


def register(app: typer.Typer) -> None:
    for name, command in (("submit", submit), ("status", status), ("cancel", cancel), ("demo", demo)):
        app.command(name)(reports_errors(command))

"""`mimo-jobs ingest` and `mimo-jobs report`: logs -> DuckDB -> scaling report."""

from __future__ import annotations

from pathlib import Path

import typer

from .output import DB_HELP, OUT_FLAGS, echo_document, fail, reports_errors


def ingest_cmd(
    paths: list[Path] = typer.Argument(
        ..., help="run dirs (with run.yaml), trees of run dirs, or log / metrics.jsonl / sacct files"
    ),
    db: Path | None = typer.Option(None, "--db", help=DB_HELP),
    force: bool = typer.Option(
        False, "--force", help="re-read files even if unchanged since the last ingest"
    ),
    study: str = typer.Option("logs", "--study", help="study name for logs without a run.yaml"),
    name: str | None = typer.Option(
        None,
        "--name",
        help="run name for logs without a run.yaml (all given files become attempts of this one run)",
    ),
    nodes: int | None = typer.Option(None, "--nodes", min=1, help="node count of logs without a run.yaml"),
    gpus_per_node: int | None = typer.Option(None, "--gpus-per-node", min=1, help="GPUs per node, ditto"),
    seq_length: int | None = typer.Option(None, "--seq-length", min=1, help="sequence length, ditto"),
    layout: str | None = typer.Option(
        None,
        "--layout",
        help="parallel layout of logs without a run.yaml: 'enc tp1 dp8 | llm tp2 ep8 dp128' (no enc part: "
        "colocated; gbsN may follow), or STUDY.yaml:RUN to take a study run's layout",
    ),
    model: str | None = typer.Option(
        None,
        "--model",
        help="model of logs without a run.yaml, as trainer.model takes it (for MFU and predictions): a preset "
        "name, a file holding a model description, or a mapping, e.g. '{encoder: siglip-so400m-14-384, llm: "
        "{hf_config: qwen3/config.json}}'; without an encoder (or a config.json alone) a text-only model, "
        "priced without images",
    ),
) -> None:
    """Ingest logs and metrics into the store (idempotent: unchanged files are skipped, appends resume)."""
    from rich.console import Console
    from rich.markup import escape as markup_escape
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

    from mimo_jobs.ingest.pipeline import LogRunInfo, ingest_paths
    from mimo_jobs.store.connection import LONG_WAIT_S, connect
    from mimo_jobs.textsafe import visible

    err = Console(stderr=True)
    from mimo_jobs.ingest.discover import check_paths
    from mimo_jobs.ingest.readers import forced_scanner
    from mimo_jobs.ingest.told import told

    check_paths(paths)  # before opening the store: a typo must not leave an empty store behind
    _check_names(study=study, name=name)
    info = LogRunInfo(
        study=study,
        name=name,
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        seq_length=seq_length,
        told=told(layout, model, nodes, gpus_per_node, seq_length),
    )

    forced_scanner()  # MIMO_JOBS_SCANNER, likewise checked before the store is opened
    con = connect(db, wait_s=LONG_WAIT_S)
    try:
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            console=err,
            transient=True,
        ) as prog:
            task = prog.add_task("ingest", total=None)

            def progress(name: str, done: int, total: int) -> None:
                shown = markup_escape(visible(name[:40]))  # a file name is not markup nor escapes
                prog.update(task, description=f"ingest {shown}", completed=done, total=total)

            stats = ingest_paths(con, list(paths), force=force, log_run=info, progress=progress)
    finally:
        con.close()
    typer.echo(
        f"ingested {stats.files} file(s) ({stats.skipped_unchanged} unchanged, skipped): "
        f"{stats.lines:,} lines, {stats.iterations:,} iterations, {stats.events:,} events, "
        f"{stats.runs_registered} new run(s)"
        + (f", {stats.memory_rows} per-rank memory row(s)" if stats.memory_rows else "")
    )
    if stats.bad_lines or stats.undecodable or stats.truncated_files:
        typer.echo(
            f"tolerated: {stats.bad_lines:,} bad line(s), {stats.undecodable:,} undecodable line(s), "
            f"{stats.truncated_files} file(s) ending in a partial line"
        )
    for p in stats.problems:
        typer.echo(f"problem: {p}", err=True)
    if stats.problems:
        raise typer.Exit(1)


def _check_names(**names: str | None) -> None:
    """Names given on the command line follow the rule of names in study files (they reach file names,
    tables and spreadsheets the same way)."""
    from mimo_jobs.study.spec import NAME_RE

    for option, value in names.items():
        if value is not None and not NAME_RE.match(value):
            fail(
                f"--{option} {value!r}: use letters, digits, '.', '_' and '-' "
                "(1 to 64 characters, starting with a letter or digit)"
            )


def report_cmd(
    study: str | None = typer.Argument(None, help="study name (default: every study in the store)"),
    baseline_nodes: int | None = typer.Option(
        None,
        "--baseline-nodes",
        min=1,
        help="N0 for E(N)=P(N)/P(N0) (default: the study's, else the smallest node count)",
    ),
    fmt: str = typer.Option("table", "--format", "-f", help="table | md | html | json | csv"),
    out: Path | None = typer.Option(
        None,
        *OUT_FLAGS,
        help="write <out>/report.<ext> instead of printing (html defaults to the current directory)",
    ),
    db: Path | None = typer.Option(None, "--db", help=DB_HELP),
    gpu: str | None = typer.Option(
        None, "--gpu", help="GPU model for MFU when the logs do not say (H100, H200, A100)"
    ),
    tokens: str | None = typer.Option(
        None, "--tokens", help="a token budget (e.g. 1T, 500B): each run's projected time and GPU-hours to it"
    ),
) -> None:
    """Scaling report: iteration time, throughput, MFU, E(N), loss parity, cost, failure triage."""
    from mimo_jobs.predict.cost import parse_tokens
    from mimo_jobs.report import FORMATS, build, render
    from mimo_jobs.store.connection import LONG_WAIT_S, connect

    if fmt not in FORMATS:
        fail(f"--format {fmt!r}: choose one of {', '.join(FORMATS)}")
    try:
        budget = parse_tokens(tokens) if tokens is not None else None
    except ValueError as e:
        fail(str(e), where="--tokens")
    con = connect(db, read_only=True, wait_s=LONG_WAIT_S)
    try:
        rep = build(con, study, baseline_nodes=baseline_nodes, gpu=gpu, tokens=budget)
    finally:
        con.close()
    if fmt == "html" and out is None:
        out = Path(".")
    if fmt == "table" and out is None:
        from mimo_jobs.report.render_text import print_table

        print_table(rep)
        return
    try:
        res = render(rep, fmt, out)
    except OSError as e:  # a read-only or full directory, a file where a directory should be
        fail(f"cannot write the report there: {e.strerror or e}", where=f"--out {out}", code=1)
    if isinstance(res, Path):
        typer.echo(f"wrote {res}")
    else:
        echo_document(res)


def register(app: typer.Typer) -> None:
    app.command("ingest")(reports_errors(ingest_cmd))
    app.command("report")(reports_errors(report_cmd))

"""`plan`: which encoder/LLM split, heterogeneous or colocated, for which node counts and global batches
(mimo_jobs/predict/planning.py decides; this module parses options and prints). No torch is imported."""

from __future__ import annotations

import shlex
from pathlib import Path

import typer

from .output import fail, print_json, reports_errors
from .predict import GPU_HELP, TOKENS_HELP, _gpu, parse_budget


def parse_counts(values: list[str], option: str, upper: int) -> list[int]:
    """'32,33' / '32-40' / repeated options -> sorted distinct ints in [1, upper]; a clear error otherwise."""
    out: set[int] = set()
    for v in values:
        for item in v.split(","):
            item = item.strip()
            lo, sep, hi = item.partition("-")
            try:
                a, b = (int(lo), int(hi)) if sep else (int(item), int(item))
            except ValueError:
                fail(f"{option}: {item!r} is not a count or a range like 32-40")
            if a > b:
                fail(f"{option}: range {item!r} runs backwards")
            if a < 1 or b > upper:
                fail(f"{option} must be between 1 and {upper:,}, got {item!r}")
            if b - a >= 1000:
                fail(f"{option}: range {item!r} holds more than 1,000 values")
            out.update(range(a, b + 1))
    return sorted(out)


def plan_cmd(
    nodes: list[str] = typer.Option(
        ..., "--nodes", help="Node counts: 33, 32,33,68,100 or 32-40 (repeatable)."
    ),
    study_file: Path = typer.Option(..., "--from", help="Study whose model, trainer and batch to plan."),
    gbs: list[str] = typer.Option(
        None, "--gbs", help="Global batch sizes (default: the study's first run's)."
    ),
    gpu: str | None = typer.Option(None, "--gpu", help=GPU_HELP),
    top: int = typer.Option(5, "--top", help="How many layouts to show per node count and batch."),
    headroom: float = typer.Option(
        0.0, "--headroom", help="GiB each rank must keep free to count as fitting."
    ),
    db: Path | None = typer.Option(
        None, "--db", help="Store whose measured runs of the study calibrate the model."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the plan as JSON (docs/predict.md)."),
    tokens: str | None = typer.Option(None, "--tokens", help=TOKENS_HELP),
    rank_by: str = typer.Option(
        "time",
        "--rank-by",
        help="Order the summary across node counts by time (as asked) or by cost (GPU-hours to the "
        "--tokens budget, else for the study's length; ties within 0.5% by time).",
    ),
) -> None:
    """The best encoder/LLM split per node count and batch, the best colocated layout or why none tiles, and
    flags across node counts; points are ready to paste into a study's matrix."""
    from mimo_jobs.predict.hardware import GIB
    from mimo_jobs.predict.planning import plan_json, plan_many, plan_text
    from mimo_jobs.predict.run import shape_of
    from mimo_jobs.study.spec import MAX_BATCH, MAX_NODES

    from .study import study_or_fail

    if rank_by not in ("time", "cost"):
        fail(f"--rank-by must be time or cost, got {rank_by!r}")
    budget = parse_budget(tokens)
    counts = parse_counts(nodes, "--nodes", MAX_NODES)
    batches = parse_counts(gbs, "--gbs", MAX_BATCH) if gbs else []
    if len(counts) * max(1, len(batches)) > 64:
        fail("--nodes x --gbs asks for more than 64 plans; narrow the ranges")
    if top <= 0:
        fail(f"--top must be >= 1, got {top}")
    if not 0 <= headroom <= 4096:
        fail(f"--headroom must be between 0 and 4096 GiB, got {headroom}")
    diag = study_or_fail(study_file)
    g = _gpu(gpu, diag.study)
    base = diag.runs[0]
    eff, calibrated = _efficiency(db, diag, g)
    result = plan_many(
        shape_of(base.layout, base.trainer),
        g,
        counts,
        batches,
        eff,
        top,
        int(headroom * GIB),
        calibrated,
        budget,
        rank_by,
    )
    if as_json:
        print_json({"study": diag.study.name, **plan_json(result)})
        return
    measure = f"mimo-jobs data stats --study {shlex.quote(str(study_file))}"
    typer.echo("\n".join(plan_text(result, diag.study.name, measure)))
    if not any(p.best for p in result.plans):
        raise typer.Exit(2)


def _efficiency(db: Path | None, diag, gpu):
    """The calibrated efficiencies from the study's measured runs in `db`, else the GPU's fitted ones."""
    from mimo_jobs.predict.steptime import efficiency_for

    if db is None:
        return efficiency_for(gpu), False
    from .predict import calibration_for

    cal = calibration_for(db, diag, gpu)
    return (cal.efficiency, True) if cal is not None else (efficiency_for(gpu), False)


def register(app: typer.Typer) -> None:
    app.command("plan")(reports_errors(plan_cmd))

"""`plan`: the best feasible layouts for a node count, as matrix points (mimo_jobs/predict, docs/predict.md).
No torch is imported."""

from __future__ import annotations

from pathlib import Path

import typer

from .output import fail, print_json, reports_errors
from .predict import GPU_HELP, _gpu


def plan_cmd(
    nodes: int = typer.Option(..., "--nodes", help="Node count to plan for."),
    study_file: Path = typer.Option(..., "--from", help="Study whose model, trainer and batch to plan."),
    gpu: str | None = typer.Option(None, "--gpu", help=GPU_HELP),
    top: int = typer.Option(5, "--top", help="How many layouts to show."),
    as_json: bool = typer.Option(False, "--json", help="Print the layouts as JSON."),
) -> None:
    """The fastest feasible layouts for N nodes that fit in memory, as ready-to-paste matrix points."""
    from mimo_jobs.predict.layouts import best_layouts, yaml_point
    from mimo_jobs.predict.run import shape_of
    from mimo_jobs.predict.steptime import Efficiency
    from mimo_jobs.study.spec import MAX_NODES

    from .study import study_or_fail

    if not 1 <= nodes <= MAX_NODES:  # a study's own bound on nodes: beyond it only time is spent
        fail(f"--nodes must be between 1 and {MAX_NODES:,}, got {nodes:,}")
    if top <= 0:
        fail(f"--top must be >= 1, got {top}")
    diag = study_or_fail(study_file)
    g = _gpu(gpu, diag.study)
    base = diag.runs[0]
    best, priced = best_layouts(shape_of(base.layout, base.trainer), g, nodes, Efficiency(), top)
    if as_json:
        runs = [
            {
                "point": yaml_point(c.layout)[2:],
                "iteration_s": c.prediction.time.iteration_s,
                "tokens_per_s_per_gpu": c.prediction.tokens_per_s_per_gpu,
                "mfu": c.prediction.mfu,
                "memory": c.prediction.memory.verdict(),
            }
            for c in best
        ]
        print_json(
            {"study": diag.study.name, "gpu": g.name, "nodes": nodes, "feasible": priced, "layouts": runs}
        )
        return
    if not best:
        fail(f"no feasible layout of {diag.study.name} fits on {nodes} node(s) of {g.name} ({priced} priced)")
    typer.echo(
        f"# {diag.study.name} on {nodes} x {base.layout.gpus_per_node} {g.name}: {len(best)} fastest of "
        f"{priced} feasible layouts"
    )
    typer.echo("points:")
    for c in best:
        p = c.prediction
        typer.echo(
            f"  {yaml_point(c.layout)}  # {p.time.iteration_s:.3f} s/iter, MFU {p.mfu:.1%}, "
            f"{p.time.bottleneck}-bound, {p.memory.verdict()}"
        )


def register(app: typer.Typer) -> None:
    app.command("plan")(reports_errors(plan_cmd))

"""`predict` and `plan`: memory per rank class and iteration time of a study's runs before submitting, and
the best feasible layouts for a node count (mimo_jobs/predict, docs/predict.md). No torch is imported."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from .output import DB_HELP, console, fail, reports_errors

GPU_HELP = "GPU to price the runs on: H100, H200, B200, A100 or cpu (default: H100, or cpu for a CPU study)."


def _gpu(name: str | None, study):
    from mimo_jobs.predict.hardware import UnknownGPU, get_gpu

    default = "cpu" if study.cluster.accelerator == "cpu" else "H100"
    try:
        return get_gpu(name or default)
    except UnknownGPU as e:
        fail(str(e))


def _gib(n: float) -> str:
    return f"{n / 1024**3:.2f}"


def _measured(db: Path, study: str) -> dict[str, float]:
    """run_id -> the report's median steady-state iteration seconds."""
    from mimo_jobs.report import build
    from mimo_jobs.store.connection import connect

    con = connect(db, read_only=True)
    try:
        rep = build(con, study)
    finally:
        con.close()
    return {r.run_id: r.t_median_ms / 1000.0 for r in rep.runs if r.t_median_ms}


def _calibrate(preds: list, measured: dict[str, float]):
    from mimo_jobs.predict.calibrate import Point, fit

    pts = [
        Point(
            p.name,
            p.shape.layout.nodes,
            p.time.compute_s,
            p.time.iteration_s - p.time.compute_s,
            measured[p.run_id],
        )
        for p in preds
        if p.run_id in measured
    ]
    if not pts:
        fail("no run of the study has a measured iteration time in the store (ingest its logs first)")
    return fit(pts)


def _ranks_table(title: str, preds: list):
    from rich.table import Table

    t = Table(title=title, title_justify="left")
    for col in (
        "run",
        "module",
        "stage",
        "ranks",
        "params",
        "weights",
        "grads",
        "optimizer",
        "activations",
        "total GiB",
    ):
        t.add_column(col, justify="left" if col in ("run", "module", "ranks") else "right")
    for p in preds:
        for c in p.memory.classes:
            for m in c.modules:
                t.add_row(
                    p.name,
                    m.module,
                    str(m.stage),
                    f"{m.ranks[0]}-{m.ranks[1]}",
                    f"{m.params:,}",
                    _gib(m.weight_bytes),
                    _gib(m.grad_bytes),
                    _gib(m.optimizer_bytes),
                    _gib(m.activation_bytes + m.bridge_bytes),
                    _gib(m.total_bytes),
                )
    return t


def _time_table(preds: list, measured: dict[str, float] | None):
    from rich.table import Table

    t = Table(title="iteration time", title_justify="left")
    cols = ["run", "nodes", "memory", "s/iter", "tokens/s/GPU", "MFU", "bottleneck", "idle other", "dominant"]
    for col in cols + (["measured s/iter", "error"] if measured is not None else []):
        t.add_column(col, justify="left" if col in ("run", "memory", "bottleneck", "dominant") else "right")
    for p in preds:
        row = [
            p.name,
            str(p.shape.layout.nodes),
            p.memory.verdict(),
            f"{p.time.iteration_s:.3f}",
            f"{p.tokens_per_s_per_gpu:,.0f}",
            f"{p.mfu:.1%}",
            p.time.bottleneck,
            f"{p.time.idle_fraction:.0%}",
            p.time.dominant,
        ]
        if measured is not None:
            m = measured.get(p.run_id)
            row += [f"{m:.3f}", f"{(p.time.iteration_s - m) / m:+.1%}"] if m else ["-", "-"]
        t.add_row(*row)
    return t


def predict(
    study_file: Path = typer.Argument(..., help="Study YAML file."),
    gpu: str | None = typer.Option(None, "--gpu", help=GPU_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print the predictions as JSON (docs/predict.md)."),
    db: Path | None = typer.Option(None, "--db", help=DB_HELP + " Calibrate against its measured runs."),
) -> None:
    """Memory per rank class and iteration time of every run of a study, before submitting."""
    from mimo_jobs.predict.estimate import predict_run, to_json
    from mimo_jobs.predict.steptime import Efficiency

    from .plan import study_or_fail

    diag = study_or_fail(study_file)
    g = _gpu(gpu, diag.study)
    preds = [predict_run(r, g) for r in diag.runs]
    measured, cal = None, None
    if db is not None:
        if not Path(db).exists():
            fail(f"no store at {db}", where="--db")
        measured = _measured(db, diag.study.name)
        cal = _calibrate(preds, measured)
        eff = cal.efficiency(Efficiency())
        preds = [predict_run(r, g, eff) for r in diag.runs]
    if as_json:
        doc = {"study": diag.study.name, "gpu": g.name, "runs": [to_json(p) for p in preds]}
        if cal is not None:
            doc["calibration"] = _calibration_json(cal, measured)
        typer.echo(json.dumps(doc, indent=2))
        return
    out = console()
    out.print(_ranks_table(f"{diag.study.name} on {g.name}: memory per rank class (GiB)", preds))
    out.print(_time_table(preds, measured))
    if cal is not None:
        hold = f", hold-out {cal.holdout_error:.1%}" if cal.holdout_error is not None else ""
        out.print(
            f"calibration: compute x{1 / cal.alpha:.2f}, network x{1 / cal.beta:.2f}; mean error "
            f"{cal.error_before:.1%} before, {cal.error_after:.1%} after{hold}",
            markup=False,
        )
    out.print(
        "MFU: encoder + LLM training FLOPs / (iteration time x all GPUs of the job x dense BF16 peak)",
        markup=False,
    )


def _calibration_json(cal, measured: dict[str, float]) -> dict:
    return {
        "compute_scale": cal.alpha,
        "network_scale": cal.beta,
        "error_before": cal.error_before,
        "error_after": cal.error_after,
        "holdout_error": cal.holdout_error,
        "measured_s": measured,
    }


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

    from .plan import study_or_fail

    if nodes <= 0:
        fail(f"--nodes must be >= 1, got {nodes}")
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
        typer.echo(
            json.dumps(
                {
                    "study": diag.study.name,
                    "gpu": g.name,
                    "nodes": nodes,
                    "feasible": priced,
                    "layouts": runs,
                },
                indent=2,
            )
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
    app.command("predict")(reports_errors(predict))
    app.command("plan")(reports_errors(plan_cmd))

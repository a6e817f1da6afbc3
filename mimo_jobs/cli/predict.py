"""`predict`: memory per rank class and iteration time of a study's runs before submitting
(mimo_jobs/predict, docs/predict.md). No torch is imported."""

from __future__ import annotations

import shlex
from pathlib import Path

import typer

from .output import DB_HELP, TABLE_ROWS, console, fail, print_json, reports_errors, table_runs

GPU_HELP = (
    "GPU to price the runs on: H100, H200, GH200, B200, GB200, A100 or cpu (default: the study's cluster.hardware.gpu, "
    "else H100; cpu for a CPU study). The study's cluster.hardware figures apply to it."
)


LAYERS_HELP = (
    "Layers to price the runs for: te (Transformer Engine's fused attention and grouped-GEMM experts) or "
    "local (megatron-core's local layers, what the trainer builds without Transformer Engine: unfused "
    "attention, experts one after another; slower, more activation memory). Default: the study's "
    "cluster.hardware.layers, else te; a CPU is always local."
)


def _gpu(name: str | None, study, layers: str | None = None):
    """The GPU to price on: --gpu, else the study's (None: no study, H100 unless --gpu names one), for
    --layers, else the study's cluster.hardware.layers (te without a study)."""
    from mimo_jobs.predict.hardware import UnknownGPU, UnknownLayers, get_gpu, study_gpu, with_layers

    try:
        if study is not None:
            return study_gpu(study.cluster, name, layers)
        return with_layers(get_gpu(name or "H100"), layers)
    except UnknownLayers as e:
        fail(str(e), where="--layers")
    except UnknownGPU as e:
        fail(str(e))


def _gib(n: float) -> str:
    return f"{n / 1024**3:.2f}"


def _calibrate(runs: list, g, measured: dict[str, float]):
    from mimo_jobs.predict.measured import Measured, calibrate
    from mimo_jobs.predict.run import shape_of
    from mimo_jobs.study.priced import unpriced

    got = [
        Measured(r.name, r.run_id, shape_of(r.layout, r.trainer, r.point.command), measured[r.run_id])
        for r in runs
        if r.run_id in measured and unpriced(r) is None
    ]
    if not got:
        fail("no run of the study has a measured iteration time in the store (ingest its logs first)")
    return calibrate(got, g)


def calibration_for(db: Path, diag, g):
    """The study's runs in the store `db` calibrated on `g` (exits 2 without a store or measured run)."""
    if not Path(db).exists():
        fail(f"no store at {db}", where="--db")
    from mimo_jobs.report.steptimes import measured_iteration_s

    return _calibrate(diag.runs, g, measured_iteration_s(db, diag.study.name))


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


def _time_table(preds: list, tokens: float | None = None, note: str = ""):
    from rich.table import Table

    from mimo_jobs.predict.cost import gpu_hours_text, tokens_text

    t = Table(title="iteration time and cost" + (f" ({note})" if note else ""), title_justify="left")
    cols = ["run", "nodes", "memory", "s/iter", "tokens/s/GPU", "MFU", "bottleneck", "idle other", "dominant"]
    cols += ["iters", "GPU-h (run)", "node-h (run)"]
    if tokens:
        cols += [f"hours to {tokens_text(tokens)}", f"GPU-h to {tokens_text(tokens)}"]
    for col in cols:
        t.add_column(col, justify="left" if col in ("run", "memory", "bottleneck", "dominant") else "right")
    for p in preds:
        run = p.run_cost()
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
            f"{p.iterations:,}",
            gpu_hours_text(run.gpu_hours),
            gpu_hours_text(run.node_hours),
        ]
        if tokens:
            b = p.budget_cost(tokens)
            row += [gpu_hours_text(b.hours), gpu_hours_text(b.gpu_hours)] if b else ["-", "-"]
        t.add_row(*row)
    return t


def parse_budget(tokens: str | None) -> float | None:
    """--tokens as a count (1T, 500B, 2.5e12); exits 2 on anything else."""
    if tokens is None:
        return None
    from mimo_jobs.predict.cost import parse_tokens

    try:
        return parse_tokens(tokens)
    except ValueError as e:
        fail(str(e), where="--tokens")


TOKENS_HELP = (
    "A token budget (1T, 500B, 2.5e12): the hours and GPU-hours to train on that many carried tokens "
    "(tokens the batch holds, not padding: the report's convention)."
)


def _pct(e: float | None) -> str:
    return "-" if e is None else f"{e:+.1%}"


def _check_table(cal):
    """Each measured run: measured, uncalibrated, calibrated and held-out seconds per iteration."""
    from rich.table import Table

    t = Table(title="predicted vs measured (s/iter; error = (predicted - measured) / measured)")
    t.title_justify = "left"
    cols = ["run", "nodes", "measured", "uncalibrated", "error", "calibrated", "error", "held out", "error"]
    for col in cols:
        t.add_column(col, justify="left" if col == "run" else "right")
    for r in cal.runs:
        t.add_row(
            r.name,
            str(r.nodes),
            f"{r.measured_s:.4f}",
            f"{r.uncalibrated_s:.4f}",
            _pct(r.uncalibrated_error),
            f"{r.calibrated_s:.4f}",
            _pct(r.calibrated_error),
            "-" if r.holdout_s is None else f"{r.holdout_s:.4f}",
            _pct(r.holdout_error),
        )
    return t


def _calibration_line(cal) -> str:
    s = cal.scales
    line = (
        f"calibration ({s.unknowns} scale(s) fitted on {len(cal.runs)} run(s)): efficiency encoder "
        f"{cal.efficiency.encoder:.3g}, llm {cal.efficiency.llm:.3g}, network {cal.efficiency.network:.3g}, "
        f"latency x{cal.efficiency.latency:.3g}; "
        f"mean |error| {cal.error_before:.1%} uncalibrated, {cal.error_after:.1%} calibrated"
    )
    if cal.holdout_by:
        by = "node count" if cal.holdout_by == "nodes" else "run"
        line += (
            f"; held out (one {by} at a time, fitted on the others): {cal.holdout_error_before:.1%} "
            f"uncalibrated, {cal.holdout_error_after:.1%} calibrated"
        )
    return line


def predict(
    study_file: Path = typer.Argument(..., help="Study YAML file."),
    gpu: str | None = typer.Option(None, "--gpu", help=GPU_HELP),
    layers: str | None = typer.Option(None, "--layers", help=LAYERS_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print the predictions as JSON (docs/predict.md)."),
    db: Path | None = typer.Option(None, "--db", help=DB_HELP + " Calibrate against its measured runs."),
    show_all: bool = typer.Option(
        False, "--all", help=f"Price and list every run (default: the first {TABLE_ROWS}, then a summary)."
    ),
    tokens: str | None = typer.Option(None, "--tokens", help=TOKENS_HELP),
) -> None:
    """Memory per rank class, iteration time and cost (GPU-hours for the study's length, and to a token
    budget) of every run of a study, before submitting."""
    from mimo_jobs.model.resolve import arch_of
    from mimo_jobs.predict.band import band_json, time_model
    from mimo_jobs.predict.estimate import predict_run, to_json
    from mimo_jobs.predict.hardware import layers_note
    from mimo_jobs.predict.optime import ops_note
    from mimo_jobs.predict.params import model_json, model_summary
    from mimo_jobs.predict.steptime import efficiency_for
    from mimo_jobs.study.priced import unpriced

    from .study import study_or_fail

    budget = parse_budget(tokens)
    diag = study_or_fail(study_file)
    g = _gpu(gpu, diag.study, layers)
    cal = calibration_for(db, diag, g) if db is not None else None
    shown, more = table_runs(diag.runs, show_all or as_json)
    skipped = {r.run_id: unpriced(r) for r in shown if unpriced(r)}  # own commands without a model
    preds = [
        predict_run(r, g, cal.efficiency if cal else efficiency_for(g))
        for r in shown
        if r.run_id not in skipped
    ]
    priced = len(skipped) < len(shown) or not shown
    if as_json:
        doc = {
            "study": diag.study.name,
            "gpu": g.name,
            "layers": g.layers,
            "model": model_json(arch_of(diag.study.trainer.model)) if priced else None,
            "band": None if cal else band_json(g, time_model(p.time for p in preds)),
            "ops_file": g.ops.source if g.ops is not None else None,
        }
        doc["runs"] = [to_json(p, budget) for p in preds]
        doc["unpriced"] = [{"name": r.name, "run_id": r.run_id, "why": skipped[r.run_id]} for r in shown
                           if r.run_id in skipped]  # fmt: skip
        if cal is not None:
            checks = {c.run_id: c for c in cal.runs}
            for run in doc["runs"]:
                run.update(_check_json(checks.get(run["run_id"])))
            doc["calibration"] = _calibration_json(cal)
        print_json(doc)
        return
    out = console()
    if priced:
        out.print("model: " + "; ".join(model_summary(arch_of(diag.study.trainer.model))), markup=False)
    for r in shown:
        if r.run_id in skipped:
            out.print(f"run {r.name} ({r.run_id}): not priced: {skipped[r.run_id]}", markup=False)
    if not preds:
        if more:
            out.print(more, markup=False)
        return
    out.print(_ranks_table(f"{diag.study.name} on {g.name}: memory per rank class (GiB)", preds))
    out.print(_time_table(preds, budget, layers_note(g)))
    note = ops_note(g, [p.time for p in preds])
    if note:
        out.print(note, markup=False)
    if more:
        out.print(more, markup=False)
    if cal is not None:
        out.print(_check_table(cal))
        out.print(_calibration_line(cal), markup=False)
    else:
        from mimo_jobs.predict.band import band_note

        # how far such a time held on runs nobody fitted, for the model that priced them
        out.print(band_note(g, time_model(p.time for p in preds)), markup=False)
    out.print(
        "settings priced: " + "; ".join(dict.fromkeys(p.shape.settings_words(p.time.model) for p in preds)),
        markup=False,
    )
    sources = dict.fromkeys(p.shape.data_source for p in preds)  # say which data priced the image tokens
    images = all(m.modality == "image" for p in preds for m in p.shape.modules)
    what = "image tokens" if images else "encoder tokens"
    out.print(f"{what}: " + "; ".join(sources), markup=False)
    ranges = dict.fromkeys(p.shape.image_range for p in preds if p.shape.image_range)
    if ranges:  # the stated prior priced them: every figure of time rests on it
        from mimo_jobs.predict.assumed import range_words

        span = ", ".join(range_words(r) for r in ranges)
        out.print(
            f"image tokens assumed ({span}): time, bottleneck, idle, MFU and cost rest on it; measure "
            f"with mimo-jobs data stats --study {shlex.quote(str(study_file))}",
            markup=False,
        )
    out.print(
        "MFU: encoder + LLM training FLOPs / (iteration time x all GPUs of the job x dense BF16 peak)",
        markup=False,
    )
    carried = dict.fromkeys(p.shape.carried_source for p in preds)
    out.print(
        "cost: GPU-h (run) = the study's iterations x s/iter x all GPUs of the job; a token budget is counted "
        f"in carried tokens ({'; '.join(carried)})",
        markup=False,
    )


def _check_json(c) -> dict:
    """A run's measured figure and its predictions (null where the run has no measured time)."""
    keys = ("measured_s", "uncalibrated_s", "uncalibrated_error", "calibrated_s", "calibrated_error")
    out = {k: None if c is None else getattr(c, k) for k in keys}
    out["holdout_s"] = None if c is None else c.holdout_s
    out["holdout_error"] = None if c is None else c.holdout_error
    return out


def _calibration_json(cal) -> dict:
    s, e = cal.scales, cal.efficiency
    return {
        "unknowns": s.unknowns,
        "scales": {"encoder": s.encoder, "llm": s.llm, "network": s.network, "latency": s.latency},
        "efficiency": {"encoder": e.encoder, "llm": e.llm, "network": e.network, "latency": e.latency},
        "error_before": cal.error_before,
        "error_after": cal.error_after,
        "holdout_by": cal.holdout_by or None,
        "holdout_error_before": cal.holdout_error_before,
        "holdout_error_after": cal.holdout_error_after,
    }


def register(app: typer.Typer) -> None:
    app.command("predict")(reports_errors(predict))

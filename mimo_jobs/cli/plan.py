"""`plan`: which encoder/LLM split, heterogeneous or colocated, for which node counts and global batches
(mimo_jobs/predict/planning.py decides; this module parses options and prints). No torch is imported."""

from __future__ import annotations

import shlex
from pathlib import Path

import typer

from .output import fail, print_json, reports_errors
from .predict import GPU_HELP, LAYERS_HELP, TOKENS_HELP, _gpu, parse_budget


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
    study_file: Path | None = typer.Option(
        None,
        "--from",
        help="Study whose model, trainer, GPUs per node and batch to plan (its points need not validate: "
        "those that do not are noted).",
    ),
    model: str | None = typer.Option(
        None,
        "--model",
        help="Plan a model alone instead of a study: a preset name (mimo-jobs models lists them); with "
        "--gpus-per-node, --gbs and --seq-length. A text-only model is priced as Megatron-LM runs it (PP, "
        "virtual stages, CP).",
    ),
    gpus_per_node: int = typer.Option(8, "--gpus-per-node", help="With --model: GPUs per node."),
    seq_length: int = typer.Option(4096, "--seq-length", help="With --model: tokens per sample."),
    gbs: list[str] = typer.Option(
        None, "--gbs", help="Global batch sizes (default: the study's first run's)."
    ),
    gpu: str | None = typer.Option(None, "--gpu", help=GPU_HELP),
    layers: str | None = typer.Option(None, "--layers", help=LAYERS_HELP),
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
    from mimo_jobs.predict.steptime import efficiency_for
    from mimo_jobs.study.spec import MAX_BATCH, MAX_NODES

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
    if (study_file is None) == (model is None):
        fail("give a study (--from S.yaml) or a model (--model NAME), not both and not neither")
    if model is not None:
        if not batches:
            fail("--model needs --gbs (the global batch to plan)")
        if db is not None:
            fail("--db calibrates a study's runs: use it with --from")
        name, shape, notes, study = (
            model,
            _model_start(model, gpus_per_node, seq_length, batches[0]),
            [],
            None,
        )
    else:
        study, shape, notes = _study_start(study_file)
        name = study.name
    g = _gpu(gpu, study, layers)
    eff, calibrated = _efficiency(db, study_file, g) if db is not None else (efficiency_for(g), False)
    result = plan_many(
        shape,
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
        print_json({"study": name, "notes": notes, **plan_json(result)})
        return
    measure = f"mimo-jobs data stats --study {shlex.quote(str(study_file))}" if study_file else ""
    typer.echo("\n".join([f"# note: {n}" for n in notes] + plan_text(result, name, measure)))
    if not any(p.best for p in result.plans):
        raise typer.Exit(2)


def _efficiency(db: Path, study_file: Path, gpu):
    """The calibrated efficiencies from the study's measured runs in `db` (the study must validate: its runs
    are what was measured), else the GPU's fitted ones."""
    from mimo_jobs.predict.steptime import efficiency_for

    from .predict import calibration_for
    from .study import study_or_fail

    cal = calibration_for(db, study_or_fail(study_file), gpu)
    return (cal.efficiency, True) if cal is not None else (efficiency_for(gpu), False)


def _study_start(study_file: Path):
    """(study, start shape, notes) of a study whose model, cluster and trainer parse; its points need not
    validate (each that does not is a note). A study that does not parse: its problems, exit 2."""
    from mimo_jobs.predict.start import study_start

    from .output import fail_problems
    from .study import diagnose_file

    diag = diagnose_file(study_file)
    if diag.study is None:
        fail_problems(diag.source, diag.problems)
    try:
        start = study_start(diag.study, diag.points, diag.problems)
    except ValueError as e:
        fail(str(e), where=str(study_file))
    return diag.study, start.shape, start.notes


def _model_start(model: str, gpus_per_node: int, seq_length: int, gbs: int):
    """The start shape of `--model`: the model with the trainer's defaults in bf16, priced as a study of its
    own command trains it."""
    from pydantic import ValidationError

    from mimo_jobs.model.arch import ArchError
    from mimo_jobs.model.resolve import model_argument
    from mimo_jobs.predict.start import own_command, start_of
    from mimo_jobs.study.spec import TrainerSpec

    if not 1 <= gpus_per_node <= 64:
        fail(f"--gpus-per-node must be between 1 and 64, got {gpus_per_node}")
    try:
        value = model_argument(model)
        t = TrainerSpec.model_validate(
            {"model": value, "seq_length": seq_length, "train_iters": 1, "precision": "bf16"}
        )
        return own_command(start_of(t.model_copy(update={"train_iters": None}), gpus_per_node, gbs))
    except ValidationError as e:
        fail(
            "; ".join(f"{'.'.join(map(str, x['loc'])) or 'model'}: {x['msg']}" for x in e.errors()),
            where="--model",
        )
    except ArchError as e:
        fail(e.describe(), where="--model")
    except ValueError as e:
        fail(str(e), where="--model")


def register(app: typer.Typer) -> None:
    app.command("plan")(reports_errors(plan_cmd))

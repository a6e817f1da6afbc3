"""`validate` and `render`: study file -> plan table / precise errors -> run directories with scripts.

Exit codes: 0 ok, 2 bad input (every problem is printed, with its YAML path, rule and a value that fits).
Imports of pydantic/jinja stay inside the commands so `mimo-jobs --help` starts fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from .output import EXIT_INVALID, OUT_FLAGS, console, fail_problems, print_json, reports_errors

if TYPE_CHECKING:
    from mimo_jobs.study.diagnose import Diagnosis


def _cells(plan) -> dict[str, str]:
    """Table cells of one plan, in the words of docs/topology.md's worked example."""
    lay = plan.layout

    def nodes(n: int) -> str:
        return f"{n} node" + ("s" if n != 1 else "")

    enc = "; ".join(
        (f"{m.name} " if lay.several else "")
        + f"TP{m.tp}"
        + (f" PP{m.pp}" if m.pp > 1 else "")
        + f" DP{m.dp}"
        + (f" (ranks {m.rank_start}-{m.rank_end - 1})" if lay.several and not lay.colocated else "")
        for m in plan.encoders
    )
    llm = (
        f"TP{lay.llm_tp}"
        + (f" PP{lay.llm_pp}" if lay.llm_pp > 1 else "")
        + (f" EP{lay.llm_ep}" if lay.llm_ep > 1 else "")
        + f" DP{lay.llm_dp}"
    )
    shared = " (shared)" if plan.shared_nodes else ""

    def lanes_of(fan: str, lanes_per_encoder: int, encoders_per_lane: int) -> str:
        # fan-in: several encoder replicas per lane
        return f"1/{encoders_per_lane}" if fan == "in" else str(lanes_per_encoder)

    if plan.fan == "modules":  # several encoders, each with its own fan
        fan = ", ".join(f"{m.name} {m.fan}" for m in plan.encoders)
        lanes = ", ".join(
            f"{m.name} {lanes_of(m.fan, m.lanes_per_encoder, m.encoders_per_lane)}" for m in plan.encoders
        )
    else:
        fan, lanes = plan.fan, lanes_of(plan.fan, plan.lanes_per_encoder, plan.encoders_per_lane)
    ranks = (
        "" if lay.several and not lay.colocated else f" (ranks {plan.enc_rank_start}-{plan.enc_rank_end - 1})"
    )
    return {
        "encoder": f"{nodes(len(plan.encoder_nodes))}{shared}, {enc}{ranks}",
        "llm": f"{nodes(len(plan.llm_nodes))}{shared}, {llm} (ranks {plan.llm_rank_start}-{plan.llm_rank_end - 1})",
        "expert_dp": str(plan.expert_dp) if plan.expert_dp else "-",
        "fan": fan,
        "lanes": lanes,
        "microbatches": str(plan.num_microbatches),
    }


def _text_only(run) -> bool:
    """A model without an encoder (a command run's GPT): its layout has no encoder ranks to show."""
    from mimo_jobs.model.resolve import arch_of

    try:
        return arch_of(run.trainer.model).text_only
    except Exception:  # noqa: BLE001 - an unresolvable model is reported by validate's own rules
        return False


# Rows the plan table shows before it summarises the rest: drawing a rich table costs ~0.5 ms a row, so a
# 10,000-run study would take seconds to print a table nobody reads row by row.
TABLE_ROWS = 50


def _plan_table(diag: Diagnosis, runs: list):
    from rich.table import Table

    name = diag.study.name if diag.study else diag.source
    t = Table(title=f"{name}: {len(diag.runs)} run(s)", title_justify="left")
    for col, just in (
        ("run", "left"),
        ("run id", "left"),
        ("nodes", "right"),
        ("encoder", "left"),
        ("LLM", "left"),
        ("expert-DP", "right"),
        ("fan", "center"),
        ("lanes/encoder", "right"),
        ("microbatches", "right"),
    ):
        t.add_column(col, justify=just, overflow="fold")
    for r in runs:
        c = _cells(r.rank_layout())
        t.add_row(
            r.name,
            r.run_id,
            str(r.layout.nodes),
            "none (text-only model)" if _text_only(r) else c["encoder"],
            c["llm"],
            c["expert_dp"],
            c["fan"],
            c["lanes"],
            c["microbatches"],
        )
    return t


def diagnose_file(study_file: Path) -> Diagnosis:
    """Every problem of a study file, including its setup lines (which only bash can judge)."""
    from mimo_jobs.study.diagnose import diagnose

    diag = diagnose(study_file)
    if diag.study is not None and diag.study.cluster.setup:
        from mimo_jobs.study.render import setup_problems  # jinja2 only when there is something to check

        diag.problems += setup_problems(diag.study.cluster)
    if diag.study is not None:
        diag.problems += _path_problems(diag)
        diag.problems += _runtime_problems(diag)
    if diag.runs and any(r.point.command or r.trainer.command for r in diag.runs):
        from mimo_jobs.contract.rundir import RunDir
        from mimo_jobs.study.command import command_problems

        diag.problems += command_problems(diag.runs, lambda r: RunDir.of("runs", r.study, r.name, r.run_id))
    return diag


def _path_problems(diag: Diagnosis) -> list:
    """Every path of the study that is missing or of the wrong kind (study/paths.py), then each HuggingFace
    source of trainer.init that is there checked against the model: config.json and the tensor shapes in the
    safetensors headers, the trainer preflight's own rules (model/hf_check.py), once per LLM TP size."""
    from mimo_jobs.study.diagnose import Problem
    from mimo_jobs.study.paths import on_this_host, path_problems

    found = path_problems(diag.study)
    out = [Problem(p.path, p.rule, p.message, p.fit) for p in found]
    out += _dataset_problems(diag, {p.path for p in found})
    init = diag.study.trainer.init
    if init is None or not diag.runs:
        return out
    # a side already reported missing, or one this machine cannot see (inside the container's image), is
    # not opened: the trainer's preflight judges what validate cannot
    bad = {p.path for p in found}

    def unseen(where: str, path) -> bool:
        return isinstance(path, str) and (where in bad or on_this_host(diag.study, path) is None)

    update: dict = {
        side: None for side in ("llm", "encoder") if unseen(f"trainer.init.{side}", getattr(init, side))
    }
    if init.encoders:
        update["encoders"] = {
            n: d for n, d in init.encoders.items() if not unseen(f"trainer.init.encoders.{n}", d)
        }
    init = init.model_copy(update=update)
    from mimo_jobs.model.hf_check import hf_init_problems
    from mimo_jobs.model.resolve import arch_of

    arch, seen = arch_of(diag.study.trainer.model), set()
    for tp in sorted({r.layout.llm_tp for r in diag.runs}):
        for e in hf_init_problems(init, arch, tp):
            if str(e) not in seen:
                seen.add(str(e))
                out.append(Problem(e.where or "trainer.init", "init", str(e)))
    return out


def _dataset_problems(diag: Diagnosis, bad: set[str]) -> list:
    """Each energon dataset the runs read, checked as the trainer's energon provider checks it before any
    loader exists (data/check.py: a prepared dataset or a blend of them, no code beyond this package's
    unless trusted), in its words; a path already reported missing, or not visible from this machine, is
    left to the trainer."""
    from mimo_jobs.data.check import check_data_path
    from mimo_jobs.data.errors import DataError
    from mimo_jobs.study.diagnose import Problem
    from mimo_jobs.study.paths import on_this_host

    out, seen = [], set()
    for r in diag.runs or []:
        d = r.trainer.data
        if d.provider != "energon" or not d.path or "trainer.data.path" in bad:
            continue
        host = on_this_host(diag.study, str(d.path))
        if host is None or (str(host), d.trust_dataset_code) in seen:
            continue
        seen.add((str(host), d.trust_dataset_code))
        try:
            check_data_path(str(host), d.trust_dataset_code)
        except DataError as e:
            out.append(Problem("trainer.data.path", "dataset", str(e)))
    return out


def _runtime_problems(diag: Diagnosis) -> list:
    """What the trainer would refuse at start-up, once per distinct problem (study/runtime_rules.py owns the
    rules). Tracker packages are judged only without a container: inside one, this environment says
    nothing about the trainer's. A run with its own command does not start the packaged trainer."""
    from mimo_jobs.data.check import prepared_videos
    from mimo_jobs.model.resolve import arch_of
    from mimo_jobs.study.diagnose import Problem
    from mimo_jobs.study.runtime_rules import device_problems, package_installed, runtime_problems
    from mimo_jobs.study.spec import HardwareSpec

    cluster = diag.study.cluster
    installed = package_installed if cluster.container is None else (lambda _name: True)
    layers = (cluster.hardware or HardwareSpec()).layers  # what the study is planned on
    seen, out = set(), []
    for r in diag.runs or []:
        if r.point.command or r.trainer.command:
            # its own program: only what no program can do on this accelerator
            found = device_problems(r.trainer, cluster.accelerator, packaged=False)
        else:
            model = arch_of(r.trainer.model)  # as the planner and the trainer resolve it
            found = runtime_problems(
                r.trainer, cluster.accelerator, installed, model, prepared_videos, layers
            )
        for p in found:
            if (p.path, p.message) not in seen:
                seen.add((p.path, p.message))
                out.append(Problem(p.path, p.rule, p.message, p.fit))
    return out


def validate(
    study_file: Path = typer.Argument(..., help="Study YAML file."),
    as_json: bool = typer.Option(False, "--json", help="Print the plan (or the problems) as JSON."),
    show_all: bool = typer.Option(
        False, "--all", help=f"List every run in the table (default: the first {TABLE_ROWS}, then a summary)."
    ),
    allow_oom: bool = typer.Option(
        False, "--allow-oom", help="Report runs predicted over memory without failing (exit 0)."
    ),
) -> None:
    """Check a study: every point's topology plan, or every problem at once (exit code 2); a run predicted
    over its GPU's memory is a problem too, unless --allow-oom."""
    diag = diagnose_file(study_file)
    if as_json:
        ooms = _memory_verdicts(None, diag, []) if diag.ok else []
        problems = diag.problems + ([] if allow_oom else ooms)
        doc = {
            "study": diag.study.name if diag.study else None,
            "source": diag.source,
            "ok": not problems,
            "runs": [
                {
                    "name": r.name,
                    "run_id": r.run_id,
                    "index": r.index,
                    "repeat": r.repeat,
                    "nodes": r.layout.nodes,
                    "time_limit": r.time_limit,
                    "plan": r.rank_layout().to_dict(),
                }
                for r in diag.runs
            ],
            "problems": [
                {"path": p.path, "rule": p.rule, "message": p.message, "fit": p.fit} for p in problems
            ],
            "predicted_oom": [
                {"path": p.path, "rule": p.rule, "message": p.message, "fit": p.fit} for p in ooms
            ],
        }
        print_json(doc)  # one JSON rule for every command: finite numbers, never NaN
        raise typer.Exit(0 if not problems else EXIT_INVALID)
    ooms: list = []
    if diag.runs:
        shown = diag.runs if show_all else diag.runs[:TABLE_ROWS]
        out = console()
        out.print(_plan_table(diag, shown))
        if len(shown) < len(diag.runs):
            out.print(
                f"... and {len(diag.runs) - len(shown):,} more run(s) (--all lists every run; --json prints "
                "each with its plan)",
                markup=False,
            )
        if diag.ok:
            ooms = _memory_verdicts(out, diag, shown)
            if ooms and not allow_oom:
                fail_problems(diag.source, ooms)
    if not diag.ok:
        fail_problems(diag.source, diag.problems)
    note = f" ({len(ooms)} predicted over memory, allowed by --allow-oom)" if diag.runs and ooms else ""
    from mimo_jobs.model.resolve import arch_of
    from mimo_jobs.predict.params import model_summary
    from mimo_jobs.study.priced import unpriced

    if not diag.runs or any(unpriced(r) is None for r in diag.runs):
        console().print("model: " + "; ".join(model_summary(arch_of(diag.study.trainer.model))), markup=False)
    console().print(f"{diag.source}: OK, {len(diag.runs)} run(s) feasible{note}", style="green", markup=False)


def _nodes(r) -> str:
    return f"{r.layout.nodes} node{'s' if r.layout.nodes != 1 else ''}"


def _memory_verdicts(out, diag: Diagnosis, runs: list) -> list:
    """One line per run: does it fit in the memory of the study's GPU (cluster.hardware, else H100;
    `predict` says more). Returns a problem for every run over memory (all runs are judged, not only the
    ones shown), naming the rank classes, the bytes over and the cheapest change that fits."""
    from mimo_jobs.predict.cost import gpu_hours_text
    from mimo_jobs.predict.estimate import predict_shape
    from mimo_jobs.predict.hardware import study_gpu
    from mimo_jobs.predict.planning import cheapest_fix, over_text
    from mimo_jobs.predict.run import shape_of
    from mimo_jobs.predict.steptime import Efficiency, efficiency_for
    from mimo_jobs.study.diagnose import Problem
    from mimo_jobs.study.priced import unpriced

    gpu = study_gpu(diag.study.cluster)
    shown = {r.run_id for r in runs}
    problems, priced = [], {}
    for r in diag.runs:  # priced first: the band line above them is the band of the model that priced them
        shape = None if unpriced(r) else shape_of(r.layout, r.trainer, r.point.command)
        if shape is not None and shape not in priced:  # repeats and renamed points are priced once
            priced[shape] = predict_shape(shape, gpu, efficiency_for(gpu))
    if out is not None and any(unpriced(r) is None for r in runs):
        from mimo_jobs.predict.band import band_for, time_model
        from mimo_jobs.predict.hardware import layers_note

        where = "" if gpu.name == "cpu" else " (cluster.hardware.layers)"
        # how far such a time held on published runs nobody fitted, for the model that priced them
        band = band_for(gpu, time_model(p.time for p in priced.values()))
        held = f"; times {band.text()}" if band else ""
        out.print(f"memory and time on {gpu.name} {layers_note(gpu)}{where}{held}", markup=False)
    for r in diag.runs:
        why = unpriced(r)
        if why:  # a run of its own command without a model: nothing to price it as
            if out is not None and r.run_id in shown:
                out.print(f"run {r.run_id} ({_nodes(r)}): memory not judged: {why}", markup=False)
            continue
        pred = priced[shape_of(r.layout, r.trainer, r.point.command)]
        if out is not None and r.run_id in shown:
            cost = pred.run_cost()
            length = (
                f"; {gpu_hours_text(cost.gpu_hours)} GPU-h for {pred.iterations:,} iterations "
                f"({pred.time.iteration_s:.3g} s/iter predicted)"
                if pred.memory.fits and pred.iterations
                else ""
            )
            # without dataset statistics the images are the stated prior's (docs/predict.md): say so
            assumed = "; image tokens assumed (no dataset statistics)" if pred.shape.image_assumed else ""
            out.print(
                f"run {r.run_id} ({_nodes(r)}): memory on {gpu.name}: {pred.memory.verdict()}{length}{assumed}",
                markup=False,
            )
        if not pred.memory.fits and not (r.point.command or r.trainer.command):  # own program: not judged
            fix = cheapest_fix(pred.shape, gpu, Efficiency())
            problems.append(
                Problem(
                    f"{r.name} ({r.run_id})",
                    "memory",
                    f"predicted out of memory on {gpu.name}: {over_text(pred)}",
                    f"cheapest change that fits: {fix}"
                    if fix
                    else f"nothing fits on {r.layout.nodes} node(s)",
                )
            )
    return problems


def render(
    study_file: Path = typer.Argument(..., help="Study YAML file."),
    output: Path = typer.Option(
        Path("runs"), *OUT_FLAGS, help="Runs root: writes <root>/<study>/<run name>-<run id>/."
    ),
    templates: Optional[Path] = typer.Option(  # noqa: UP045 (typer needs Optional on 3.10)
        None, "--templates", help="Directory whose sbatch.sh.j2 / launch.sh.j2 override the packaged ones."
    ),
    only: Optional[list[str]] = typer.Option(  # noqa: UP045
        None, "--only", help="Render only this run (name or run id); repeatable."
    ),
) -> None:
    """Write run.yaml, launch.sh and sbatch.sh for every run of a study, and what the study's executor adds
    (the Kubernetes executor's trainjob.yaml); nothing is written on any error."""
    from rich.table import Table

    from mimo_jobs.study.render import RenderError, render_study
    from mimo_jobs.submit.executors import get_executor

    diag = study_or_fail(study_file)
    ex = get_executor(diag.study.cluster.executor)
    try:
        rendered = render_study(
            diag.study,
            output,
            templates_dir=templates,
            only=only or None,
            source=diag.source,
            pet_rendezvous=ex.pet_rendezvous,
            artefacts=ex.artefacts,
        )
    except RenderError as e:
        fail_problems(diag.source, e.problems)

    t = Table(
        title=f"{diag.study.name}: rendered {len(rendered)} run(s) under {output}", title_justify="left"
    )
    for col in ("run", "run id", "status", "run dir", "sbatch sha256"):
        t.add_column(col, overflow="fold")
    for r in rendered:
        t.add_row(r.run.name, r.run.run_id, r.status, str(r.run_dir), r.sbatch_sha256[:12])
    console().print(t)


def study_or_fail(study_file: Path) -> Diagnosis:
    """The diagnosis of a study file that has no problem; otherwise print them all and exit 2."""
    diag = diagnose_file(study_file)
    if not diag.ok or diag.study is None:
        fail_problems(diag.source, diag.problems)
    return diag


def register(app: typer.Typer) -> None:
    app.command("validate")(reports_errors(validate))
    app.command("render")(reports_errors(render))

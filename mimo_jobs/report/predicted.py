"""The planner's prediction of each run (mimo_jobs/predict: pure arithmetic, no torch) against what the run
measured: seconds per iteration and tokens/s/GPU against the steady-state figures, and each rank class's
memory against the trainer's per-rank facts.

A run is predicted when its resolved spec is in the store (runs.spec_json), the planner prices its program
(study/priced.py: a run of its own command only with a given model) and its accelerator is known: `cpu` for
a CPU run, else the report's --gpu (or the GPU its start events name, or its study's cluster.hardware),
priced with the study's cluster.hardware figures.

Each run is priced for the layers it ran with: the backend its trainer's first line names (`| layers local |`
or `| layers te |`, in the start record ingest keeps as an event), else its study's cluster.hardware.layers;
megatron-core's local layers are priced with their own efficiencies and the core attention the line names
(`| attention sdpa |` or `| attention unfused |`; a line without it predates the choice and ran unfused),
docs/predict.md, "Transformer Engine or local layers".

Predictions use the default efficiencies. Their error against the measured time means something only once
the efficiencies are fitted to the machine: with CALIBRATION_RUNS measured runs of a study priced on one
GPU, the section shows the calibrated error (fitted on every run) and the held-out error (fitted on the other
runs only: predict/measured.py); with fewer it says the times are uncalibrated and prints no error.
"""

from __future__ import annotations

import json
import re
import typing

from mimo_jobs.contract.modules import LLM, study_name
from mimo_jobs.predict.calibrate import mean_abs, relative_error

from .figures import iteration_s
from .model import PredictedMemoryRow, PredictedRow, RunRow
from .spec import run_spec

_MEASURED = ("param_bytes", "grad_buffer_bytes", "optimizer_state_bytes")


# The measured runs a study needs before the report prints prediction errors: a held-out figure then fits
# each run's prediction on at least two others (with two runs it would rest on one, a single scale).
CALIBRATION_RUNS = 3


def stored_model(text: str | None):
    """A runs row's `model` (a preset's name, or the JSON of a resolved description that ingest --model
    wrote for a log) as a ModelArch; None when there is none or it names nothing this version knows."""
    from mimo_jobs.model.arch import ArchError
    from mimo_jobs.model.resolve import arch_of

    if not text:
        return None
    try:
        return arch_of(json.loads(text) if text.lstrip().startswith("{") else text)
    except (ArchError, ValueError, TypeError):
        return None


def model_name(text: str | None) -> str | None:
    """The name of a runs row's `model` (the description's own name for a resolved one)."""
    if text and text.lstrip().startswith("{"):
        try:
            return json.loads(text).get("name") or text
        except (ValueError, AttributeError):
            return text
    return text


def priced_model(r: dict, spec):
    """(the ModelArch a run is priced as, None) or (None, why not): its spec's model when the planner prices
    its program (study/priced.py), else for a run known only from its logs the model ingest was told."""
    from mimo_jobs.model.resolve import arch_of
    from mimo_jobs.study.priced import unpriced

    if spec is None:
        m = stored_model(r.get("model"))
        return (m, None) if m is not None else (None, "model unknown (ingest --model tells it)")
    why = unpriced(spec)
    return (None, why) if why else (arch_of(spec.trainer.model), None)


def _prediction(spec, gpu):
    from mimo_jobs.predict.estimate import predict_run

    try:
        return predict_run(spec, gpu)
    except (ValueError, KeyError, TypeError, ZeroDivisionError):
        return None  # a layout the planner cannot price


# The trainer's first line names its layer backend as `| layers <backend> |` (trainer/model/kernels.py
# Kernels.describe); read from the raw start message, so a record cut short in the store still tells it.
_LAYERS_RE = re.compile(r"\| layers ([a-z]+) \|")


def recorded_layers(start_msgs: list[str]) -> str | None:
    """The layer backend a run's start events say it ran with (one of predict's hardware.LAYERS), if any."""
    from mimo_jobs.predict.hardware import LAYERS

    for m in start_msgs:
        hit = _LAYERS_RE.search(m or "")
        if hit and hit.group(1) in LAYERS:
            return hit.group(1)
    return None


# ... and, on the local layers, their core attention as `| attention <sdpa|unfused> |` (trainer.attention);
# a trainer older than that setting ran megatron-core's unfused attention and wrote no such field.
_ATTENTION_RE = re.compile(r"\| attention ([a-z]+) \|")


def recorded_attention(start_msgs: list[str]) -> str | None:
    """The core attention a run's start events say its local layers ran (model/attention.py), if they name
    the local layers: the named one, or `unfused` where the line predates the setting."""
    from mimo_jobs.model.attention import UNFUSED, Attention

    if recorded_layers(start_msgs) != "local":
        return None
    for m in start_msgs:
        hit = _ATTENTION_RE.search(m or "")
        if hit and hit.group(1) in typing.get_args(Attention):
            return hit.group(1)
    return UNFUSED


def as_ran(spec, attention: str | None):
    """`spec` with the core attention its run ran with (recorded_attention), where the start events say."""
    if attention is None or attention == spec.trainer.attention:
        return spec
    from dataclasses import replace

    return replace(spec, trainer=spec.trainer.model_copy(update={"attention": attention}))


def priced_on(gpu: str, layers: str) -> str:
    """The GPU a run was priced on, and its layers where they are not the planner's default (Transformer
    Engine's; a CPU's are always local)."""
    return f"{gpu} ({layers} layers)" if layers != "te" and gpu != "cpu" else gpu


def _time_row(row: RunRow, p, encoders: list[str]) -> PredictedRow:
    measured = iteration_s(row.t_median_ms)
    tok = p.tokens_per_s_per_gpu
    return PredictedRow(
        row.study,
        row.run_id,
        row.name,
        p.gpu.name,
        p.time.iteration_s,
        measured,
        relative_error(p.time.iteration_s, measured),
        tok,
        row.slots_per_s_per_gpu,
        relative_error(tok, row.slots_per_s_per_gpu),
        study_name(p.time.bottleneck, encoders),
        p.memory.verdict(),
        idle_fraction=p.time.idle_fraction,
        layers=p.gpu.layers,
    )


def class_label(modules: list[str], encoders: list[str]) -> str:
    """A rank class by the study's names of the modules its ranks run: one (`vision`, `audio`, `llm`), or
    every one joined, encoders in the run's order and the LLM last (`vision+audio+llm`: colocated)."""
    order = {m: i for i, m in enumerate(encoders)}
    return "+".join(sorted(modules, key=lambda m: (m == LLM, order.get(m, len(encoders)), m)))


def _measured_by_class(ranks: list[dict], encoders: list[str]) -> dict[tuple[str, int], list[dict]]:
    """(class, stage) -> each rank's measured figures: its total (a colocated rank has a row per module;
    its saved activation peak is the rank's, every module's, so it counts once) and that peak. The store
    names each rank's modules as the study does, so a rank's class is the modules it runs."""
    by_rank: dict[int, list[dict]] = {}
    for x in ranks:
        by_rank.setdefault(x["rank"], []).append(x)
    out: dict[tuple[str, int], list[dict]] = {}
    for rows in by_rank.values():
        lang = [x for x in rows if x["module"] == LLM]
        stage = int(lang[0].get("pp_rank") or 0) if lang else 0
        act = max(int(x["saved_activation_peak_bytes"] or 0) for x in rows)
        total = sum(int(x[k] or 0) for x in rows for k in _MEASURED) + act
        kind = class_label([x["module"] for x in rows], encoders)
        out.setdefault((kind, stage), []).append({"total": total, "activations": act})
    return out


def _memory_rows(row: RunRow, p, ranks: list[dict], encoders: list[str]) -> list[PredictedMemoryRow]:
    measured = _measured_by_class(ranks, encoders)
    pp = p.shape.layout.llm_pp
    out = []
    for cls in p.memory.classes:
        llm = [m for m in cls.modules if m.module == LLM]
        stage = llm[0].stage if llm else 0
        kind = class_label([study_name(m.module, encoders) for m in cls.modules], encoders)
        label = kind + (f" stage {stage}" if llm and pp > 1 else "")
        acts = sum(m.activation_bytes for m in cls.modules)
        pred = sum(m.weight_bytes + m.grad_bytes + m.optimizer_bytes for m in cls.modules) + acts
        got = measured.get((kind, stage), [])
        top = max((g["total"] for g in got), default=None)
        top_act = max((g["activations"] for g in got), default=None)
        out.append(
            PredictedMemoryRow(
                row.study,
                row.run_id,
                row.name,
                label,
                f"{cls.ranks[0]}-{cls.ranks[1]}",
                pred,
                top,
                len(got),
                relative_error(pred, top),
                predicted_activation_bytes=acts,
                measured_activation_bytes=top_act,
                activation_error=relative_error(acts, top_act) if top_act else None,
            )
        )
    return out


def predicted_rows(
    runs: list[dict],
    rows: list[RunRow],
    rank_memory: list[dict],
    gpu: str | None,
    gpu_names: dict,
    layers: dict | None = None,
    attention: dict | None = None,
) -> tuple[list[PredictedRow], list[PredictedMemoryRow], list[str]]:
    """`runs`: the store's runs rows (spec_json, accelerator); `gpu_names`: run_id -> the GPU its start
    events name; `layers`: run_id -> the layer backend they name (recorded_layers); `attention`: run_id -> the
    local layers' core attention they name (recorded_attention). Returns the time rows
    (calibrated where the study has enough measured runs), the memory rows and the notes: per study, GPU and
    layers whether the times are calibrated, and each run not priced."""
    from mimo_jobs.predict.hardware import measured_gpu
    from mimo_jobs.study.priced import unpriced

    by_id = {r.run_id: r for r in rows}
    ranks: dict[str, list[dict]] = {}
    for x in rank_memory:
        ranks.setdefault(x["run_id"], []).append(x)
    times, memory, notes = [], [], []
    groups: dict[tuple[str, str], list] = {}  # (study, GPU) -> [(row index, spec, GPU)]
    for r in runs:
        row, spec = by_id.get(r["run_id"]), run_spec(r)
        if row is None or spec is None:
            continue
        spec = as_ran(spec, (attention or {}).get(r["run_id"]))
        why = unpriced(spec)
        if why:
            notes.append(f"{row.study}/{row.name}: not priced: {why}")
            continue
        named = gpu or gpu_names.get(r["run_id"])
        g = measured_gpu(spec.cluster, r.get("accelerator"), named, (layers or {}).get(r["run_id"]))
        if g is None:
            continue
        p = _prediction(spec, g)
        if p is None:
            continue
        groups.setdefault((row.study, g.name, g.layers), []).append((len(times), spec, g))
        encoders = [m.module for m in r.get("modules") or []]
        times.append(_time_row(row, p, encoders))
        if r["run_id"] in ranks:
            memory += _memory_rows(row, p, ranks[r["run_id"]], encoders)
    for (study, gpu_name, backend), members in groups.items():
        notes.insert(0, _calibrate(times, members, f"{study} on {priced_on(gpu_name, backend)}"))
    return times, memory, notes


def _calibrate(times: list[PredictedRow], members: list, label: str) -> str:
    """Calibrate the time rows of one study and GPU when it has CALIBRATION_RUNS measured runs (the rows
    get their calibrated and held-out figures); the note says which it was."""
    from dataclasses import replace

    from mimo_jobs.predict.measured import Measured, calibrate
    from mimo_jobs.predict.run import shape_of

    got = [(i, s, g) for i, s, g in members if times[i].measured_s]
    if len(got) < CALIBRATION_RUNS:
        return (
            f"{label}: uncalibrated (the planner's default efficiencies), so no error is shown: "
            f"{len(got)} measured run(s), calibration needs {CALIBRATION_RUNS}; mimo-jobs predict STUDY --db "
            "FILE fits the efficiencies to the runs there are"
        )
    try:
        cal = calibrate(
            [Measured(times[i].name, times[i].run_id, shape_of(s.layout, s.trainer, s.point.command), times[i].measured_s)
             for i, s, _ in got],
            got[0][2],
        )  # fmt: skip
    except (ValueError, KeyError, TypeError, ZeroDivisionError):
        return f"{label}: uncalibrated: the planner could not fit its efficiencies to these runs"
    for (i, _, _), c in zip(got, cal.runs):
        times[i] = replace(
            times[i],
            calibrated=True,
            calibrated_s=c.calibrated_s,
            calibrated_error=c.calibrated_error,
            holdout_s=c.holdout_s,
            holdout_error=c.holdout_error,
        )
    by = {"nodes": "one node count at a time", "run": "one run at a time"}.get(cal.holdout_by, "")
    held = mean_abs([c.holdout_error for c in cal.runs if c.holdout_error is not None])
    return (
        f"{label}: calibrated on {len(got)} measured runs ({cal.scales.unknowns} scale(s) fitted): mean "
        f"|error| {cal.error_after:.1%} calibrated"
        + (f", {held:.1%} held out ({by}, fitted on the others)" if held is not None else "")
    )

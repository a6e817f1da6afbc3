"""build(): read the store (queries.py: the aggregation is done in SQL), then apply the pure math of
figures.py/triage.py per run and across the node counts of each study."""

from __future__ import annotations

import json
import math
from datetime import datetime, timezone
from functools import partial

from mimo_jobs.contract import jobstates
from mimo_jobs.contract.iteration import PHASES
from mimo_jobs.errors import MimoJobsError

from . import compare, cost, external, figures, fmt, queries
from .encphases import encoder_phase_rows
from .memory import memory_rows
from .model import ParityRow, Report, RunRow, StudyInfo, TriageRow
from .modules import bound_rows, module_rows
from .predicted import model_name, predicted_rows, priced_model, recorded_attention, recorded_layers
from .queries import StoreData
from .repeats import repeat_rows
from .spec import run_spec
from .triage import EventRow, triage

NO_GBS = "no global batch size in the log or the run: throughput and MFU unknown (pass a run.yaml)"
OK_STATES = {s.name for s in jobstates.STATES if not s.failed} | {"NO DATA"}  # the job-state table's


class ReportError(MimoJobsError, ValueError):
    """Bad report request (unknown study, no runs at the baseline node count)."""


def build(
    con,
    study: str | None = None,
    baseline_nodes: int | None = None,
    gpu: str | None = None,
    warmup_frac: float = 0.10,
    warmup_min: int = 1,
    tokens: float | None = None,
) -> Report:
    """The report for one study (or every study in the store when `study` is None); `tokens`: a token
    budget to project each run's time and GPU-hours to."""
    names = _select_studies(con, study)
    data = queries.read(con, names, warmup_frac, warmup_min)
    rows: list[RunRow] = []
    triage_rows: list[TriageRow] = []
    for r in data.runs:
        row, failure = _run(r, data, gpu)
        rows.append(row)
        if failure:
            triage_rows.append(failure)
    infos: list[StudyInfo] = []
    parity_rows: list[ParityRow] = []
    notes: list[str] = _superseded_notes(data.superseded)
    for name in names:
        srows = [x for x in rows if x.study == name]
        stored = data.studies[name]
        n0, note = _baseline(name, srows, baseline_nodes, stored["baseline_nodes"], study is not None)
        if note:
            notes.append(note)
        info = _efficiency(name, stored["scaling"], srows, n0)
        parity_rows += _parity(name, srows, info.baseline_runs, n0, data.curves)
        infos.append(info)
    rep = _assemble(infos, rows, triage_rows, parity_rows, data.curves, notes, gpu, warmup_frac, warmup_min)
    compare.compare_layouts(rows)
    rep.pairs, rep.unpaired = compare.pair_runs(rows, data.curves)
    rep.pair_verdicts = compare.group_verdicts(rep.pairs)
    gpu_names = {rid: _gpu_name(m) for rid, m in data.starts.items()}
    external.apply(
        rows, data.runs, data.steady, gpu, gpu_names, partial(queries.logged_extras, con), data.cut
    )
    rep.program_pairs = compare.program_pairs(rows, data.curves)
    rep.repeats = repeat_rows(rows)
    ids = [r.run_id for r in rows]
    cost.apply(rows, infos, queries.job_seconds(con, ids), queries.carried_totals(con, ids), tokens)
    rep.params["tokens_budget"] = tokens
    rep.rank_memory = queries.rank_memory(con, [r.run_id for r in rows])
    rep.memory = memory_rows(rep.rank_memory, {r.run_id: r for r in rows})
    layers = {rid: recorded_layers(m) for rid, m in data.starts.items()}
    attention = {rid: recorded_attention(m) for rid, m in data.starts.items()}
    rep.predicted, rep.predicted_memory, rep.predicted_notes = predicted_rows(
        data.runs, rows, rep.rank_memory, gpu, gpu_names, layers, attention
    )
    rep.modules = module_rows(rep.rank_memory, rows)
    rep.bounds = bound_rows(rep.modules, rows, rep.predicted)
    rep.encoder_phases = _encoder_phases(con, data, rows, rep.predicted)
    return rep


def _encoder_phases(con, data, rows: list[RunRow], predicted) -> list:
    """Each module's forward and backward of the runs of several encoder modules (report/encphases.py); a
    run of one encoder has them in its phases and bounds sections already."""
    names = {r["run_id"]: [m.module for m in r.get("modules") or []] for r in data.runs}
    several = {rid: c for rid, c in data.cut.items() if len(names.get(rid, [])) > 1}
    if not several:
        return []
    return encoder_phase_rows(rows, names, queries.phase_means(con, several), predicted)


# -- reading


def _select_studies(con, study: str | None) -> list[str]:
    """The studies to report: `study` (which must be in the store), or all of the store's."""
    known = queries.study_names(con)
    if study is not None and study not in known:
        raise ReportError(
            f"no study {study!r} in the store; known: {', '.join(known) or '(none: run ingest)'}"
        )
    return [study] if study is not None else known


def _superseded_notes(superseded: list[tuple[dict, str, str | None]]) -> list[str]:
    """What the report says of the runs a later attempt of their point superseded: it reports the latest
    attempt of each point only, and names the earlier ones it left out."""
    if not superseded:
        return []
    gone = "; ".join(
        f"{r['study']}/{r['name']} run {r['run_id']} ({state or 'no job'}) by run {by}"
        for r, by, state in sorted(superseded, key=lambda x: (x[0]["study"], x[0]["name"], x[0]["run_id"]))
    )
    return [
        f"latest attempt of each point only: {len(superseded)} earlier run(s) of the same name and layout "
        f"superseded and left out: {gone}"
    ]


# -- per run


def _run(r: dict, data: StoreData, gpu: str | None) -> tuple[RunRow, TriageRow | None]:
    """One run's row (state, steady-state figures, final loss) and, when it failed or hung, its triage."""
    rid = r["run_id"]
    last_job = _last_job(rid, data)
    evs = data.events.get((rid, last_job), []) if last_job else []
    row = _new_row(r, data.span.get(rid), data.cut.get(rid), *_state(rid, data, last_job, evs))
    a = data.steady.get(rid)
    if a and a[0] is not None:
        _steady_state(row, a)  # the iteration time needs no batch size; throughput does
        if row.gbs:
            tp = _throughput(row)
            _tokens(row, a[4 + len(PHASES) :])
            row.mfu, row.mfu_note = _mfu(r, row, tp.samples_per_s, gpu or _gpu_name(data.starts.get(rid, [])))
        else:
            row.mfu_note = NO_GBS
            row.flags.append(NO_GBS)
    bad = data.nonfinite.get(rid)
    if bad:
        row.flags.append(
            f"{bad} iteration(s) with a NaN/Inf loss or gradient: skipped, nothing learned from them"
        )
    c = data.curves.get(rid)  # a run has a curve only when it has a span
    if c:  # the curve ends at the last iteration with a finite loss
        row.final_samples, row.final_loss = int(c[-1][0]), c[-1][1]
    if row.state in OK_STATES:
        return row, None
    return row, _triage(row, last_job, evs, data.activity.get(rid, []))


def _last_job(rid: str, data: StoreData) -> str | None:
    """The run's latest job: the scheduler's, else the one with the latest logged activity."""
    if rid in data.jobs:
        return data.jobs[rid][0]
    return max(data.activity[rid])[1] if rid in data.activity else None


def _state(rid: str, data: StoreData, last_job: str | None, evs: list[EventRow]) -> tuple[str, str]:
    """The run's state and where it comes from: the scheduler's (jobs), else derived from the logs."""
    if rid in data.jobs and data.jobs[rid][1]:
        return str(data.jobs[rid][1]).split()[0], "jobs"
    s = data.span.get(rid)
    state = _derive_state(
        s[1] if s else None,
        s[4] if s else None,
        {e.kind for e in evs},
        data.ends.get((rid, last_job)) if last_job else None,
    )
    return state, "derived"


def _derive_state(
    reached: int | None, train_iters: int | None, kinds: set[str], end_reason: str | None
) -> str:
    """A state from the iterations reached and the events/end reason of the latest job."""
    if reached is not None and train_iters and reached >= train_iters:
        return "COMPLETED"
    for kind, state in (
        ("time_limit", "TIMEOUT"),
        ("node_fail", "NODE_FAIL"),
        ("preemption", "PREEMPTED"),
        ("cancelled", "CANCELLED"),
    ):
        if kind in kinds:
            return state
    from mimo_jobs.contract.events import FAILURE_KINDS

    if kinds & set(FAILURE_KINDS):
        return "FAILED"
    if end_reason:
        r = end_reason.lower()
        if "complete" in r or r in ("done", "finished", "ok"):
            return "COMPLETED"
        if "time" in r:
            return "TIMEOUT"
        if "preempt" in r:
            return "PREEMPTED"
        return "FAILED"
    if reached is None and not kinds:
        return "NO DATA"
    return "INCOMPLETE"


def _new_row(r: dict, s: tuple | None, window_from: int | None, state: str, state_src: str) -> RunRow:
    """The run's row before any figure: identity, size, layout, state and progress."""
    return RunRow(
        study=r["study"],
        run_id=r["run_id"],
        name=r["name"],
        nodes=r["nodes"],
        gpus=r["world"] or ((r["nodes"] or 0) * (r["gpus_per_node"] or 0)) or None,
        gbs=r["gbs"] or (s[8] if s else None),
        seq_length=r["seq_length"],
        model=model_name(r["model"]),
        layout=_layout(r),
        state=state,
        state_source=state_src,
        iterations=s[1] if s else None,
        train_iters=s[4] if s else None,
        jobs=s[3] if s else 0,
        window_from=window_from,
        colocated=bool(r.get("colocated")),
        repeat=r.get("repeat"),
        pkg_version=r.get("pkg_version"),
        git_sha=r.get("git_sha"),
    )


def _layout(r: dict) -> str:
    """The parallel layout as "enc tp1 dp8 | llm tp2 ep8 dp128", the encoders by name when several
    ("vision tp1 dp4 | audio tp2 dp2 | llm ..."); "-" when unknown."""
    from mimo_jobs.store.modules import layout_text

    if not r.get("modules") or r.get("llm_dp") is None:
        return "-"
    enc = layout_text(r["modules"])
    llm = f"llm tp{r['llm_tp']}" + (f" pp{r['llm_pp']}" if (r["llm_pp"] or 1) > 1 else "")
    llm += (f" ep{r['llm_ep']}" if (r["llm_ep"] or 1) > 1 else "") + f" dp{r['llm_dp']}"
    return f"{enc} | {llm}"


def _steady_state(row: RunRow, a: tuple) -> None:
    """The iteration time over the steady-state window and each phase's mean and share of it."""
    row.t_median_ms, row.t_mean_ms, row.t_std_ms, row.window_n = a[0], a[1], a[2], a[3]
    ph = {p: v for p, v in zip(PHASES, a[4 : 4 + len(PHASES)]) if v is not None and math.isfinite(v)}
    total = sum(ph.values())
    row.phase_ms = ph
    row.phase_share = {p: v / total for p, v in ph.items()} if total > 0 else {}


def _throughput(row: RunRow) -> figures.Throughput:
    """Samples and tokens per second, in all and per GPU, at the median iteration time."""
    tp = figures.throughput(row.gbs, row.t_median_ms, row.seq_length, row.gpus)
    row.samples_per_s, row.slots_per_s = tp.samples_per_s, tp.tokens_per_s
    row.samples_per_s_per_gpu, row.slots_per_s_per_gpu = tp.samples_per_s_per_gpu, tp.tokens_per_s_per_gpu
    return tp


def _tokens(row: RunRow, sums: tuple) -> None:
    """The carried (headline), loss-bearing and padded token figures from the window's counted tokens."""
    ms, carried, loss, image, n = (tuple(sums) + (None,) * 5)[:5]
    t = figures.token_rates(ms, carried, loss, image, n or 0, row.gbs, row.seq_length, row.gpus)
    if t is None:
        return
    row.tokens_per_s, row.tokens_per_s_per_gpu = t.carried_per_s, t.carried_per_s_per_gpu
    row.loss_tokens_per_s_per_gpu, row.padded_share = t.loss_per_s_per_gpu, t.padded_share
    row.carried_tokens_per_sample, row.image_tokens_per_sample = t.carried_per_sample, t.image_per_sample


def _mfu(r: dict, row: RunRow, samples_per_s: float, named: str | None) -> tuple[float | None, str]:
    """MFU and a note on it: only for GPU runs whose GPU (named, or the study's cluster.hardware, with its
    figures: predict/hardware.py) and model preset are known. The FLOPs are those of what was carried where
    the trainer counted it (measured image and carried tokens per sample), else of the study's data mix (a
    text-only model: its LLM's FLOPs at seq_length, no images)."""
    from mimo_jobs.predict.flops import flops_per_sample, one_module_per_kind
    from mimo_jobs.predict.hardware import measured_gpu
    from mimo_jobs.predict.run import image_mix, sample_flops

    gpus = row.gpus
    spec = run_spec(r)
    # run.yaml holds the resolved model; a log's is what ingest was told; a run of its own command has one
    # only when its study gives it (study/priced.py)
    preset, why = priced_model(r, spec)
    if r["accelerator"] == "cpu":
        return None, "cpu run"
    if preset is None or not r["seq_length"] or not gpus:
        return None, f"model FLOPs unknown: {why}" if why else "model FLOPs unknown"
    g = measured_gpu(spec.cluster if spec else None, r["accelerator"], named)
    if g is None:
        return None, "GPU peak unknown (pass --gpu H100|H200|A100)"
    data = spec.trainer.data if spec else None
    # the store keeps the image tokens a run counted, not its audio tokens nor which module's they are: a
    # model with an audio module or two image modules is priced from its data's mix (below), module by module
    kinds = [a.modality for _, a in preset.named_encoders]
    measured = one_module_per_kind(preset) and "audio" not in kinds
    if measured and row.carried_tokens_per_sample is not None and row.image_tokens_per_sample is not None:
        image = next((a for _, a in preset.named_encoders if a.modality == "image"), None)
        per_image = image_mix(data, image)[1]
        llm_tokens = max(1, round(row.carried_tokens_per_sample))
        fps = flops_per_sample(preset, llm_tokens, row.image_tokens_per_sample, per_image).total
        return figures.mfu(fps, samples_per_s, gpus, g.peak_flops), "FLOPs of the carried tokens (measured)"
    fps = sample_flops(preset, r["seq_length"], data).total
    if preset.text_only:
        return figures.mfu(fps, samples_per_s, gpus, g.peak_flops), "text-only model: the LLM's FLOPs alone"
    how = "mock data mix" if getattr(data, "provider", None) == "mock" else "one full-size image per sample"
    return figures.mfu(fps, samples_per_s, gpus, g.peak_flops), f"image tokens/sample from {how}"


def _gpu_name(start_msgs: list[str]) -> str | None:
    """The GPU model a run's start events name, if any."""
    for m in start_msgs:
        try:
            d = json.loads(m)
        except (ValueError, TypeError):
            continue
        for src in (d.get("extras") or {}, d):
            for k in ("gpu", "device_name", "device"):
                v = src.get(k) if isinstance(src, dict) else None
                if isinstance(v, str) and v:
                    return v
    return None


def _triage(row: RunRow, last_job: str | None, evs: list[EventRow], activity: list[tuple]) -> TriageRow:
    """Why a run that did not complete stopped (from its latest job's events); flags the row with it."""
    last_t = max((t for t, j in activity if j == last_job), default=None)
    v = triage(evs, row.gpus, row.iterations, None if last_t == datetime.min else last_t)
    row.flags.append(f"{row.state.lower()}: {v.reason[:120]}")
    return TriageRow(
        row.study,
        row.run_id,
        row.name,
        last_job,
        row.state,
        v.rank,
        v.node,
        v.kind,
        v.reason,
        v.time,
        v.evidence,
    )


# -- across node counts, per study


def _baseline(
    name: str, srows: list[RunRow], requested: int | None, stored: int | None, strict: bool
) -> tuple[int | None, str | None]:
    """The study's baseline node count N0 (requested, else stored, else the fewest nodes with data), and a
    note when the stored or requested one has no data. A requested one must have data when `strict`."""
    n0 = requested or stored
    node_counts = sorted({x.nodes for x in srows if x.t_median_ms is not None and x.nodes is not None})
    if requested is not None and strict and requested not in node_counts:
        raise ReportError(
            f"--baseline-nodes {requested}: study {name!r} has no run with data at "
            f"{requested} nodes; node counts with data: "
            f"{', '.join(map(str, node_counts)) or 'none'}"
        )
    if n0 in node_counts:
        return n0, None
    note = f"{name}: baseline {n0} nodes has no data; using {node_counts[0] if node_counts else '-'}"
    return (node_counts[0] if node_counts else None), (note if n0 is not None else None)


def _efficiency(name: str, scaling: str, srows: list[RunRow], n0: int | None) -> StudyInfo:
    """Each run's scaling efficiency E(N) = P(N)/P(N0), speed-up t(N0)/t(N) and flags against the baseline
    runs (at N0 nodes); P is the first of fmt.METRICS every run with data has."""
    with_data = [x for x in srows if x.t_median_ms is not None]
    metric = fmt.metric_of(with_data)

    def perf(x: RunRow) -> float | None:
        return fmt.per_gpu(x, metric)

    base = [x for x in with_data if x.nodes == n0]
    sizes = len({x.nodes for x in with_data})
    if sizes == 1:  # layouts of one size: compared as layouts (compare.py), not as a scaling curve
        return StudyInfo(name, scaling, n0, [x.run_id for x in base], metric, sizes)
    p0 = _median([perf(x) for x in base])
    t0 = _median([x.t_median_ms for x in base])
    g0 = base[0].gbs if base else None
    for x in with_data:
        x.efficiency = figures.efficiency(perf(x), p0)
        x.speedup = t0 / x.t_median_ms if t0 and scaling == "strong" else None
        cv = x.t_std_ms / x.t_mean_ms if x.t_std_ms is not None and x.t_mean_ms else None
        flags = figures.scaling_flags(x.efficiency, x.nodes, n0, x.t_median_ms, t0, scaling, cv, x.gbs, g0)
        x.flags = flags + x.flags
    return StudyInfo(name, scaling, n0, [x.run_id for x in base], metric, sizes)


def _parity(
    name: str, srows: list[RunRow], base_runs: list[str], n0: int | None, curves: dict[str, list]
) -> list[ParityRow]:
    """Loss parity at equal consumed samples of each run against the (first) baseline run; flags the runs
    whose loss differs by more than the tolerance."""
    base_curve = curves.get(base_runs[0]) if base_runs else None
    if not base_curve:
        return []
    pts = figures.parity_points([curves.get(x.run_id, []) for x in srows if curves.get(x.run_id)])
    out = []
    for x in srows:
        c = curves.get(x.run_id)
        if not c or x.run_id == base_runs[0]:
            continue
        par = figures.loss_parity(c, base_curve, pts)
        x.loss_parity_rel = par.max_rel_diff
        if par.max_rel_diff is not None and par.max_rel_diff > figures.PARITY_TOLERANCE:
            x.flags.append(f"loss differs from {n0} nodes by {par.max_rel_diff:.1%} at equal samples")
        out.append(
            ParityRow(
                name,
                x.run_id,
                x.name,
                x.nodes,
                par.samples,
                par.loss,
                par.baseline_loss,
                par.max_abs_diff,
                par.max_rel_diff,
            )
        )
    return out


def _median(vals: list[float | None]) -> float | None:
    v = [x for x in vals if x is not None]
    return figures.stats(v).median if v else None


# -- the report


def _assemble(
    infos: list[StudyInfo],
    rows: list[RunRow],
    triage_rows: list[TriageRow],
    parity_rows: list[ParityRow],
    curves: dict[str, list[tuple[float, float]]],
    notes: list[str],
    gpu: str | None,
    warmup_frac: float,
    warmup_min: int,
) -> Report:
    """The Report: the parts above, the notes on how the figures were computed and the parameters."""
    notes = [
        "per-GPU throughput divides by ALL GPUs of the job (encoder and LLM GPUs)",
        fmt.TOKENS_NOTE,
        (
            f"steady state: iterations after the first max({warmup_min}, {warmup_frac:.0%}) of each run's "
            "logged span; t = median (mean, std also shown)"
        ),
        *notes,
    ]
    return Report(
        generated_at=datetime.now(timezone.utc).replace(tzinfo=None),
        studies=infos,
        runs=rows,
        triage=triage_rows,
        parity=parity_rows,
        curves=curves,
        notes=notes,
        params={
            "warmup_frac": warmup_frac,
            "warmup_min": warmup_min,
            "gpu": gpu,
            "efficiency_floor": figures.EFFICIENCY_FLOOR,
            "speedup_tolerance": figures.SPEEDUP_TOLERANCE,
            "parity_tolerance": figures.PARITY_TOLERANCE,
        },
    )

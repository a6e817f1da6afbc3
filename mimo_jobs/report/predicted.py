"""The planner's prediction of each run (mimo_jobs/predict: pure arithmetic, no torch) against what the run
measured: seconds per iteration and tokens/s/GPU against the steady-state figures, and each rank class's
memory against the trainer's per-rank facts.

A run is predicted when its resolved spec is in the store (runs.spec_json) and its accelerator is known:
`cpu` for a CPU run, else the report's --gpu (or the GPU its start events name, or its study's
cluster.hardware), priced with the study's cluster.hardware figures. Predictions use the
default efficiencies, so the error says how far the uncalibrated planner was (`predict --db` calibrates).
"""

from __future__ import annotations

from mimo_jobs.predict.calibrate import relative_error

from .model import PredictedMemoryRow, PredictedRow, RunRow
from .spec import run_spec

_MEASURED = ("param_bytes", "grad_buffer_bytes", "optimizer_state_bytes")


def _prediction(spec, gpu):
    from mimo_jobs.predict.estimate import predict_run

    try:
        return predict_run(spec, gpu)
    except (ValueError, KeyError, TypeError, ZeroDivisionError):
        return None  # a layout the planner cannot price


def _time_row(row: RunRow, p) -> PredictedRow:
    measured = row.t_median_ms / 1000.0 if row.t_median_ms else None
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
        row.tokens_per_s_per_gpu,
        relative_error(tok, row.tokens_per_s_per_gpu),
        p.time.bottleneck,
        p.memory.verdict(),
    )


def _measured_by_class(ranks: list[dict]) -> dict[tuple[str, int], list[int]]:
    """(class, stage) -> each rank's measured total. A colocated rank has a row per module; its saved
    activation peak is the rank's (both modules), so it counts once."""
    by_rank: dict[int, list[dict]] = {}
    for x in ranks:
        by_rank.setdefault(x["rank"], []).append(x)
    out: dict[tuple[str, int], list[int]] = {}
    for rows in by_rank.values():
        mods = {x["module"] for x in rows}
        lang = [x for x in rows if x["module"] == "language"]
        stage = int(lang[0].get("pp_rank") or 0) if lang else 0
        kind = "encoder+llm" if len(mods) > 1 else ("encoder" if mods == {"encoder"} else "llm")
        total = sum(int(x[k] or 0) for x in rows for k in _MEASURED)
        total += max(int(x["saved_activation_peak_bytes"] or 0) for x in rows)
        out.setdefault((kind, stage), []).append(total)
    return out


def _memory_rows(row: RunRow, p, ranks: list[dict]) -> list[PredictedMemoryRow]:
    measured = _measured_by_class(ranks)
    pp = p.shape.layout.llm_pp
    out = []
    for cls in p.memory.classes:
        llm = [m for m in cls.modules if m.module == "llm"]
        stage = llm[0].stage if llm else 0
        kind = "encoder+llm" if len(cls.modules) > 1 else cls.modules[0].module
        label = kind + (f" stage {stage}" if llm and pp > 1 else "")
        pred = sum(
            m.weight_bytes + m.grad_bytes + m.optimizer_bytes + m.activation_bytes for m in cls.modules
        )
        got = measured.get((kind, stage), [])
        top = max(got) if got else None
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
            )
        )
    return out


def predicted_rows(
    runs: list[dict], rows: list[RunRow], rank_memory: list[dict], gpu: str | None, gpu_names: dict
) -> tuple[list[PredictedRow], list[PredictedMemoryRow]]:
    """`runs`: the store's runs rows (spec_json, accelerator); `gpu_names`: run_id -> the GPU its start
    events name."""
    from mimo_jobs.predict.hardware import measured_gpu

    by_id = {r.run_id: r for r in rows}
    ranks: dict[str, list[dict]] = {}
    for x in rank_memory:
        ranks.setdefault(x["run_id"], []).append(x)
    times, memory = [], []
    for r in runs:
        row, spec = by_id.get(r["run_id"]), run_spec(r)
        if row is None or spec is None:
            continue
        g = measured_gpu(spec.cluster, r.get("accelerator"), gpu or gpu_names.get(r["run_id"]))
        if g is None:
            continue
        p = _prediction(spec, g)
        if p is None:
            continue
        times.append(_time_row(row, p))
        if r["run_id"] in ranks:
            memory += _memory_rows(row, p, ranks[r["run_id"]])
    return times, memory

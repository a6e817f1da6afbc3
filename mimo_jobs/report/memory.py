"""The trainer's per-rank memory facts, summarised per run, module and pipeline stage (the largest figure
over the ranks of each: the rank that decides whether a layout fits). Modules by the study's names, as the
store keeps them (vision, audio, llm); each module's own activation peak beside its rank's."""

from __future__ import annotations

from collections import defaultdict

from mimo_jobs.contract.modules import LLM

from .model import MemoryRow, RunRow

_FIGURES = (
    "params",
    "param_bytes",
    "grad_buffer_bytes",
    "optimizer_state_bytes",
    "saved_activation_peak_bytes",
    "inflight_peak",
)


def memory_rows(ranks: list[dict], runs: dict[str, RunRow]) -> list[MemoryRow]:
    groups: dict[tuple, list[dict]] = defaultdict(list)
    staged = {r["run_id"] for r in ranks if r["module"] == LLM and (r.get("pp_rank") or 0) > 0}
    for r in ranks:
        stage = r.get("pp_rank") if r["module"] == LLM and r["run_id"] in staged else None
        groups[(r["run_id"], r["module"], stage)].append(r)
    out = []
    for (rid, module, stage), rs in groups.items():
        run = runs.get(rid)
        if run is None:
            continue
        top = {k: max(int(x[k] or 0) for x in rs) for k in _FIGURES}
        cuda = [x["cuda_max_allocated_bytes"] for x in rs if x.get("cuda_max_allocated_bytes") is not None]
        own = [x["module_saved_activation_peak_bytes"] for x in rs]
        own = [int(x) for x in own if x is not None]
        out.append(
            MemoryRow(
                run.study,
                rid,
                run.name,
                module,
                stage,
                len(rs),
                **top,
                cuda_max_allocated_bytes=max(cuda, default=None),
                module_activation_peak_bytes=max(own, default=None),
            )
        )
    return sorted(out, key=lambda m: (m.study, m.name, m.module == LLM, m.module, m.stage or 0))

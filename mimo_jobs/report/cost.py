"""What runs cost: GPU-hours and node-hours from the elapsed times of their jobs (every attempt), GPU-hours
per billion carried tokens, and the time and GPU-hours to a token budget at the measured carried rate. Pure:
rows and sums in, figures set on the rows."""

from __future__ import annotations

from mimo_jobs.predict.cost import cost_of, to_budget

from .model import RunRow, StudyInfo


def apply(
    rows: list[RunRow],
    infos: list[StudyInfo],
    jobs: dict[str, tuple[float, int, int]],
    carried: dict[str, int],
    budget: float | None,
) -> None:
    for r in rows:
        secs, _, left = jobs.get(r.run_id, (0.0, 0, 0))
        r.jobs_uncosted = left
        if r.run_id in jobs and r.gpus:
            c = cost_of(secs, r.gpus, r.nodes or 0)
            r.gpu_hours = c.gpu_hours
            r.node_hours = c.node_hours if r.nodes else None
            tok = carried.get(r.run_id)
            if tok:
                r.gpu_hours_per_billion_tokens = r.gpu_hours / (tok / 1e9)
        b = to_budget(budget, r.tokens_per_s, r.gpus or 0, r.nodes or 0) if budget else None
        if b is not None:
            r.budget_hours = b.hours
            r.budget_gpu_hours = b.gpu_hours if r.gpus else None
    for s in infos:
        mine = [r for r in rows if r.study == s.name and r.gpu_hours is not None]
        if mine:
            s.gpu_hours = sum(r.gpu_hours for r in mine)
            s.node_hours = sum(r.node_hours or 0.0 for r in mine)

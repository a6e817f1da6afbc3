"""The one-process reference's program: per microbatch, each encoder module's forward (replica by replica,
as its ranks would embed), every lane's LLM forward on the embeddings (no bridge), one backward of their
sum."""

from __future__ import annotations

import torch

from mimo_jobs.trainer.build import TrainState
from mimo_jobs.trainer.parallel.bridge import segments_of_encoder
from mimo_jobs.trainer.step.common import PhaseTimer, Tally, embed, llm_forward, phase, replica_samples
from mimo_jobs.trainer.step.dpsync import backward_of


def microbatches(st: TrainState, batches: list[dict], n_tokens: float, tm: PhaseTimer) -> Tally:
    tally = Tally()
    lanes = range(st.plan.layout.llm_dp)
    for m, mb in enumerate(batches):
        emb: dict[int, dict] = {lane: {} for lane in lanes}
        for mod in st.encoders:
            a = tm.mark()
            for lane, rows in _module_rows(st, mod, mb, tally).items():
                emb[lane][mod.label] = rows
            tm.add(phase(st, mod, "fwd"), a)
        a = tm.mark()
        total = None
        for lane in lanes:
            tally.consumed(st, mb[lane])
            ls = llm_forward(st, mb[lane], emb[lane])
            tally.loss_sum += float(ls.detach())
            total = ls / max(n_tokens, 1.0) if total is None else total + ls / max(n_tokens, 1.0)
        tm.add("llm_fwd", a)
        a = tm.mark()
        if total.requires_grad:
            with backward_of(st, m):
                total.backward()
        tm.add("llm_bwd", a)
    return tally


def _module_rows(st: TrainState, mod, mb: dict, tally: Tally) -> dict:
    """{lane: the module's embeddings of the lane's samples}, computed replica by replica: the same
    per-replica batches as the module's ranks see (its plan as it meets the LLM, grids.module_plan)."""
    name, plan = mod.label, st.module_plans[mod.label]
    per_lane: dict[int, list] = {}
    for e in range(plan.layout.single.dp):  # a module's plan holds that module alone
        segs = segments_of_encoder(plan, e)
        items, _keys, _counts = replica_samples(mb, segs, name)
        flat = embed(st, mod, items)
        tally.empty_encoder_microbatches += int(flat.shape[0] == 0)
        row = 0
        for g in segs:
            n = sum(mb[g.lane].counts(name)[g.lane_start : g.lane_start + g.n])
            per_lane.setdefault(g.lane, []).append(flat[row : row + n])
            row += n
    return {lane: torch.cat(parts) for lane, parts in per_lane.items()}

"""Feasible layouts for N nodes, ranked by predicted iteration time.

Candidates come from bounded arithmetic over divisors (TP within a node, PP dividing the layers, EP dividing
the experts, encoder DP dividing the global batch); `topology.check` decides feasibility (the rules live
there only), memory.py drops what does not fit, steptime.py ranks the rest.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from mimo_jobs.study.topology import Layout, check, derive_llm_dp

from .estimate import Prediction, predict_shape
from .hardware import GPU
from .run import RunShape, on_layout
from .steptime import Efficiency

MAX_PP = 8  # deeper pipelines only add bubble for models of this size


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


@dataclass(frozen=True)
class Candidate:
    layout: Layout
    prediction: Prediction


def candidate_layouts(base: Layout, nodes: int) -> list[Layout]:
    """Every feasible layout of `base`'s model and batch on `nodes` nodes (heterogeneous and colocated)."""
    gpn, experts = base.gpus_per_node, base.num_experts
    tps = _divisors(gpn)
    pps = [p for p in _divisors(base.llm_layers or 1) if p <= MAX_PP]
    eps = _divisors(experts) if experts else [1]
    enc_dps = _divisors(base.gbs)
    out = []
    common = {"nodes": nodes, "enc_pp": 1, "llm_cp": 1, "llm_etp": 1}
    for ltp in tps:
        for pp in pps:
            for ep in eps:
                colo_dp = derive_llm_dp(nodes, gpn, 0, 1, 1, ltp, pp)
                if colo_dp and pp == 1:
                    out.append(
                        replace(
                            base,
                            **common,
                            colocated=True,
                            enc_tp=ltp,
                            enc_dp=colo_dp,
                            llm_tp=ltp,
                            llm_pp=1,
                            llm_dp=colo_dp,
                            llm_ep=ep,
                        )
                    )
                for etp in tps:
                    for edp in enc_dps:
                        if etp * edp >= nodes * gpn:
                            break
                        dp = derive_llm_dp(nodes, gpn, etp, 1, edp, ltp, pp)
                        if dp:
                            out.append(
                                replace(
                                    base,
                                    **common,
                                    colocated=False,
                                    enc_tp=etp,
                                    enc_dp=edp,
                                    llm_tp=ltp,
                                    llm_pp=pp,
                                    llm_dp=dp,
                                    llm_ep=ep,
                                )
                            )
    return [lay for lay in out if not check(lay)]


def best_layouts(
    shape: RunShape, gpu: GPU, nodes: int, eff: Efficiency, top: int = 5
) -> tuple[list[Candidate], int]:
    """The `top` fastest layouts that fit in memory, and how many feasible layouts were priced."""
    layouts = candidate_layouts(shape.layout, nodes)
    fits = []
    for lay in layouts:
        rs = on_layout(shape, lay)
        p = predict_shape(rs, gpu, eff, name=point_name(lay))
        if p.memory.fits:
            fits.append(Candidate(lay, p))
    fits.sort(key=lambda c: c.prediction.time.iteration_s)
    return fits[:top], len(layouts)


def point_name(lay: Layout) -> str:
    enc = "colo" if lay.colocated else f"e{lay.enc_tp}x{lay.enc_dp}"
    pp = f"p{lay.llm_pp}" if lay.llm_pp > 1 else ""
    return f"{lay.nodes}n-{enc}-l{lay.llm_tp}x{lay.llm_ep}x{lay.llm_dp}{pp}-g{lay.gbs}"


def yaml_point(lay: Layout) -> str:
    """The layout as a study's matrix point (one flow-style YAML line)."""
    llm = f"tp: {lay.llm_tp}" + (f", pp: {lay.llm_pp}" if lay.llm_pp > 1 else "")
    llm += (f", ep: {lay.llm_ep}" if lay.num_experts else "") + f", dp: {lay.llm_dp}"
    batch = f", gbs: {lay.gbs}" + (f", mbs: {lay.mbs}" if lay.mbs > 1 else "")
    if lay.colocated:
        return f"- {{nodes: {lay.nodes}, colocated: true, llm: {{{llm}}}{batch}}}"
    return f"- {{nodes: {lay.nodes}, encoder: {{tp: {lay.enc_tp}, dp: {lay.enc_dp}}}, llm: {{{llm}}}{batch}}}"

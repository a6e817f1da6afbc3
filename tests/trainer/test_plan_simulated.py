"""The production plan simulated rank by rank, without 800 processes: for every rank of each run of
studies/scale_33n_68n_100n.yaml (and a pipelined and a colocated variant), the groups the trainer creates
(grids.group_enumeration: the rank lists HyperCommGrid hands to torch, in the trainer's creation order),
the rank's role, the bridge pairs and the data lanes, all from the trainer's own code, checked against the
planner's independent arithmetic (topology.RankLayout) and against what torch requires (each rank in exactly one
subgroup of every kind: new_subgroups_by_enumeration deadlocks or fails otherwise)."""

from __future__ import annotations

import pytest

from helpers import STUDIES
from mimo_jobs.study.expand import runs_of
from mimo_jobs.study.load import load_study, parse_study
from mimo_jobs.trainer.build import rank_lanes
from mimo_jobs.trainer.parallel.bridge import segments_of_encoder, segments_of_lane
from mimo_jobs.trainer.parallel.grids import (
    GROUPS,
    encoder_shapes,
    group_enumeration,
    language_shape,
    role_of,
)


def _runs():
    study = load_study(STUDIES / "scale_33n_68n_100n.yaml", env={})
    out = list(runs_of(study))
    doc = study.model_dump(mode="json")
    doc["matrix"] = {
        "defaults": {"gbs": 768, "mbs": 1},
        "points": [
            # a pipelined LLM: 2 stages of TP2 x EP8 (ETP = TP) over 64 lanes
            {"nodes": 33, "encoder": {"dp": 8}, "llm": {"tp": 2, "pp": 2, "ep": 8, "etp": 2, "dp": 64}},
            # the colocated baseline where one fits at GBS 768: 256 GPUs, TP2 -> 128 lanes
            {"nodes": 32, "colocated": True, "llm": {"tp": 2, "ep": 8}},
        ],
    }
    return out + list(runs_of(parse_study(doc, env={})))


RUNS = _runs()


def test_the_simulated_runs_are_the_production_ones():
    names = [r.name for r in RUNS]
    assert names[:3] == ["33n-e1x8-l2x8x128-g768", "68n-e1x32-l2x8x256-g768", "100n-e1x32-l2x8x384-g768"]
    assert sum(r.rank_layout().world for r in RUNS[:3]) == (33 + 68 + 100) * 8


@pytest.mark.parametrize("run", RUNS, ids=[r.name for r in RUNS])
def test_every_rank_builds_consistent_groups_roles_bridge_and_lanes(run):
    plan = run.rank_layout()
    lay, world, gpn = run.layout, plan.world, run.layout.gpus_per_node
    (enc,) = set(encoder_shapes(plan).values())  # one encoder module (or several colocated: one grid)
    llm = language_shape(plan)
    roles = [role_of(r, enc, llm) for r in range(world)]
    _check_modules(roles, lay, plan)
    for shape in (enc, llm):
        _check_groups(shape, world, gpn)
    _check_bridge(plan, enc, llm)
    _check_lanes(plan, roles)


def _check_modules(roles, lay, plan) -> None:
    """Every rank runs the module(s) the planner's rank ranges give it (both modules when colocated)."""
    for role in roles:
        want = set()
        if plan.enc_rank_start <= role.rank < plan.enc_rank_end:
            want.add("encoder")
        if plan.llm_rank_start <= role.rank < plan.llm_rank_end:
            want.add("language")
        assert set(role.modules) == want and want, role
        assert len(want) == (2 if lay.colocated else 1)


def _check_groups(shape, world: int, gpn: int) -> None:
    enum = group_enumeration(shape, world)
    assert [name for name, _ in enum] == [g[0] for g in GROUPS]  # the creation order every rank follows
    mine = set(range(shape.offset, shape.offset + shape.size))
    for name, lists in enum:
        flat = [r for g in lists for r in g]
        # each of the module's ranks in exactly one subgroup of this kind, and no other rank
        assert sorted(flat) == sorted(mine), name
    by = dict(enum)
    for g in by["tp"]:
        assert len(g) == shape.tp and len({r // gpn for r in g}) == 1  # TP inside one node
    for g in by["dp"]:  # a DP group: one rank per replica, all at the same TP rank and stage
        assert len(g) == shape.dp and len({shape.coords(r)[:2] for r in g}) == 1
    for g in by["pp"]:  # a pipeline: the stages of one replica at one TP rank, in stage order
        assert [shape.coords(r)[1] for r in g] == list(range(shape.pp))
    for g in by["ep"]:  # experts are split over ranks of ONE stage
        assert len(g) == shape.ep and len({shape.coords(r)[1] for r in g}) == 1


def _check_bridge(plan, enc, llm) -> None:
    """Encoder replica e's leader talks to the stage-0 TP-0 leader of exactly the lanes the planner gives
    it; with fan-in, each lane's leader hears from exactly its encoder replicas."""
    if plan.layout.colocated:
        return
    for e in range(plan.layout.single.dp):
        lanes = [g.lane for g in segments_of_encoder(plan, e)]
        assert lanes == plan.lanes_of_encoder(e)
        assert enc.coords(enc.leader_of(e)) == (0, 0, e)
    for lane in range(plan.layout.llm_dp):
        assert [g.replica for g in segments_of_lane(plan, lane)] == plan.encoders_of_lane(lane)
        assert llm.coords(llm.leader_of(lane)) == (0, 0, lane)


def _check_lanes(plan, roles) -> None:
    """Each data lane is read by exactly one LLM replica (all its ranks) and by the encoder replica(s)
    serving it; the encoder replicas' segments cover each lane's samples of a microbatch exactly once."""
    lay = plan.layout
    readers: dict[int, set] = {lane: set() for lane in range(lay.llm_dp)}
    for role in roles:
        for lane in rank_lanes(plan, role, reference=False):
            readers[lane].add(("llm" if role.is_language else "enc", role.dp_rank))
    for lane, who in readers.items():
        llm_readers = {dp for kind, dp in who if kind == "llm"}
        assert llm_readers == {lane}
        if not lay.colocated:
            assert {dp for kind, dp in who if kind == "enc"} == set(plan.encoders_of_lane(lane))
    if lay.colocated:
        return
    covered = {lane: [0] * lay.mbs for lane in range(lay.llm_dp)}
    for e in range(lay.single.dp):
        for g in segments_of_encoder(plan, e):
            for i in range(g.lane_start, g.lane_start + g.n):
                covered[g.lane][i] += 1
    assert all(c == [1] * lay.mbs for c in covered.values())

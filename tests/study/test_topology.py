"""Topology planner: every rule with hand-computed numbers, and a property test that checks accepted plans
by enumerating ranks independently of the planner's own formulas."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mimo_jobs.study.topology import Layout, ModuleShape, TopologyError, check, derive_llm_dp, rank_layout


def lay(**kw) -> Layout:
    base = dict(
        nodes=1,
        gpus_per_node=8,
        encoders=(ModuleShape("vision", 1, 1, 1),),
        llm_tp=1,
        llm_pp=1,
        llm_dp=7,
        gbs=7,
        mbs=1,
    )
    base.update(kw)
    return Layout(**base)


def rules(layout: Layout) -> list[str]:
    return [v.rule for v in check(layout)]


# ---------------------------------------------------------------- the production study (docs/topology.md worked example)


@pytest.mark.parametrize(
    "nodes,enc_dp,llm_dp,enc_nodes,llm_nodes,lanes,mbatches,expert_dp",
    [
        (33, 8, 128, [0], list(range(1, 33)), 16, 6, 32),  # 768 / 128 = 6; 128 / 8 = 16; 2*128/8 = 32
        (68, 32, 256, [0, 1, 2, 3], list(range(4, 68)), 8, 3, 64),
        (100, 32, 384, [0, 1, 2, 3], list(range(4, 100)), 12, 2, 96),
    ],
)
def test_production_points(nodes, enc_dp, llm_dp, enc_nodes, llm_nodes, lanes, mbatches, expert_dp):
    p = rank_layout(
        Layout(
            nodes=nodes,
            gpus_per_node=8,
            encoders=(ModuleShape("vision", 1, 1, enc_dp),),
            llm_tp=2,
            llm_pp=1,
            llm_dp=llm_dp,
            llm_ep=8,
            num_experts=64,
            gbs=768,
            mbs=1,
        )
    )
    assert p.world == nodes * 8
    assert (p.enc_rank_start, p.enc_rank_end) == (0, enc_dp)
    assert (p.llm_rank_start, p.llm_rank_end) == (enc_dp, nodes * 8)
    assert p.encoder_nodes == enc_nodes and p.llm_nodes == llm_nodes and p.shared_nodes == []
    assert (p.fan, p.lanes_per_encoder, p.encoders_per_lane) == ("out", lanes, 1)
    assert p.num_microbatches == mbatches
    assert p.expert_dp == expert_dp
    assert p.samples_per_encoder_microbatch == lanes  # mbs=1: one sample per lane per microbatch
    assert p.lanes_of_encoder(1) == list(range(lanes, 2 * lanes))
    assert p.encoders_of_lane(lanes * 3 + 1) == [3]


# ---------------------------------------------------------------- one test per rule


def test_tiling_too_few_llm_ranks_names_the_gap_and_the_fit():
    (v,) = check(
        Layout(
            nodes=33,
            gpus_per_node=8,
            encoders=(ModuleShape("vision", 1, 1, 8),),
            llm_tp=2,
            llm_pp=1,
            llm_dp=120,
            gbs=720,
            mbs=1,
        )
    )
    assert v.rule == "tiling"
    assert "leaves 16 GPUs unused" in v.message and "33x8=264" in v.message  # 264 - 8 - 240 = 16
    assert v.fit == "llm.dp=128 fits"  # (264 - 8) / 2


def test_tiling_too_many_ranks():
    vs = check(lay(nodes=1, gpus_per_node=8, encoders=(ModuleShape("vision", 1, 1, 2),), llm_dp=8, gbs=8))
    assert [v.rule for v in vs] == ["tiling"]
    assert "needs 2 GPUs more" in vs[0].message and vs[0].fit == "llm.dp=6 fits"


def test_tiling_without_any_fitting_dp():
    # 8 - 3 = 5 LLM GPUs, not a multiple of llm.tp=2 (also a TP problem: rank 3 starts a TP2 block)
    vs = check(lay(encoders=(ModuleShape("vision", 1, 1, 3),), llm_tp=2, llm_dp=2, gbs=2))
    tiling = [v for v in vs if v.rule == "tiling"][0]
    assert "no llm.dp fits" in tiling.fit and "5 LLM GPUs" in tiling.fit


def test_tiling_encoder_alone_exceeds_world():
    vs = check(lay(nodes=1, gpus_per_node=4, encoders=(ModuleShape("vision", 1, 1, 4),), llm_dp=1, gbs=1))
    tiling = [v for v in vs if v.rule == "tiling"][0]
    assert "use at least 2 nodes" in tiling.fit  # ceil((4 + 1) / 4)


def test_tp_within_node_llm_block_starting_mid_pair():
    # encoder ranks 0-2, LLM TP2 blocks start at 3: ranks 7|8 would straddle nodes 0 and 1
    vs = check(
        Layout(
            nodes=2,
            gpus_per_node=8,
            encoders=(ModuleShape("vision", 1, 1, 3),),
            llm_tp=2,
            llm_pp=1,
            llm_dp=6,
            gbs=6,
            mbs=1,
        )
    )
    # 3 + 12 = 15 != 16 is a tiling problem as well; the TP rule is reported next to it
    tp = [v for v in vs if v.rule == "tp-within-node"]
    assert len(tp) == 1 and "llm.tp=2" in tp[0].message and tp[0].fit == "llm.tp in [1] fits"


def test_tp_larger_than_node():
    vs = check(
        Layout(
            nodes=2,
            gpus_per_node=4,
            encoders=(ModuleShape("vision", 8, 1, 1),),
            llm_tp=1,
            llm_pp=1,
            llm_dp=1,
            gbs=1,
            mbs=1,
        )
    )
    tp = [v for v in vs if v.rule == "tp-within-node"]
    assert tp and "encoder.tp=8" in tp[0].message and tp[0].fit == "encoder.tp in [1, 2, 4] fits"


def test_cp_is_rejected():
    vs = check(lay(llm_dp=3, llm_cp=2, gbs=3, encoders=(ModuleShape("vision", 1, 1, 1),), nodes=1))
    assert "cp" in [v.rule for v in vs]
    assert [v for v in vs if v.rule == "cp"][0].fit == "llm.cp=1"


def test_moe_experts_not_divisible_by_ep():
    # 64 experts, EP 6; tp*dp = 2*128 = 256: EP in divisors of 64 that divide 256 -> all of them
    vs = check(
        Layout(
            nodes=33,
            gpus_per_node=8,
            encoders=(ModuleShape("vision", 1, 1, 8),),
            llm_tp=2,
            llm_pp=1,
            llm_dp=128,
            llm_ep=6,
            num_experts=64,
            gbs=768,
            mbs=1,
        )
    )
    assert "moe-experts" in [v.rule for v in vs]
    v = [v for v in vs if v.rule == "moe-experts"][0]
    assert "num_experts=64" in v.message and v.fit == "llm.ep in [1, 2, 4, 8, 16, 32, 64] fits"


def test_moe_expert_dp_not_integral():
    # tp*dp = 1*6 = 6 is not divisible by ep*etp = 4
    vs = check(lay(encoders=(ModuleShape("vision", 1, 1, 2),), llm_dp=6, llm_ep=4, num_experts=8, gbs=12))
    assert rules(
        lay(encoders=(ModuleShape("vision", 1, 1, 2),), llm_dp=6, llm_ep=4, num_experts=8, gbs=12)
    ) == ["moe-expert-dp"]
    assert "llm.tp*llm.dp=6" in vs[0].message and "llm.ep*llm.etp=4" in vs[0].message
    assert vs[0].fit == "llm.ep in [1, 2] fits"  # divisors of 6 that divide 8 experts


def test_moe_dense_model_with_ep():
    assert rules(lay(llm_ep=2, num_experts=0)) == ["moe-dense"]


def test_gbs_not_divisible_suggests_neighbours():
    (v,) = check(lay(encoders=(ModuleShape("vision", 1, 1, 1),), llm_dp=7, gbs=30))
    assert v.rule == "gbs" and "mbs*llm.dp=1*7=7" in v.message and v.fit == "gbs=35 or gbs=28 fits"


def test_bridge_ratio():
    # world 8 = 3 encoder + 5 LLM ranks, but neither of 3 and 5 divides the other
    (v,) = check(lay(encoders=(ModuleShape("vision", 1, 1, 3),), llm_dp=5, gbs=5))
    assert v.rule == "bridge-ratio" and "encoder.dp=3 and llm.dp=5" in v.message
    assert v.fit == "encoder.dp=1 fits"  # nearest to 3 among divisors of 5 and its multiples: 1 and 5 tie


def test_bridge_samples_fan_in_needs_bigger_mbs():
    # fan-in: 4 encoder replicas feed 2 LLM lanes; 1 sample per lane per microbatch cannot split over 4
    vs = check(
        Layout(
            nodes=1,
            gpus_per_node=8,
            encoders=(ModuleShape("vision", 1, 1, 4),),
            llm_tp=2,
            llm_pp=1,
            llm_dp=2,
            gbs=8,
            mbs=1,
        )
    )
    assert [v.rule for v in vs] == ["bridge-samples"]
    assert vs[0].fit == "mbs=2 (a multiple of 2) fits"
    p = rank_layout(
        Layout(
            nodes=1,
            gpus_per_node=8,
            encoders=(ModuleShape("vision", 1, 1, 4),),
            llm_tp=2,
            llm_pp=1,
            llm_dp=2,
            gbs=8,
            mbs=2,
        )
    )
    assert (p.fan, p.lanes_per_encoder, p.encoders_per_lane) == ("in", 1, 2)
    assert p.encoders_of_lane(1) == [2, 3] and p.lanes_of_encoder(3) == [1]
    assert p.samples_per_encoder_microbatch == 1 and p.num_microbatches == 2


def test_positive():
    (v,) = check(lay(llm_dp=0))
    assert v.rule == "positive" and "llm.dp=0" in v.message


def test_every_problem_is_reported_at_once():
    got = set(
        rules(
            Layout(
                nodes=2,
                gpus_per_node=8,
                encoders=(ModuleShape("vision", 3, 1, 3),),
                llm_tp=1,
                llm_pp=1,
                llm_dp=5,
                llm_cp=2,
                llm_ep=2,
                gbs=7,
                mbs=1,
            )
        )
    )
    assert {"tiling", "tp-within-node", "cp", "moe-dense", "gbs", "bridge-ratio"} <= got


def test_plan_raises_with_all_violations():
    with pytest.raises(TopologyError) as e:
        rank_layout(lay(encoders=(ModuleShape("vision", 1, 1, 3),), llm_dp=5, gbs=7))
    assert {v.rule for v in e.value.violations} == {"gbs", "bridge-ratio"}


def test_shared_node_and_derive():
    assert derive_llm_dp(1, 4, 1, 1, 1, 1, 1) == 3
    assert derive_llm_dp(2, 8, 1, 1, 3, 2, 1) is None  # 13 GPUs left, TP2
    assert derive_llm_dp(33, 8, 1, 1, 8, 2, 1) == 128
    p = rank_layout(
        Layout(
            nodes=1,
            gpus_per_node=4,
            encoders=(ModuleShape("vision", 1, 1, 1),),
            llm_tp=1,
            llm_pp=1,
            llm_dp=3,
            gbs=6,
            mbs=1,
        )
    )
    assert p.encoder_nodes == [0] and p.llm_nodes == [0] and p.shared_nodes == [0]
    assert p.lanes_of_encoder(0) == [0, 1, 2] and p.num_microbatches == 2


# ---------------------------------------------------------------- property test


def _groups(start: int, tp: int, pp: int, dp: int) -> dict[str, list[list[int]]]:
    """TP groups and DP lanes by explicit enumeration of the documented order (tp fastest, then pp, dp)."""
    rank = start
    tp_groups, lanes = [], [[] for _ in range(dp)]
    for d in range(dp):
        for _p in range(pp):
            g = []
            for _t in range(tp):
                g.append(rank)
                lanes[d].append(rank)
                rank += 1
            tp_groups.append(g)
    return {"tp": tp_groups, "lanes": lanes}


def _independent_pp_violations(lay: Layout) -> set[str]:
    bad = set()
    if lay.single.pp != 1:
        bad.add("encoder-pp")
    if lay.llm_layers and lay.llm_layers % lay.llm_pp:
        bad.add("pp-layers")
    if lay.num_experts and lay.llm_pp > 1 and lay.llm_etp != lay.llm_tp:
        bad.add("moe-pp")
    return bad


def _independent_violations(lay: Layout) -> set[str]:
    """The rules, restated from docs/topology.md without the planner's code (TP checked by enumeration)."""
    bad = set()
    e = lay.single.tp * lay.single.pp * lay.single.dp
    llm = lay.llm_tp * lay.llm_pp * lay.llm_dp * lay.llm_cp
    if e + llm != lay.nodes * lay.gpus_per_node:
        bad.add("tiling")
    for start, tp, pp, dp in (
        (0, lay.single.tp, lay.single.pp, lay.single.dp),
        (e, lay.llm_tp, lay.llm_pp, lay.llm_dp),
    ):
        for g in _groups(start, tp, pp, dp)["tp"]:
            if len({r // lay.gpus_per_node for r in g}) != 1:
                bad.add("tp-within-node")
    if lay.llm_cp != 1:
        bad.add("cp")
    if lay.num_experts:
        if lay.num_experts % lay.llm_ep:
            bad.add("moe-experts")
        if (lay.llm_tp * lay.llm_dp) % (lay.llm_ep * lay.llm_etp):
            bad.add("moe-expert-dp")
    elif lay.llm_ep != 1 or lay.llm_etp != 1:
        bad.add("moe-dense")
    if lay.gbs % (lay.mbs * lay.llm_dp):
        bad.add("gbs")
    bad |= _independent_pp_violations(lay)
    if lay.single.dp % lay.llm_dp and lay.llm_dp % lay.single.dp:
        bad.add("bridge-ratio")
    elif (lay.mbs * lay.llm_dp) % lay.single.dp:
        bad.add("bridge-samples")
    return bad


@st.composite
def layouts(draw):
    gpn = draw(st.sampled_from([1, 2, 4, 8]))
    nodes = draw(st.integers(1, 6))
    enc_tp = draw(st.sampled_from([1, 2, 4]))
    enc_pp = draw(st.sampled_from([1, 1, 2]))
    enc_dp = draw(st.integers(1, 8))
    llm_tp = draw(st.sampled_from([1, 2, 4, 8]))
    llm_pp = draw(st.sampled_from([1, 1, 2]))
    derived = derive_llm_dp(nodes, gpn, enc_tp, enc_pp, enc_dp, llm_tp, llm_pp)
    # Half the cases take the tiling llm.dp so that plenty of inputs are accepted.
    if derived is not None and draw(st.booleans()):
        llm_dp = derived
    else:
        llm_dp = draw(st.integers(1, 48))
    num_experts = draw(st.sampled_from([0, 0, 4, 8, 64]))
    llm_ep = draw(st.sampled_from([1, 2, 4, 8])) if num_experts else draw(st.sampled_from([1, 1, 1, 2]))
    mbs = draw(st.sampled_from([1, 1, 2, 4]))
    gbs = mbs * llm_dp * draw(st.integers(1, 6)) if draw(st.booleans()) else draw(st.integers(1, 256))
    return Layout(
        nodes=nodes,
        gpus_per_node=gpn,
        encoders=(ModuleShape("vision", enc_tp, enc_pp, enc_dp),),
        llm_tp=llm_tp,
        llm_pp=llm_pp,
        llm_dp=llm_dp,
        llm_ep=llm_ep,
        num_experts=num_experts,
        llm_layers=draw(st.sampled_from([0, 2, 3, 24])),
        gbs=gbs,
        mbs=mbs,
    )


@st.composite
def friendly_layouts(draw):
    """Mostly feasible layouts (powers of two, derived llm.dp, matching gbs), so acceptance is well covered."""
    gpn = draw(st.sampled_from([2, 4, 8]))
    nodes = draw(st.integers(1, 8))
    enc_tp = draw(st.sampled_from([1, 2]))
    enc_dp = draw(st.sampled_from([1, 2, 4, 8]))
    llm_tp = draw(st.sampled_from([1, 2, 4]))
    llm_dp = derive_llm_dp(nodes, gpn, enc_tp, 1, enc_dp, llm_tp, 1) or 1
    num_experts = draw(st.sampled_from([0, 8]))
    llm_ep = draw(st.sampled_from([1, 2])) if num_experts else 1
    mbs = draw(st.sampled_from([1, 2, 4, 8]))
    gbs = mbs * llm_dp * draw(st.integers(1, 4))
    return Layout(
        nodes=nodes,
        gpus_per_node=gpn,
        encoders=(ModuleShape("vision", enc_tp, 1, enc_dp),),
        llm_tp=llm_tp,
        llm_pp=1,
        llm_dp=llm_dp,
        llm_ep=llm_ep,
        num_experts=num_experts,
        gbs=gbs,
        mbs=mbs,
    )


@settings(max_examples=500, deadline=None)
@given(st.one_of(layouts(), friendly_layouts()))
def test_property_accepted_plans_tile_the_world_and_rejections_name_a_broken_rule(lay):
    violations = check(lay)
    independent = _independent_violations(lay)
    if violations:
        named = {v.rule for v in violations}
        for v in violations:
            assert v.message and v.rule
            if v.rule == "tp-within-node":
                # the planner's rule is stricter than "no group crosses": TP must divide the node and the
                # module's first rank; hold it to exactly that
                assert any(
                    lay.gpus_per_node % tp or (start % lay.gpus_per_node) % tp
                    for tp, start in ((lay.single.tp, 0), (lay.llm_tp, lay.single.ranks))
                )
            else:
                assert v.rule in independent, (v, independent)
        assert independent <= named, (independent, named)  # nothing broken goes unreported
        return
    assert not independent, independent  # accepted => no rule is broken by the independent statement
    p = rank_layout(lay)
    world = lay.nodes * lay.gpus_per_node
    enc = _groups(0, lay.single.tp, lay.single.pp, lay.single.dp)
    llm = _groups(lay.single.tp * lay.single.pp * lay.single.dp, lay.llm_tp, lay.llm_pp, lay.llm_dp)
    ranks = [r for g in enc["tp"] + llm["tp"] for r in g]
    assert sorted(ranks) == list(range(world))  # tiles exactly, no rank twice, no stub rank
    assert list(range(p.enc_rank_start, p.enc_rank_end)) == sorted(r for g in enc["tp"] for r in g)
    assert list(range(p.llm_rank_start, p.llm_rank_end)) == sorted(r for g in llm["tp"] for r in g)
    for g in enc["tp"] + llm["tp"]:
        assert len({p.node_of_rank(r) for r in g}) == 1  # no TP group crosses a node
    assert p.encoder_nodes == sorted({r // lay.gpus_per_node for g in enc["tp"] for r in g})
    assert p.llm_nodes == sorted({r // lay.gpus_per_node for g in llm["tp"] for r in g})
    # integral microbatches and lanes; every lane served by exactly the encoders that claim it
    assert p.num_microbatches * lay.mbs * lay.llm_dp == lay.gbs
    assert p.samples_per_encoder_microbatch * lay.single.dp == lay.mbs * lay.llm_dp
    served = sorted(lane for e in range(lay.single.dp) for lane in p.lanes_of_encoder(e))
    if p.fan == "in":
        assert p.encoders_per_lane * lay.llm_dp == lay.single.dp
        assert served == sorted(lane for lane in range(lay.llm_dp) for _ in range(p.encoders_per_lane))
    else:
        assert p.lanes_per_encoder * lay.single.dp == lay.llm_dp
        assert served == list(range(lay.llm_dp))
    for lane in range(lay.llm_dp):
        assert all(lane in p.lanes_of_encoder(e) for e in p.encoders_of_lane(lane))
    if lay.num_experts:
        assert p.expert_dp * lay.llm_ep * lay.llm_etp == lay.llm_tp * lay.llm_dp

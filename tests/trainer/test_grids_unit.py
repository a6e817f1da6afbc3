"""Rank roles and coordinates (pure): they must agree with topology.py's rank layout."""

import pytest

import mimo_jobs.study.topology as topology
from mimo_jobs.trainer.parallel.bridge import segments_of_encoder, segments_of_lane
from mimo_jobs.trainer.parallel.grids import (
    ENCODER,
    LANGUAGE,
    ModuleShape,
    encoder_shapes,
    language_shape,
    module_plan,
    module_plans,
    own_module,
    role_of,
)
from mimo_jobs.trainer.step.common import check_alignment


def test_roles_follow_the_plan():
    # 8 ranks: encoder TP2 DP1 on [0, 2), LLM TP2 DP3 on [2, 8)
    plan = topology.rank_layout(
        topology.Layout(
            nodes=1,
            gpus_per_node=8,
            encoders=(topology.ModuleShape("vision", 2, 1, 1),),
            llm_tp=2,
            llm_pp=1,
            llm_dp=3,
            gbs=6,
            mbs=1,
        )
    )
    enc, llm = encoder_shapes(plan)["vision"], language_shape(plan)
    assert (enc.offset, enc.size, llm.offset, llm.size) == (0, 2, 2, 6)
    r = role_of(5, enc, llm)  # local 3 -> tp 1, dp 1
    assert r.modules == (LANGUAGE,) and (r.tp_rank, r.dp_rank, r.is_leader) == (1, 1, False)
    assert llm.leader_of(2) == 6 and enc.leader_of(0) == 0
    assert [llm.coords(x) for x in range(2, 8)] == [
        (0, 0, 0),
        (1, 0, 0),
        (0, 0, 1),
        (1, 0, 1),
        (0, 0, 2),
        (1, 0, 2),
    ]


def test_several_encoder_modules_each_have_their_ranks_roles_and_bridge_plan():
    # 7 ranks: vision TP1 DP4 on [0, 4), audio TP1 DP1 on [4, 5), LLM DP2 on [5, 7): vision fans in 2->1 per
    # lane, audio fans out 1->2
    mods = (topology.ModuleShape("vision", 1, 1, 4), topology.ModuleShape("audio", 1, 1, 1))
    plan = topology.rank_layout(
        topology.Layout(nodes=1, gpus_per_node=7, encoders=mods, llm_dp=2, gbs=4, mbs=2)
    )
    encs, llm = encoder_shapes(plan), language_shape(plan)
    assert [(n, e.offset, e.size) for n, e in encs.items()] == [("vision", 0, 4), ("audio", 4, 1)]
    assert (llm.offset, llm.size) == (5, 2)
    assert [own_module(encs, r) for r in range(7)] == ["vision"] * 4 + ["audio"] + ["vision"] * 2
    r = role_of(3, encs[own_module(encs, 3)], llm)
    assert r.modules == (ENCODER,) and r.dp_rank == 3 and r.is_leader
    audio = role_of(4, encs["audio"], llm)
    assert audio.modules == (ENCODER,) and audio.dp_rank == 0
    vision_plan, audio_plan = module_plan(plan, "vision"), module_plan(plan, "audio")
    assert module_plans(plan) == {"vision": vision_plan, "audio": audio_plan}
    assert [m.name for m in audio_plan.layout.encoders] == ["audio"]
    assert (vision_plan.fan, vision_plan.encoders_per_lane) == ("in", 2)
    assert (audio_plan.fan, audio_plan.lanes_per_encoder) == ("out", 2)
    assert audio_plan.lanes_of_encoder(0) == [0, 1] and vision_plan.lanes_of_encoder(3) == [1]
    # each module's replicas cover every lane's samples once
    for p, replicas in ((vision_plan, 4), (audio_plan, 1)):
        for lane in range(2):
            segs = segments_of_lane(p, lane)
            assert sorted((g.lane_start, g.n) for g in segs) == [(g.lane_start, g.n) for g in segs]
            assert sum(g.n for g in segs) == 2
        assert sum(g.n for e in range(replicas) for g in segments_of_encoder(p, e)) == 4


def test_a_rank_in_no_grid_is_refused():
    with pytest.raises(RuntimeError, match="rank 4 is in no grid"):
        role_of(4, ModuleShape("encoder", 0, 1, 1, 1), ModuleShape("language", 1, 1, 1, 3))


def test_alignment_invariant_is_checked():
    import torch

    from mimo_jobs.data.batch import LaneBatch, ModuleInputs

    tok = torch.tensor([[127, 127, 5, 6], [4, 5, 6, 7]])
    b = LaneBatch(
        lane=0,
        step=0,
        microbatch=0,
        sample_keys=["a", "b"],
        tokens=tok,
        labels=tok,
        loss_mask=tok,
        position_ids=tok,
        inputs={"vision": ModuleInputs(127, [2, 0]), "audio": ModuleInputs(126, [0, 0])},
    )
    check_alignment(b)
    b.inputs["vision"].counts = [1, 1]
    with pytest.raises(
        RuntimeError, match=r"module 'vision' placeholder tokens per sample \[2, 0\] != its token counts"
    ):
        check_alignment(b)


def test_colocated_modules_share_one_grid_and_each_has_a_plan_of_its_own():
    # colocated vision + audio on 2 ranks with the LLM's TP1 DP2: one encoder shape serves both names, and
    # each module's plan holds that module alone, meeting the LLM 1:1 per lane (the reference's replicas)
    mods = (topology.ModuleShape("vision", 1, 1, 2), topology.ModuleShape("audio", 1, 1, 2))
    plan = topology.rank_layout(
        topology.Layout(nodes=1, gpus_per_node=2, encoders=mods, llm_dp=2, gbs=4, mbs=2, colocated=True)
    )
    encs = encoder_shapes(plan)
    assert list(encs) == ["vision", "audio"] and encs["vision"] is encs["audio"]
    for name, p in module_plans(plan).items():
        assert [m.name for m in p.layout.encoders] == [name]
        assert [(g.replica, g.lane, g.n) for g in segments_of_encoder(p, 1)] == [(1, 1, 2)]

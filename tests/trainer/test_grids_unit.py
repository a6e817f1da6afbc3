"""Rank roles and coordinates (pure): they must agree with topology.py's rank layout."""

import pytest

import mimo_jobs.study.topology as topology
from mimo_jobs.trainer.parallel.grids import LANGUAGE, ModuleShape, module_shapes, role_of
from mimo_jobs.trainer.step import check_alignment


def test_roles_follow_the_plan():
    # 8 ranks: encoder TP2 DP1 on [0, 2), LLM TP2 DP3 on [2, 8)
    plan = topology.rank_layout(
        topology.Layout(
            nodes=1, gpus_per_node=8, enc_tp=2, enc_pp=1, enc_dp=1, llm_tp=2, llm_pp=1, llm_dp=3, gbs=6, mbs=1
        )
    )
    enc, llm = module_shapes(plan)
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


def test_a_rank_in_no_grid_is_refused():
    with pytest.raises(RuntimeError, match="rank 4 is in no grid"):
        role_of(4, ModuleShape("encoder", 0, 1, 1, 1), ModuleShape("language", 1, 1, 1, 3))


def test_alignment_invariant_is_checked():
    import torch

    from mimo_jobs.data.batch import LaneBatch

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
        image_token_counts=[2, 0],
    )
    check_alignment(b, 127)
    b.image_token_counts = [1, 1]
    with pytest.raises(
        RuntimeError, match=r"image placeholder tokens per sample \[2, 0\] != image_token_counts"
    ):
        check_alignment(b, 127)

"""The bridge's pure parts: who exchanges which samples, and the size/alignment checks on both sides."""

import pytest

import mimo_jobs.study.topology as topology
from mimo_jobs.trainer.parallel.bridge import (
    BridgeError,
    Segment,
    check_header,
    check_split,
    make_header,
    segments,
    segments_of_encoder,
    segments_of_lane,
    split_sizes,
)


def _plan(enc_dp, llm_dp, mbs, gbs):
    return topology.rank_layout(
        topology.Layout(
            nodes=1,
            gpus_per_node=enc_dp + llm_dp,
            encoders=(topology.ModuleShape("vision", 1, 1, enc_dp),),
            llm_tp=1,
            llm_pp=1,
            llm_dp=llm_dp,
            gbs=gbs,
            mbs=mbs,
        )
    )


def test_fan_out_each_encoder_serves_its_lanes_whole():
    # enc DP2 -> LLM DP4, mbs 2: an LLM microbatch step has 8 samples, 4 per encoder replica
    segs = segments(_plan(2, 4, 2, 8))
    assert segs == [
        Segment(0, 0, 0, 0, 2),
        Segment(0, 1, 2, 0, 2),
        Segment(1, 2, 0, 0, 2),
        Segment(1, 3, 2, 0, 2),
    ]


def test_fan_in_each_lane_gathers_from_its_encoders():
    # enc DP4 -> LLM DP2, mbs 4: 8 samples per step, 2 per encoder replica; lane 1 = encoders 2, 3
    p = _plan(4, 2, 4, 8)
    assert segments_of_lane(p, 1) == [Segment(2, 1, 0, 0, 2), Segment(3, 1, 0, 2, 2)]
    assert segments_of_encoder(p, 3) == [Segment(3, 1, 0, 2, 2)]


def test_one_to_one():
    assert segments(_plan(2, 2, 1, 2)) == [Segment(0, 0, 0, 0, 1), Segment(1, 1, 0, 0, 1)]


def test_split_sizes_follow_per_sample_token_counts():
    # 4 samples with 16, 0 (text-only), 9, 4 image tokens, split into two lanes of 2 samples
    assert split_sizes([16, 0, 9, 4], [(0, 2), (2, 2)]) == [16, 13]
    assert split_sizes([0, 0], [(0, 1), (1, 1)]) == [0, 0]  # an image-less microbatch


def test_mismatched_split_sizes_raise():
    check_split(29, [16, 13], "forward")
    with pytest.raises(BridgeError, match=r"split sizes \[16, 12\] \(sum 28\) do not match the 29 rows"):
        check_split(29, [16, 12], "forward on rank 0")


def test_header_mismatch_names_ranks_and_sizes():
    keys = ["a", "b"]
    sent = make_header(3, 1, 64, keys, [16, 9])
    check_header(list(sent), make_header(3, 1, 64, keys, [16, 9]), 0, 2, "forward")
    with pytest.raises(BridgeError) as e:
        check_header(sent, make_header(3, 1, 64, keys, [16, 4]), 0, 2, "forward")
    msg = str(e.value)
    assert "from rank 0 to rank 2" in msg
    assert "tokens of sample 1: sent 9, expected 4" in msg
    assert "25 rows" in msg and "20 rows" in msg


def test_header_detects_misaligned_samples():
    sent = make_header(0, 0, 64, ["lane0/0", "lane0/1"], [4, 4])
    with pytest.raises(BridgeError, match="sample-keys hash"):
        check_header(sent, make_header(0, 0, 64, ["lane1/0", "lane1/1"], [4, 4]), 1, 3, "forward")
    with pytest.raises(BridgeError, match="microbatch: sent 0, expected 1"):
        check_header(sent, make_header(0, 1, 64, ["lane0/0", "lane0/1"], [4, 4]), 1, 3, "forward")


def test_payload_sizes_are_agreed_before_any_payload_is_posted():
    """NCCL hangs on a message whose two sides give different sizes, so a header that differs from what the
    lane expects is refused on the encoder before its payload is posted (the lane sent its expectations for
    the whole iteration first)."""
    import torch

    from helpers.p2p_model import HIDDEN, lane_batch, rank_states

    net, states = rank_states(enc_dp=1, llm_dp=2, pp=1, mbs=2, microbatches=2, inflight=1)
    enc = next(st for st in states if st.role.is_encoder)
    for st in states:
        if st.role.is_language and st.role.is_first_stage:
            lane = [lane_batch(st.role.dp_rank, m, 2) for m in range(2)]
            st.bridge.language_expect(3, [(b.sample_keys, b.counts("vision")) for b in lane])
    enc.bridge.encoder_expect(3)
    batches = [lane_batch(lane, 1, 2) for lane in range(2)]
    keys = [k for b in batches for k in b.sample_keys]
    counts = [c for b in batches for c in b.counts("vision")]
    counts[0] += 1  # one more token than the lane sizes its receive for
    before = list(net.programs[enc.role.rank])
    with pytest.raises(BridgeError, match=r"forward mismatch from rank 0 to rank 1: tokens of sample 0"):
        enc.bridge.encoder_post(3, send=(1, torch.zeros(sum(counts), HIDDEN), keys, counts))
    assert net.programs[enc.role.rank] == before  # nothing posted
    counts[0] -= 1
    enc.bridge.encoder_post(3, send=(1, torch.zeros(sum(counts), HIDDEN), keys, counts))
    assert len(net.programs[enc.role.rank]) == len(before) + 1

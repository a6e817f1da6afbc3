"""Every point-to-point exchange the trainer posts is deadlock-free under NCCL's rendezvous semantics.

gloo buffers messages, so the torchrun tests cannot see an ordering that hangs NCCL. This test records the
exact op sequence of every rank from the trainer's own schedule code (step.run_encoder / step.run_stage,
the real Bridge and StageLink, stub compute) and runs it through the zero-buffer model in
tests/helpers/p2p_model.py: pipeline stages 1..4, encoder_inflight 1..4, fan-out, fan-in and 1:1 bridges,
mbs 1..2, a frozen encoder and TP 2."""

from __future__ import annotations

import pytest

from helpers.p2p_model import record, rendezvous_deadlock

# (enc_dp, llm_dp, mbs): fan-out, 1:1, fan-in (fan-in needs mbs*llm_dp divisible by enc_dp)
PLANS = [(1, 2, 1), (1, 2, 2), (2, 2, 1), (1, 1, 2), (2, 1, 2), (4, 2, 2)]


def test_model_finds_the_crossed_sends_deadlock():
    # both ranks post a send before the receive of the other's message: neither send can complete
    crossed = {
        0: [("post", 0, ((True, 1),)), ("post", 1, ((False, 1),)), ("wait", 1)],
        1: [("post", 0, ((True, 0),)), ("post", 1, ((False, 0),)), ("wait", 1)],
    }
    found = rendezvous_deadlock(crossed)
    assert found is not None and "rank 0 stuck" in found and "rank 1 stuck" in found
    # the same messages with each rank's send and receive in one batched group complete
    paired = {r: [("post", 0, ((True, 1 - r), (False, 1 - r))), ("wait", 0)] for r in (0, 1)}
    assert rendezvous_deadlock(paired) is None


def test_model_holds_a_group_until_all_of_it_completes():
    # rank 0's group [send to 1, recv from 2] blocks its next op to 1 until rank 2 has sent
    progs = {
        0: [("post", 0, ((True, 1), (False, 2))), ("post", 1, ((True, 1),)), ("wait", 0)],
        1: [("post", 0, ((False, 0),)), ("wait", 0), ("post", 1, ((False, 0),)), ("wait", 1)],
        2: [("post", 0, ((False, 1),)), ("wait", 0)],  # waits for a message rank 1 never sends
    }
    assert "rank 2 stuck" in rendezvous_deadlock(progs)


def test_model_runs_a_ranks_groups_in_posting_order_across_peers():
    # three ranks each send to the next, then receive from the previous: with one FIFO per rank pair every
    # send finds its receive first in line, yet NCCL runs each rank's groups in posting order, so every
    # send waits for a receive posted behind another send
    cycle = {
        r: [("post", 0, ((True, (r + 1) % 3),)), ("post", 1, ((False, (r - 1) % 3),)), ("wait", 1)]
        for r in range(3)
    }
    found = rendezvous_deadlock(cycle)
    assert found is not None and all(f"rank {r} stuck" in found for r in range(3))
    paired = {r: [("post", 0, ((True, (r + 1) % 3), (False, (r - 1) % 3))), ("wait", 0)] for r in range(3)}
    assert rendezvous_deadlock(paired) is None


def test_model_sync_waits_for_sends_in_flight():
    # rank 0 leaves a send in flight and synchronises the device before a collective rank 1 joins before
    # it posts the matching receive: the sync waits for a send that cannot complete
    progs = {
        0: [("post", 0, ((True, 1),)), ("sync",), ("coll", (0, 1))],
        1: [("coll", (0, 1)), ("post", 0, ((False, 0),)), ("wait", 0)],
    }
    assert "rank 0 stuck at ('sync',)" in rendezvous_deadlock(progs)
    progs[0] = [("post", 0, ((True, 1),)), ("coll", (0, 1)), ("sync",)]
    assert rendezvous_deadlock(progs) is None


def test_model_broadcast_waits_for_every_member():
    progs = {0: [("coll", (0, 1))], 1: [("post", 0, ((False, 2),)), ("wait", 0), ("coll", (0, 1))], 2: []}
    assert "rank 0 stuck" in rendezvous_deadlock(progs)


@pytest.mark.parametrize("pp", [1, 2, 3, 4])
@pytest.mark.parametrize("plan", PLANS, ids=lambda p: f"enc{p[0]}-llm{p[1]}-mbs{p[2]}")
def test_trainer_exchanges_are_deadlock_free(plan, pp):
    enc_dp, llm_dp, mbs = plan
    for inflight in (1, 2, 3, 4):
        for microbatches in (1, 2, 5):
            layout = dict(
                enc_dp=enc_dp, llm_dp=llm_dp, pp=pp, mbs=mbs, microbatches=microbatches, inflight=inflight
            )
            programs = record(**layout)
            assert any(ev[0] == "post" for prog in programs.values() for ev in prog)
            assert rendezvous_deadlock(programs) is None, (layout, rendezvous_deadlock(programs))


@pytest.mark.parametrize("pp", [1, 3])
def test_frozen_encoder_and_tp2_are_deadlock_free(pp):
    for kw in ({"frozen": True, "tp": 1}, {"frozen": False, "tp": 2}):
        layout = dict(enc_dp=1, llm_dp=2, pp=pp, mbs=2, microbatches=4, inflight=2, **kw)
        programs = record(**layout)
        assert rendezvous_deadlock(programs) is None, (layout, rendezvous_deadlock(programs))
        if kw["tp"] == 2:  # the bridge's broadcasts and the compute's own all-reduces
            colls = [ev for prog in programs.values() for ev in prog if ev[0] == "coll"]
            assert len(colls) > 2 * layout["microbatches"]

"""Every point-to-point exchange the trainer posts is deadlock-free under NCCL's rendezvous semantics.

gloo buffers messages, so the torchrun tests cannot see an ordering that hangs NCCL. This test records the
exact op sequence of every rank from the trainer's own schedule code (step/encoder_rank.run_encoder / step/llm_stage.run_stage,
the real Bridge and StageLink, stub compute) and runs it through the zero-buffer model in
tests/helpers/p2p_model.py: pipeline stages 1..4, encoder_inflight 1..4, fan-out, fan-in and 1:1 bridges,
mbs 1..2, a frozen encoder and TP 2; and a model of two encoder modules (vision, audio), each on ranks of its
own, whose two bridges post into the same first LLM stage."""

from __future__ import annotations

import pytest

from helpers.p2p_model import record, rendezvous_deadlock
from mimo_jobs.trainer.parallel import bridge as B
from mimo_jobs.trainer.parallel.bridge import Incoming

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


# Two encoder modules, each on ranks of its own (vision first, then audio, then the LLM), each with its own
# bridge into the first LLM stage: (vision dp, audio dp, llm dp, mbs). Fan-in for one and 1:1 for the other,
# fan-out and 1:1, fan-out for vision and fan-in for audio at once, 1:1 and fan-out.
MODULE_PLANS = [(2, 1, 1, 2), (1, 2, 2, 1), (1, 4, 2, 2), (2, 1, 2, 1)]


def _module_layout(plan, pp: int, **kw) -> dict:
    vision, audio, llm_dp, mbs = plan
    return dict(enc_dp=vision, audio_dp=audio, llm_dp=llm_dp, pp=pp, mbs=mbs, **kw)


def _talks_to_both_modules(programs, vision: int, audio: int, tp: int = 1) -> bool:
    """Whether the first LLM rank posts to a vision rank and to an audio rank (each its module's ranks)."""
    first_llm = tp * (vision + audio)
    peers = {peer for ev in programs[first_llm] if ev[0] == "post" for _send, peer in ev[2]}
    return any(p < tp * vision for p in peers) and any(tp * vision <= p < first_llm for p in peers)


@pytest.mark.parametrize("pp", [1, 2, 3])
@pytest.mark.parametrize("plan", MODULE_PLANS, ids=lambda p: f"vision{p[0]}-audio{p[1]}-llm{p[2]}-mbs{p[3]}")
def test_two_bridges_into_one_stage_are_deadlock_free(plan, pp):
    for inflight in (1, 2, 3):
        for microbatches in (1, 3):
            layout = _module_layout(plan, pp, microbatches=microbatches, inflight=inflight)
            programs = record(**layout)
            assert _talks_to_both_modules(programs, plan[0], plan[1])
            assert rendezvous_deadlock(programs) is None, (layout, rendezvous_deadlock(programs))


def test_two_bridges_with_tp2_and_a_frozen_model_are_deadlock_free():
    for kw in ({"frozen": True, "tp": 1}, {"frozen": False, "tp": 2}):
        layout = _module_layout((2, 1, 2, 1), 2, microbatches=3, inflight=2, **kw)
        programs = record(**layout)
        assert _talks_to_both_modules(programs, 2, 1, kw["tp"])
        assert rendezvous_deadlock(programs) is None, (layout, rendezvous_deadlock(programs))


def _wrong_bridge(monkeypatch) -> None:
    """A bridge whose two sides each post their sends in one group and their receives in another (as a
    bridge without batched groups does), and whose encoder posts a gradient's receive only when the
    backward asks for it (after the embeddings it sent since). The real one posts each exchange's sends
    and receives together, and an encoder posts a gradient's receive as soon as its exchange comes up."""
    real_post, real_collect, real_encoder_post = B.Bridge._post, B.Bridge.collect, B.Bridge.encoder_post

    def post(self, step, send, recv, parts, peers, what, own, tp_group) -> Incoming:
        if send and recv:
            real_post(self, step, send, None, parts, peers, what, own, tp_group)
            send = None
        return real_post(self, step, send, recv, parts, peers, what, own, tp_group)

    def encoder_post(self, step, send=None, recv=None):
        inc = real_encoder_post(self, step, send, None) if send is not None else None
        return ("later", step, recv) if recv is not None else inc

    def collect(self, inc):
        if isinstance(inc, tuple):
            inc = real_encoder_post(self, inc[1], None, inc[2])
        return real_collect(self, inc)

    monkeypatch.setattr(B.Bridge, "_post", post)
    monkeypatch.setattr(B.Bridge, "encoder_post", encoder_post)
    monkeypatch.setattr(B.Bridge, "collect", collect)


def test_the_model_finds_a_wrong_order_between_two_bridges_and_one_stage(monkeypatch):
    # gloo's buffering completes it (the recording runs), NCCL's rendezvous does not: the first LLM stage's
    # gradient send waits for the encoder's receive, posted behind the encoder's next embedding send, which
    # waits for the stage's receive, posted behind the gradient send. The first LLM rank is the only rank
    # both modules talk to, so a wait between two modules' bridges needs such a cycle inside one of them:
    # the two-bridge tables above show there is none
    layout = _module_layout((2, 1, 1, 2), 1, microbatches=3, inflight=2)
    assert rendezvous_deadlock(record(**layout)) is None
    _wrong_bridge(monkeypatch)
    found = rendezvous_deadlock(record(**layout))
    assert found is not None and "rank 3 stuck" in found, found

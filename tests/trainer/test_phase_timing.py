"""Per-phase times close on the device's work: every phase boundary is a PhaseTimer mark (on a GPU a CUDA
event on the current stream, read once per iteration; here counted by a hook), and every wait for a
message and every host read of one (the bridge's header check, the first synchronising use of what
arrived) lies inside a bridge_wait or pipeline_wait span, never in a span with compute."""

from __future__ import annotations

import threading

import pytest
import torch

from helpers.p2p_model import rank_states, run_threads
from mimo_jobs.trainer.step import PhaseTimer


def test_a_phase_is_two_marks_and_the_cpu_needs_no_events():
    calls = []
    tm = PhaseTimer("cpu", on_mark=lambda: calls.append(1))
    a = tm.mark()
    tm.add("enc_fwd", a)
    assert len(calls) == 2 and tm.acc["enc_fwd"] >= 0
    assert not PhaseTimer(torch.device("cpu")).gpu and PhaseTimer(torch.device("cuda", 0)).gpu


def _segments(events: list) -> list[list]:
    """The events between consecutive phase boundaries."""
    out, cur = [], []
    for ev in events:
        if ev[0] == "sync":
            out.append(cur)
            cur = []
        else:
            cur.append(ev)
    return out + [cur]


@pytest.mark.parametrize("pp", [1, 2])
def test_waits_and_first_reads_sit_in_spans_without_compute(pp, monkeypatch):
    net, states = rank_states(enc_dp=1, llm_dp=2, pp=pp, mbs=2, microbatches=4, inflight=2)
    local = threading.local()
    logs: dict[int, list] = {}
    timers: dict[int, PhaseTimer] = {}
    real_tolist = torch.Tensor.tolist

    def logged_tolist(t):
        if getattr(local, "events", None) is not None:
            local.events.append(("read",))
        return real_tolist(t)

    monkeypatch.setattr(torch.Tensor, "tolist", logged_tolist)

    def make(st):
        events = logs.setdefault(st.role.rank, [])
        local.events = events
        st.bridge.p2p.comm.events = events
        if st.link is not None:
            st.link.p2p.comm.events = events
        timers[st.role.rank] = PhaseTimer("cpu", on_mark=lambda: events.append(("sync",)))
        return timers[st.role.rank], events

    run_threads(states, 2, make)
    for rank, events in logs.items():
        segs = _segments(events)
        waited = [s for s in segs if any(e[0] in ("wait", "read") for e in s)]
        assert waited, rank
        for s in waited:
            assert not any(e[0] == "compute" for e in s), (rank, s)
        # the header check reads what a wait delivered, in the same span
        for s in segs:
            if ("read",) in s:
                assert any(e[0] == "wait" for e in s[: s.index(("read",))]), (rank, s)
        assert any(e == ("read",) for e in events) == (
            states[rank].role.is_leader and states[rank].role.is_first_stage
        )
        phases = timers[rank].acc
        assert "bridge_wait" in phases
        assert ("pipeline_wait" in phases) == (states[rank].link is not None)


def test_a_colocated_modules_backward_is_its_own_span_with_the_gradients_of_one_backward():
    """The colocated program cuts each encoder module's embeddings from the LLM's graph (step.colocated.Cut):
    the LLM's backward computes no encoder gradient (its span holds only the LLM's), the module's own
    backward does, in its own span, and every gradient is bit for bit what one backward through both gives.
    A trained module without rows times an empty backward (as on ranks of its own); a frozen one none."""
    from mimo_jobs.trainer.step.colocated import Cut

    torch.manual_seed(0)
    enc = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 4))
    words, head = torch.nn.Embedding(10, 4), torch.nn.Linear(4, 1)
    tokens = torch.tensor([[1, 9, 9, 2], [9, 3, 4, 9]])  # 9: the module's placeholder
    images = torch.randn(4, 3)
    params = {"enc": list(enc.parameters()), "llm": [*words.parameters(), *head.parameters()]}

    def loss_of(emb):
        x = words(tokens).masked_scatter((tokens == 9).unsqueeze(-1), emb)
        return head(x).pow(2).sum()

    loss_of(enc(images)).backward()
    want = [p.grad.clone() for ps in params.values() for p in ps]
    for ps in params.values():
        for p in ps:
            p.grad = None

    events: list = []
    for side, ps in params.items():
        for p in ps:
            p.register_hook(lambda g, side=side: events.append((side,)) or g)
    tm = PhaseTimer("cpu", on_mark=lambda: events.append(("sync",)))
    cut = Cut.of(enc(images), trains=True)
    loss = loss_of(cut.read)
    a = tm.mark()
    loss.backward()
    tm.add("llm_bwd", a)
    cut.backward(tm, "vision_bwd")
    got = [p.grad for ps in params.values() for p in ps]
    assert all(torch.equal(g, w) for g, w in zip(got, want))
    segs = _segments(events)  # before, llm_bwd, between, vision_bwd, after
    assert set(segs[1]) == {("llm",)} and set(segs[3]) == {("enc",)} and not segs[2] + segs[4]
    assert set(tm.acc) == {"llm_bwd", "vision_bwd"}

    with torch.no_grad():
        frozen = Cut.of(enc(images), trains=False)
    assert frozen.rows is None and frozen.read.shape == (4, 4)
    frozen.backward(tm, "audio_bwd")
    assert "audio_bwd" not in tm.acc
    empty = Cut.of(torch.zeros(0, 4), trains=True)
    empty.backward(tm, "audio_bwd")
    assert tm.acc["audio_bwd"] >= 0 and empty.rows is None

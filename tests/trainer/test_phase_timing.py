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

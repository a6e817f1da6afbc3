"""Save/restore mid-epoch: the restored provider continues with exactly the samples (keys, tokens, images)
that an uninterrupted provider yields, with num_workers 0 and 2; the state survives torch.save/torch.load."""

from __future__ import annotations

import io

import pytest
import torch

from helpers.data import run_spec
from mimo_jobs.data.energon_provider import make_energon_provider
from mimo_jobs.data.errors import DataError


def _provider(spec, lanes, need_images=True):
    return make_energon_provider(spec, spec.rank_layout(), lanes, need_images, True)


def _draw(p, lanes, n):
    out = []
    for _ in range(n):
        for lane in lanes:
            b = p.next(lane)
            imgs = [None if im is None else float(im.sum()) for im in (b.inputs["vision"].items or [])]
            out.append((lane, b.step, b.microbatch, tuple(b.sample_keys), b.tokens.tolist(), imgs))
    return out


def _roundtrip(state: dict) -> dict:
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)  # plain types only: any checkpoint format can carry it


@pytest.mark.timeout(300)
@pytest.mark.parametrize("nw,lanes,k", [(0, [0, 1], 5), (2, [1], 3)])
def test_resume_continues_with_identical_samples(synth_blend, nw, lanes, k):
    res, _ = synth_blend
    spec = run_spec(res.blend, gpus_per_node=3, enc_dp=1, llm_dp=2, mbs=2, gbs=8, num_workers=nw)
    m = 6
    full = _provider(spec, lanes)
    expect = _draw(full, lanes, k + m)
    full.close()

    first = _provider(spec, lanes)
    head = _draw(first, lanes, k)
    state = _roundtrip(first.state_dict())
    first.close()
    assert head == expect[: k * len(lanes)]

    second = _provider(spec, lanes)
    second.load_state_dict(state)
    mid = _draw(second, lanes, 2)
    state2 = _roundtrip(second.state_dict())  # chained: save again after resuming
    second.close()
    third = _provider(spec, lanes)
    third.load_state_dict(state2)
    tail = _draw(third, lanes, m - 2)
    # counted totals continue across restarts
    assert third.lane_totals(lanes[0]).microbatches == k + m
    third.close()
    assert mid + tail == expect[k * len(lanes) :]
    assert next(r[1:3] for r in mid[: len(lanes)]) == (k // 2, k % 2)  # step/microbatch numbering continues


def test_restore_into_a_used_provider_and_mismatches(synth_blend):
    res, _ = synth_blend
    spec = run_spec(res.blend, gpus_per_node=3, enc_dp=1, llm_dp=2, mbs=2, gbs=8)
    a = _provider(spec, [0], need_images=False)
    _draw(a, [0], 3)
    state = a.state_dict()
    want = _draw(a, [0], 2)
    a.load_state_dict(state)  # already iterated: rebuilt and restored
    assert _draw(a, [0], 2) == want
    a.close()

    other = run_spec(res.blend, gpus_per_node=3, enc_dp=1, llm_dp=2, mbs=2, gbs=8, num_workers=1)
    b = _provider(other, [0], need_images=False)
    with pytest.raises(DataError, match="num_workers=0, this run has 1"):
        b.load_state_dict(state)
    b.close()
    c = _provider(spec, [1], need_images=False)
    with pytest.raises(DataError, match=r"missing \[1\]"):
        c.load_state_dict(state)
    c.close()

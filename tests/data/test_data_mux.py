"""One multiplexed loader per encoder replica: it hands every lane exactly the samples (keys, order, tokens,
labels, images) that the lane's own loader gives -- the loader an LLM rank builds -- for fan-out 1, 3 and
4, with and without worker processes; its worker processes do not grow with the fan-out; its saved state
resumes exactly, also when the lanes were drawn unevenly."""

from __future__ import annotations

import io
import multiprocessing

import pytest
import torch

from helpers.data import run_spec
from mimo_jobs.data.energon_provider import EnergonProvider, LoaderConfig
from mimo_jobs.data.errors import DataError


def _spec(path, fan_out: int, num_workers: int):
    """Two encoder replicas, each serving `fan_out` LLM lanes."""
    llm_dp = 2 * fan_out
    return run_spec(
        path,
        gpus_per_node=2 + llm_dp,
        enc_dp=2,
        llm_dp=llm_dp,
        mbs=2,
        gbs=4 * llm_dp,
        num_workers=num_workers,
    )


def _record(b) -> tuple:
    imgs = tuple(
        None if im is None else (tuple(im.shape), float(im.double().sum()))
        for im in b.inputs["vision"].items or []
    )
    return (
        tuple(b.sample_keys),
        b.tokens.tolist(),
        b.labels.tolist(),
        b.loss_mask.tolist(),
        tuple(b.counts("vision")),
        imgs,
        (b.step, b.microbatch),
        tuple(e["key"] for e in b.meta["events"]),
    )


def _draw(p, lanes, n) -> dict[int, list]:
    out = {x: [] for x in lanes}
    for _ in range(n):
        for x in lanes:  # interleaved, as the trainer draws a microbatch
            out[x].append(_record(p.next(x)))
    return out


def _worker_processes() -> int:
    return len(multiprocessing.active_children())


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "fan_out,nw",
    [
        (1, 2),
        (3, 0),
        (4, 0),
        # ten worker processes (the per-lane loaders' eight and the multiplexed loader's two)
        pytest.param(4, 2, marks=pytest.mark.slow),
    ],
)
def test_mux_feeds_each_lane_what_its_own_loader_gives(synth_blend, fan_out, nw):
    res, _ = synth_blend
    spec = _spec(res.blend, fan_out, nw)
    plan = spec.rank_layout()
    lanes = plan.lanes_of_encoder(1)  # the second replica: lanes that do not start at 0
    assert lanes == list(range(fan_out, 2 * fan_out))
    cfg = LoaderConfig.from_run(spec, plan)
    n = 5

    before = _worker_processes()
    mux = EnergonProvider(cfg, lanes, need_images=True)
    assert mux.multiplex == (fan_out > 1)  # the default: one loader whenever there are several lanes
    mux.close()
    mux = EnergonProvider(cfg, lanes, need_images=True, multiplex=True)
    got = _draw(mux, lanes, n)
    assert _worker_processes() - before == nw  # one loader's workers, whatever the fan-out
    mux.close()

    want = {}
    for x in lanes:  # today's loaders: one per lane, each in a provider of its own as an LLM rank builds it
        own = EnergonProvider(cfg, [x], need_images=True, multiplex=False)
        want.update(_draw(own, [x], n))
        own.close()
    assert got == want
    assert len({tuple(rec[0] for rec in got[x]) for x in lanes}) == fan_out  # each lane its own stream


def _roundtrip(state: dict) -> dict:
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)  # plain types only: any checkpoint format can carry it


@pytest.mark.timeout(300)
@pytest.mark.parametrize("nw", [0, 2])
def test_mux_resume_exact_with_uneven_lanes(synth_blend, nw):
    res, _ = synth_blend
    spec = _spec(res.blend, 3, nw)
    plan = spec.rank_layout()
    lanes = plan.lanes_of_encoder(0)
    cfg = LoaderConfig.from_run(spec, plan)
    k, m = 3, 4

    full = EnergonProvider(cfg, lanes, need_images=True)
    expect = _draw(full, lanes, k + m)
    full.close()

    first = EnergonProvider(cfg, lanes, need_images=True)
    head = _draw(first, lanes, k)
    extra = _record(first.next(lanes[0]))  # lane 0 one microbatch ahead: the others' batches wait
    state = _roundtrip(first.state_dict())
    first.close()
    assert {x: head[x] for x in lanes} == {x: expect[x][:k] for x in lanes}
    assert extra == expect[lanes[0]][k]

    second = EnergonProvider(cfg, lanes, need_images=True)
    second.load_state_dict(state)
    tail = {x: [_record(second.next(x)) for _ in range(m - (x == lanes[0]))] for x in lanes}
    assert [second.lane_totals(x).microbatches for x in lanes] == [k + m] * len(lanes)  # totals continue
    second.close()
    for x in lanes:
        assert tail[x] == expect[x][k + (x == lanes[0]) : k + m]


def test_mux_state_needs_the_same_layout(synth_blend):
    res, _ = synth_blend
    spec = _spec(res.blend, 3, 0)
    cfg = LoaderConfig.from_run(spec, spec.rank_layout())
    mux = EnergonProvider(cfg, [0, 1, 2], need_images=False)
    _draw(mux, [0, 1, 2], 2)
    state = mux.state_dict()
    mux.close()

    per_lane = EnergonProvider(cfg, [0, 1, 2], need_images=False, multiplex=False)
    with pytest.raises(DataError, match="saved by one multiplexed loader.*one loader per lane"):
        per_lane.load_state_dict(state)
    per_lane.close()
    fewer = EnergonProvider(cfg, [0, 1], need_images=False)
    with pytest.raises(DataError, match=r"multiplexed loader for lanes \[0, 1, 2\].*reads lanes \[0, 1\]"):
        fewer.load_state_dict(state)
    fewer.close()

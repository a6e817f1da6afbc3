"""LR schedules by samples, against values computed by hand."""

import math

import pytest

from mimo_jobs.trainer.model.schedule import LRSchedule


def test_warmup_then_constant():
    s = LRSchedule("constant", 1e-3, 0.0, warmup_samples=100, decay_samples=1000)
    assert s(0) == 0.0
    assert s(50) == pytest.approx(5e-4)
    assert s(100) == 1e-3 and s(10_000) == 1e-3


def test_cosine():
    s = LRSchedule("cosine", 1.0, 0.1, warmup_samples=0, decay_samples=100)
    assert s(0) == pytest.approx(1.0)
    assert s(50) == pytest.approx(0.55)  # halfway: min + (max-min)/2
    assert s(25) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 4)))
    assert s(100) == pytest.approx(0.1) and s(500) == pytest.approx(0.1)


def test_cosine_after_warmup_starts_at_max():
    s = LRSchedule("cosine", 2.0, 0.0, warmup_samples=10, decay_samples=110)
    assert s(5) == pytest.approx(1.0)
    assert s(10) == pytest.approx(2.0)
    assert s(60) == pytest.approx(1.0)


def test_linear():
    s = LRSchedule("linear", 1.0, 0.0, warmup_samples=0, decay_samples=200)
    assert s(50) == pytest.approx(0.75)


@pytest.mark.parametrize(
    "style,q,expect",
    [
        ("minus_sqrt", 0.25, 1 - 0.5),  # 1 - sqrt(1/4)
        ("linear", 0.25, 0.75),
        ("cosine", 0.5, 0.5),
    ],
)
def test_wsd_decay_styles(style, q, expect):
    s = LRSchedule(
        "wsd", 1.0, 0.0, warmup_samples=0, decay_samples=1000, wsd_decay_samples=400, wsd_decay_style=style
    )
    assert s(599) == 1.0  # stable phase
    assert s(600 + int(q * 400)) == pytest.approx(expect)
    assert s(1000) == 0.0


def test_bad_schedule_is_refused():
    with pytest.raises(ValueError, match="unknown lr schedule"):
        LRSchedule("step", 1.0, 0.0, 0, 10)

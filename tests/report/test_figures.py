"""Report math against hand-computed figures."""

import math
from datetime import datetime

import pytest

from mimo_jobs.report import figures as f
from mimo_jobs.report.triage import EventRow, triage


def test_steady_cutoff():
    assert f.steady_cutoff(1, 20) == 3  # skip ceil(10% of 20) = 2 iterations
    assert f.steady_cutoff(1, 5) == 2  # at least the first iteration
    assert f.steady_cutoff(10, 100, 0.10) == 20  # log interval 10: skip 10 iterations = the first line
    assert f.steady_cutoff(7, 7) == 7  # a single logged iteration is kept
    assert f.steady_cutoff(1, 100, 0.25, 1) == 26


def test_stats():
    s = f.stats([400, 410, 400, 410, 1000])
    assert (s.median, s.mean, s.n) == (410, 524, 5)
    assert s.std == pytest.approx(math.sqrt(((124**2) * 2 + (114**2) * 2 + 476**2) / 4))
    assert f.stats([3.0]).std is None
    assert f.stats([1, 2, 3, 4]).median == 2.5


def test_throughput_counts_all_gpus():
    t = f.throughput(gbs=768, t_iter_ms=2000.0, seq_length=4096, gpus=264)
    assert t.samples_per_s == 384.0
    assert t.tokens_per_s == 384.0 * 4096
    assert t.tokens_per_s_per_gpu == pytest.approx(384.0 * 4096 / 264)
    assert f.throughput(8, 400.0, None, None).tokens_per_s is None


def test_mfu():
    # 1e12 FLOPs/sample at 100 samples/s on 8 GPUs of 989 TFLOP/s
    assert f.mfu(1e12, 100.0, 8, 989e12) == pytest.approx(100e12 / (8 * 989e12))


def test_efficiency_and_flags():
    assert f.efficiency(711.0, 632.0) == pytest.approx(711 / 632)
    fl = f.scaling_flags(1.125, 4, 1, 90.0, 405.0, "strong", 0.01, 8, 8)
    assert len(fl) == 1 and fl[0].startswith("unexpected speed-up (E=1.1")
    fl = f.scaling_flags(0.5, 4, 1, 500.0, 405.0, "strong", 0.3, 16, 8)
    assert any(x.startswith("slow-down") for x in fl)
    assert any("slower per iteration than 1 nodes" in x for x in fl)
    assert any("noisy" in x for x in fl)
    assert any("gbs 16 differs" in x for x in fl)
    assert f.scaling_flags(1.0, 1, 1, 405.0, 405.0, "strong", 0.0, 8, 8) == []


def test_interp_and_parity():
    curve = [(8.0, 4.9), (16.0, 4.8), (24.0, 4.7)]
    assert f.interp(curve, 12.0) == pytest.approx(4.85)
    assert f.interp(curve, 24.0) == 4.7 and f.interp(curve, 30.0) is None
    pts = f.parity_points([curve, [(16.0, 1.0), (40.0, 1.0)]], n=4)
    assert pts == [18.0, 20.0, 22.0, 24.0]
    p = f.loss_parity([(8.0, 5.4), (24.0, 5.2)], curve, [24.0])
    assert p.max_abs_diff == pytest.approx(0.5) and p.max_rel_diff == pytest.approx(0.5 / 4.7)


def ev(rank, kind, msg="", t=None, line=1):
    return EventRow(rank, None, t, kind, msg, "slurm-1.out", line)


def test_triage_root_cause_beats_earlier_timeouts():
    v = triage(
        [
            ev(
                0,
                "nccl_timeout",
                "Watchdog caught collective operation timeout",
                datetime(2026, 1, 1, 0, 0),
                1,
            ),
            ev(
                3,
                "traceback",
                "RuntimeError: [gloo/transport/tcp/pair.cc:534] Connection closed by peer",
                None,
                2,
            ),
            ev(2, "traceback", "ValueError: bad batch", datetime(2026, 1, 1, 0, 10), 3),
        ],
        world=4,
    )
    assert (v.rank, v.kind) == (2, "failed") and "ValueError: bad batch" in v.reason


def test_triage_silent_rank():
    # ranks 0, 1, 3 time out waiting; rank 2 never reports: it went silent (hung outside the collective)
    evs = [
        ev(r, "nccl_timeout", "Watchdog caught collective operation timeout", datetime(2026, 1, 1, 0, r), r)
        for r in (0, 1, 3)
    ]
    v = triage(evs, world=4)
    assert (v.rank, v.kind) == (2, "silent") and "rank(s) 2 went silent" in v.reason


def test_triage_scheduler_and_nothing():
    v = triage(
        [ev(None, "time_limit", "*** JOB 1 ON n1 CANCELLED AT 2026-01-01T00:00:00 DUE TO TIME LIMIT ***")]
    )
    assert v.kind == "scheduler" and v.reason.startswith("time limit reached")
    v = triage([], world=4, last_iteration=10, last_time=datetime(2026, 1, 1, 1, 2, 3))
    assert v.kind == "silent" and "after iteration 10" in v.reason and "2026-01-01 01:02:03" in v.reason

"""Pure logic of the planner: ring formulas, the distributed optimizer's padding, verdicts, calibration,
the bounded layout enumeration."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from mimo_jobs.plan.diagnose import diagnose
from mimo_jobs.plan.topology import check
from mimo_jobs.predict import comm
from mimo_jobs.predict.calibrate import Point, fit
from mimo_jobs.predict.hardware import GIB, UnknownGPU, get_gpu
from mimo_jobs.predict.layouts import best_layouts, candidate_layouts
from mimo_jobs.predict.memory import buffer_of, shard_of, verdict_text
from mimo_jobs.predict.run import shape_of
from mimo_jobs.predict.steptime import Efficiency

STUDIES = Path(__file__).resolve().parents[2] / "studies"


def test_ring_formulas():
    assert comm.all_reduce_s(8e9, 8, 1e9) == pytest.approx(2 * 7 / 8 * 8)
    assert comm.reduce_scatter_s(8e9, 4, 2e9) == pytest.approx(3 / 4 * 4)
    assert comm.all_to_all_s(1e9, 2, 1e9) == pytest.approx(0.5)
    assert comm.all_reduce_s(1e9, 1, 1e9) == comm.reduce_scatter_s(1e9, 1, 1e9) == 0.0


def test_verdict_text():
    assert verdict_text(int(67.7 * GIB), 80 * GIB, 3) == "fits, 12.3 GiB free"
    assert verdict_text(int(84.1 * GIB), 80 * GIB, 17) == "over by 4.1 GiB on rank 17"


def test_distributed_optimizer_padding_and_shards():
    # reverse order, starts padded to 64, end to lcm(dp, 128)
    b = buffer_of([100, 10], 3, True)
    assert b.starts == (0, 64) and b.ends == (10, 164) and b.size == 384
    assert shard_of(b, 0) == (10 + 64, 2) and shard_of(b, 1) == (36, 1) and shard_of(b, 2) == (0, 0)
    plain = buffer_of([100, 10], 3, False)
    assert plain.size == 110 and plain.starts == (0, 10)


def test_unknown_gpu():
    assert get_gpu("h100").name == "H100"
    with pytest.raises(UnknownGPU, match="known: H100, H200, B200, A100, cpu"):
        get_gpu("X100")


def test_calibration_recovers_known_scales_and_holds_out():
    pts = [
        Point(f"r{n}", n, c, o, 2.0 * c + 0.5 * o)
        for n, c, o in ((33, 1.0, 0.2), (68, 0.5, 0.3), (100, 0.35, 0.4))
    ]
    f = fit(pts)
    assert f.alpha == pytest.approx(2.0) and f.beta == pytest.approx(0.5)
    assert f.error_after == pytest.approx(0.0, abs=1e-9) and f.error_before > 0.25
    assert len(f.holdout) == 3 and f.holdout_error == pytest.approx(0.0, abs=1e-6)
    eff = f.efficiency(Efficiency(0.4, 0.4, 0.7))
    assert eff.llm == pytest.approx(0.2) and eff.network == pytest.approx(1.4)
    one = fit(pts[:1])
    assert one.alpha == one.beta and one.error_after == pytest.approx(0.0, abs=1e-9)


def test_plan_enumeration_is_bounded_for_100_nodes():
    run = diagnose(STUDIES / "scale_33n_68n_100n.yaml").runs[0]
    t0 = time.perf_counter()
    layouts = candidate_layouts(run.layout, 100)
    assert 0 < len(layouts) < 5000 and all(not check(lay) for lay in layouts)
    best, priced = best_layouts(shape_of(run.layout, run.trainer), get_gpu("H100"), 100, Efficiency(), 5)
    assert time.perf_counter() - t0 < 10
    assert priced == len(layouts) and 0 < len(best) <= 5
    times = [c.prediction.time.iteration_s for c in best]
    assert times == sorted(times) and all(c.prediction.memory.fits for c in best)


def test_strong_scaling_is_faster_with_more_nodes():
    preds = []
    from mimo_jobs.predict.estimate import predict_run

    for r in diagnose(STUDIES / "scale_33n_68n_100n.yaml").runs:
        preds.append(predict_run(r, get_gpu("H100")))
    t = [p.time.iteration_s for p in preds]
    assert t[0] > t[1] > t[2] > 0
    assert all(0 < p.mfu < 1 and p.memory.fits for p in preds)

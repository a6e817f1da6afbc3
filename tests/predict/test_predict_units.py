"""Pure logic of the planner: ring formulas, the distributed optimizer's padding, verdicts, calibration,
the bounded layout enumeration."""

from __future__ import annotations

from pathlib import Path

import pytest

from mimo_jobs.predict import comm
from mimo_jobs.predict.calibrate import Point, fit
from mimo_jobs.predict.hardware import GIB, UnknownGPU, get_gpu
from mimo_jobs.predict.layouts import TIE, best_layouts, candidate_layouts
from mimo_jobs.predict.memory import buffer_of, shard_of, verdict_text
from mimo_jobs.predict.run import shape_of
from mimo_jobs.predict.steptime import Efficiency
from mimo_jobs.study.diagnose import diagnose
from mimo_jobs.study.topology import check

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
    with pytest.raises(UnknownGPU, match="known: H100, H200, GH200, B200, GB200, A100, cpu"):
        get_gpu("X100")


def test_calibration_recovers_known_scales():
    # measured = 2 x encoder + 3 x LLM compute + 0.5 x network + the fixed part, exactly
    parts = ((1.0, 0.5, 0.2, 0.01), (0.5, 0.9, 0.3, 0.01), (0.35, 0.2, 0.4, 0.02), (0.2, 0.3, 0.1, 0.0))
    pts = [Point(f"r{i}", e, x, n, f, 2 * e + 3 * x + 0.5 * n + f) for i, (e, x, n, f) in enumerate(parts)]
    s = fit(pts)
    assert s.unknowns == 3
    assert (s.encoder, s.llm, s.network) == pytest.approx((2.0, 3.0, 0.5))
    assert all(s.apply(p) == pytest.approx(p.measured_s) for p in pts)
    eff = s.efficiency(Efficiency(0.4, 0.6, 0.7))
    assert (eff.encoder, eff.llm, eff.network) == pytest.approx((0.2, 0.2, 1.4))
    # fewer runs: fewer unknowns (never as many as runs), down to one ratio for all parts
    assert fit(pts[:3]).unknowns == 2 and fit(pts[:2]).unknowns == 1
    one = fit(pts[:1])
    assert one.encoder == one.llm == one.network and one.apply(pts[0]) == pytest.approx(pts[0].measured_s)
    # a scale the runs cannot determine (no run has network time) is not fitted
    flat = [Point("a", 1.0, 1.0, 0.0, 0.0, 2.0), Point("b", 2.0, 1.0, 0.0, 0.0, 4.0)]
    assert fit(flat).unknowns == 1 and fit(flat).network == fit(flat).llm


def test_holdout_predicts_each_fold_from_the_others():
    from mimo_jobs.predict.estimate import predict_shape
    from mimo_jobs.predict.measured import Measured, calibrate

    diag = diagnose(STUDIES / "scale_33n_68n_100n.yaml")
    h100 = get_gpu("H100")
    truth = Efficiency(0.2, 0.3, 0.35)  # what the "measured" runs achieved
    runs = [Measured(r.name, r.run_id, shape_of(r.layout, r.trainer), 0.0) for r in diag.runs]
    runs = [
        Measured(m.name, m.run_id, m.shape, predict_shape(m.shape, h100, truth).time.iteration_s)
        for m in runs
    ]
    cal = calibrate(runs, h100)
    assert cal.holdout_by == "nodes" and all(r.holdout_s is not None for r in cal.runs)
    assert cal.error_before > 0.3
    assert cal.error_after < 0.02 and cal.holdout_error_after < 0.05 < cal.holdout_error_before
    # a fold's prediction must not see its own run: with a wrong measurement only there, its hold-out
    # prediction stays where the others put it
    odd = [runs[0], runs[1], Measured(runs[2].name, runs[2].run_id, runs[2].shape, 10 * runs[2].measured_s)]
    held = calibrate(odd, h100).runs[2]
    assert held.holdout_error < -0.8 and held.holdout_s == pytest.approx(runs[2].measured_s, rel=0.05)


def test_plan_enumeration_is_bounded_for_100_nodes():
    run = diagnose(STUDIES / "scale_33n_68n_100n.yaml").runs[0]
    layouts = candidate_layouts(run.layout, 100)
    assert 0 < len(layouts) < 5000 and all(not check(lay) for lay in layouts)
    best, priced = best_layouts(shape_of(run.layout, run.trainer), get_gpu("H100"), 100, Efficiency(), 5)
    assert priced >= len(layouts) and 0 < len(best) <= 5  # and the fastest again at other microbatch sizes
    times = [c.prediction.time.iteration_s for c in best]
    # by time; a later layout is faster only within a tie, which memory headroom broke
    assert all(b >= a * (1 - TIE) for a, b in zip(times, times[1:]))
    assert all(c.prediction.memory.fits for c in best)


def test_strong_scaling_is_faster_with_more_nodes():
    preds = []
    from mimo_jobs.predict.estimate import predict_run

    for r in diagnose(STUDIES / "scale_33n_68n_100n.yaml").runs:
        preds.append(predict_run(r, get_gpu("H100")))
    t = [p.time.iteration_s for p in preds]
    assert t[0] > t[1] > t[2] > 0
    assert all(0 < p.mfu < 1 and p.memory.fits for p in preds)


def test_latency_terms_count_calls():
    assert comm.all_reduce_steps(1) == comm.ring_steps(1) == 0
    assert comm.all_reduce_steps(4) == 6 and comm.ring_steps(4) == 3
    from mimo_jobs.predict.estimate import predict_run

    runs = {r.name: r for r in diagnose(STUDIES / "cpu_local.yaml").runs}
    cpu = get_gpu("cpu")
    tp1 = predict_run(runs["1n-e1x2-l1x1x2-g6"], cpu).time
    tp2 = predict_run(runs["1n-e2x1-l2x1x1-g6"], cpu).time
    # TP2 adds 2 ring steps to each of 4 all-reduces per layer and microbatch; and more microbatches
    assert tp2.latency_s > tp1.latency_s > 0
    for t in (tp1, tp2):  # the critical path's parts add up to the iteration
        assert sum(t.parts.values()) == pytest.approx(t.iteration_s)
    slow = predict_run(runs["1n-e2x1-l2x1x1-g6"], cpu, Efficiency(latency=2.0)).time
    # twice the per-call cost: about twice the latency (the critical path may move to the other module)
    assert slow.latency_s == pytest.approx(2 * tp2.latency_s, rel=0.1) and slow.iteration_s > tp2.iteration_s


def test_calibration_keeps_latency_apart_from_bandwidth():
    # measured = 1.5 x every bandwidth part + 4 x the latency part: the design with a latency scale fits
    # exactly, the three bandwidth scales alone do not
    parts = ((1.0, 0.5, 0.2, 0.3), (0.5, 0.9, 0.3, 0.05), (0.35, 0.2, 0.4, 0.6), (0.2, 0.3, 0.1, 0.2))
    pts = [
        Point(f"r{i}", e, x, n, 0.01, 1.5 * (e + x + n) + 4 * c + 0.01, c)
        for i, (e, x, n, c) in enumerate(parts)
    ]
    s = fit(pts)
    assert s.unknowns == 3 and s.latency == pytest.approx(4.0) and s.llm == pytest.approx(1.5)
    assert all(s.apply(p) == pytest.approx(p.measured_s) for p in pts)
    assert s.efficiency(Efficiency()).latency == pytest.approx(4.0)
    two = fit(pts[:3])  # 3 runs: two unknowns, bandwidth against latency
    assert two.unknowns == 2 and two.latency == pytest.approx(4.0) and two.encoder == pytest.approx(1.5)

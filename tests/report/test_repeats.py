"""Runs that differ only in their repeat index are aggregated: mean, spread and 95% interval of the time and
throughput (recomputed here from the times the records hold), and a flag when two layouts' intervals
overlap so that the repeats cannot rank them (a real store of repeated runs)."""

from __future__ import annotations

import math

import pytest

from helpers.pair_store import build_report
from mimo_jobs.report import render

DOC = {
    "name": "reps",
    "cluster": {"executor": "slurm", "accelerator": "gpu", "gpus_per_node": 2},
    "trainer": {"model": "tiny", "train_iters": 12, "seq_length": 32},
    "matrix": {
        "defaults": {"nodes": 1, "gbs": 8, "repeats": 3},
        "points": [{"encoder": {"dp": 1}, "llm": {"dp": 1}}, {"colocated": True, "llm": {"tp": 2}}],
    },
}
HET, COLO = "1n-e1x1-l1x1x1-g8", "1n-colo-l2x1x1-g8"


def _times(het: list[float], colo: list[float]) -> dict[str, float]:
    return {
        **{f"{HET}-r{i}": t for i, t in enumerate(het)},
        **{f"{COLO}-r{i}": t for i, t in enumerate(colo)},
    }


def test_repeats_are_aggregated_with_a_t_interval(tmp_path):
    rep = build_report(tmp_path, _times([100.0, 102.0, 98.0], [200.0, 206.0, 194.0]), DOC)
    by = {r.name: r for r in rep.repeats}
    assert sorted(by) == [COLO, HET] and by[HET].runs == 3
    h = by[HET]
    assert h.t_mean_ms == pytest.approx(100.0) and h.t_spread_ms == pytest.approx(4.0)
    assert h.t_ci95_ms == pytest.approx(4.303 * 2.0 / math.sqrt(3), rel=1e-9)  # t(0.975, df 2) * sd / sqrt n
    per_gpu = [8 * 32 / (t / 1e3) / 2 for t in (100.0, 102.0, 98.0)]  # slots: no counted tokens here
    assert h.perf_mean == pytest.approx(sum(per_gpu) / 3, rel=1e-9)
    assert h.flags == [] and by[COLO].flags == []  # far apart: ranked
    for form in ("table", "md", "html"):
        assert "Repeats (runs differing only in the repeat index" in render(rep, form)


def test_overlapping_repeats_cannot_rank(tmp_path):
    rep = build_report(tmp_path, _times([100.0, 110.0, 90.0], [104.0, 96.0, 101.0]), DOC)
    by = {r.name: r for r in rep.repeats}
    assert by[HET].flags == [f"cannot rank against {COLO}: 95% intervals overlap"]
    assert by[COLO].flags == [f"cannot rank against {HET}: 95% intervals overlap"]

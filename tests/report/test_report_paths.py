"""build()'s scans take shortcuts when they can (no run filter when the report covers the whole store, a
constant window filter when every run has the same cutoff, a prefilter for the downsampled curves); each
shortcut and its general path must give the same, hand-computed figures."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from helpers.ingest_runs import make_runs, record, write_jsonl  # noqa: E402
from helpers.scaling_store import build_store  # noqa: E402
from mimo_jobs.ingest import pipeline as ingest
from mimo_jobs.report import build  # noqa: E402
from mimo_jobs.report.queries import CURVE_POINTS  # noqa: E402
from mimo_jobs.store import connection as store  # noqa: E402


def by_nodes(rep, study="scal"):
    return {r.nodes: r for r in rep.runs if r.study == study}


def test_runs_with_different_windows(tmp_path):
    # The 2-node run stopped at iteration 10: its window starts at 2 (skip ceil(10% of 10) = 1), the
    # others' at 3, so the window filter is per run.
    con, runs = build_store(tmp_path)
    con.execute("DELETE FROM iterations WHERE run_id = ? AND iteration > 10", [runs[1][0].run_id])
    rep = build(con, "scal")
    con.close()
    r1, r2 = by_nodes(rep)[1], by_nodes(rep)[2]
    assert (r1.window_from, r1.window_n, r1.t_median_ms) == (3, 18, 405.0)
    # iterations 2..10: one 500 ms warm-up iteration and eight of 200 ms
    assert (r2.window_from, r2.window_n, r2.t_median_ms) == (2, 9, 200.0)
    assert r2.t_mean_ms == pytest.approx(2100 / 9)
    assert r2.t_std_ms == pytest.approx(100.0)  # sqrt(((500 - 233.3)^2 + 8 * (200 - 233.3)^2) / 8)
    assert (r2.final_loss, r2.final_samples) == (pytest.approx(4.0), 80)  # loss 5.0 - 0.1 * 10


def test_a_second_study_in_the_store(tmp_path):
    # A store with two studies. Reporting "scal" (60 of 460 rows) filters the scans by run; reporting
    # "other" (400 of 460) or both does not, and drops the other runs' groups instead.
    con, _ = build_store(tmp_path)
    other = make_runs(tmp_path / "runs2", name="other", nodes=(1, 2), train_iters=200)
    for run, rd in other:
        recs = [record(run, "20", 0, i, 900.0 if i <= 3 else 300.0, 7.0) for i in range(1, 201)]
        write_jsonl(rd.metrics, recs)
    ingest.ingest_paths(con, [tmp_path / "runs2"])
    for study in ("scal", None):
        rep = build(con, study)
        r1 = by_nodes(rep)[1]
        assert (r1.window_from, r1.window_n, r1.t_median_ms, r1.t_mean_ms) == (3, 18, 405.0, 405.0)
        assert by_nodes(rep)[4].t_median_ms == 90.0
        assert (r1.final_loss, r1.final_samples) == (pytest.approx(3.0), 160)
        assert len(rep.curves) == (3 if study else 5)
    rep = build(con, "other")
    con.close()
    assert {r.study for r in rep.runs} == {"other"} and len(rep.curves) == 2
    for r in rep.runs:
        # window: iterations 21..200 (skip ceil(10% of 200) = 20), all 300 ms
        assert (r.window_from, r.window_n, r.t_median_ms, r.t_std_ms) == (21, 180, 300.0, 0.0)
        assert (r.final_loss, r.final_samples) == (7.0, 200 * 8)


def _store_with_spans(tmp_path: Path, spans: list[tuple[int, int]], nan_at: int):
    """One study, one run per (first, last) iteration span; loss = 1000 / iteration, except NaN at
    iteration `nan_at`; gbs 4, so consumed samples = 4 * iteration."""
    con = store.connect(tmp_path / "spans.duckdb")
    con.execute("INSERT INTO studies (name, scaling) VALUES ('sp', 'strong')")
    for k, (first, last) in enumerate(spans):
        con.execute(
            "INSERT INTO runs (run_id, study, name, nodes, gpus_per_node, world, gbs, seq_length) "
            "VALUES (?, 'sp', ?, 1, 1, 1, 4, 16)",
            [f"id{k}", f"run{k:02d}"],
        )
        con.execute(
            """INSERT INTO iterations (run_id, job_id, iteration, elapsed_ms, loss, consumed_samples, gbs)
               SELECT ?, '1', it, 10.0, CASE WHEN it = ? THEN 'nan'::DOUBLE ELSE 1000.0 / it END, 4 * it, 4
               FROM range(?, ? + 1) t(it)""",
            [f"id{k}", nan_at, first, last],
        )
    return con


def _expected_curve(first: int, last: int, nan_at: int) -> list[tuple[float, float]]:
    step = max(1, math.ceil((last - first + 1) / CURVE_POINTS))
    its = list(range(first, last + 1, step))
    if its[-1] != last:
        its.append(last)
    return [(4.0 * it, 1000.0 / it) for it in its if it != nan_at]


@pytest.mark.parametrize(
    "spans",
    [
        # three runs on the same grid: a constant condition, no join
        [(1, 1000)] * 3,
        # two runs, two (step, phase) pairs: the prefiltered scan
        [(1, 1000), (11, 1000)],
        # twelve runs with as many different steps: no prefilter, the exact per-run join only
        [(1, 400 * k + 7) for k in range(1, 13)],
    ],
)
def test_curve_downsampling(tmp_path, spans):
    nan_at = 802  # a sampled iteration (step 3 from 1): the point is left out, not moved
    con = _store_with_spans(tmp_path, spans, nan_at)
    rep = build(con, "sp")
    con.close()
    for k, (first, last) in enumerate(spans):
        want = _expected_curve(first, last, nan_at)
        assert rep.curves[f"id{k}"] == want
        assert len(want) <= CURVE_POINTS + 1


def test_a_run_with_nan_iterations_is_flagged(tmp_path):
    # the trainer's records (and Megatron's "number of nan iterations") count the iterations skipped for a
    # NaN/Inf loss or gradient: the run trained on none of them, and the report says so in its row
    con, runs = build_store(tmp_path)
    bad = runs[1][0].run_id
    con.execute("UPDATE iterations SET nan = 1 WHERE run_id = ? AND iteration BETWEEN 4 AND 6", [bad])
    rep = build(con, "scal")
    con.close()
    flags = {r.run_id: r.flags for r in rep.runs}
    assert [f for f in flags[bad] if "NaN/Inf" in f] == [
        "3 iteration(s) with a NaN/Inf loss or gradient: skipped, nothing learned from them"
    ]
    assert not any("NaN/Inf" in f for rid, fs in flags.items() if rid != bad for f in fs)

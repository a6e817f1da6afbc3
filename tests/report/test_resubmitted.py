"""A study whose every point failed once and was submitted again after a fix (a new run id under the same
name): the report, its heterogeneous-vs-colocated pairs and `compare` read the latest attempt of each point
and say which runs they left out (real stores: run dirs written by the study code, records ingested)."""

from __future__ import annotations

import pytest

from helpers.pair_store import DP2, HET, TP2, build_report, with_failed_first_attempts
from mimo_jobs.report import render
from mimo_jobs.report.versus import versus

TIMES = {HET: 100.0, TP2: 150.0, DP2: 120.0}


def test_the_report_reads_the_latest_attempt_of_each_point_and_names_the_superseded(tmp_path):
    prepare, first = with_failed_first_attempts(tmp_path)
    rep = build_report(tmp_path, TIMES, prepare=prepare, gpu="H100")
    assert sorted(r.name for r in rep.runs) == sorted(TIMES)
    assert {r.state for r in rep.runs} == {"COMPLETED"} and rep.triage == []
    assert not {r.run_id for r in rep.runs} & set(first.values())
    # one heterogeneous layout against two colocated ones: two pairs, none with a failed run
    assert sorted((p.hetero_run, p.colocated_run) for p in rep.pairs) == [(HET, DP2), (HET, TP2)]
    assert rep.unpaired == []
    # the planner's calibration (predict --db reads this report) measures the latest attempts only
    assert rep.predicted and not {p.run_id for p in rep.predicted} & set(first.values())
    (note,) = [n for n in rep.notes if n.startswith("latest attempt of each point only")]
    assert "3 earlier run(s)" in note and all(f"run {rid} (FAILED)" in note for rid in first.values())
    assert "latest attempt of each point only" in render(rep, "table")


def test_compare_matches_the_completed_attempts(tmp_path):
    prep_a, _ = with_failed_first_attempts(tmp_path / "a")
    prep_b, _ = with_failed_first_attempts(tmp_path / "b")
    base = build_report(tmp_path / "a", TIMES, prepare=prep_a)
    other = build_report(tmp_path / "b", {**TIMES, TP2: 300.0}, prepare=prep_b)
    v = versus(base, other, "A", "B")
    assert v.unmatched == []
    assert sorted(r.other_run for r in v.rows) == sorted(TIMES)
    by = {r.other_run: r for r in v.rows}
    assert by[TP2].time_ratio == pytest.approx(2.0) and by[TP2].regressions
    assert by[HET].time_ratio == pytest.approx(1.0) and not by[HET].regressions


def test_runs_of_one_name_get_a_run_id_column(tmp_path):
    """Two loose logs of one name (train.log of two directories) are two runs of study `logs` under one
    name: every rendering of the runs table says which is which."""
    import shutil

    from helpers.ingest_runs import FIXTURES
    from mimo_jobs.ingest import pipeline
    from mimo_jobs.report import build
    from mimo_jobs.report.render_text import render_md
    from mimo_jobs.store import connection as store

    for d in ("a", "b"):
        (tmp_path / d).mkdir()
        shutil.copy(FIXTURES / "megatron_upstream.log", tmp_path / d / "train.log")
    con = store.connect(tmp_path / "s.duckdb")
    try:
        pipeline.ingest_paths(con, [tmp_path / "a" / "train.log", tmp_path / "b" / "train.log"])
        rep = build(con, "logs")
    finally:
        con.close()
    assert [r.name for r in rep.runs] == ["train", "train"]
    ids = {r.run_id for r in rep.runs}
    assert len(ids) == 2
    for text in (render(rep, "table"), render_md(rep), render(rep, "html")):
        assert "run id" in text and all(i in text for i in ids)

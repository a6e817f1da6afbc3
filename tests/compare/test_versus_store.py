"""The run-by-run comparison of two stores of one study (real stores: run dirs written by the study code,
records ingested): equal times compare equal, a run made slower beyond the noise is the only regression,
a faster one is called faster, and a layout missing on one side is listed as unmatched with its side."""

from __future__ import annotations

import json

import pytest

from helpers.pair_store import DP2, HET, TP2, build_report
from mimo_jobs.report.render_versus import render
from mimo_jobs.report.versus import versus

TIMES = {HET: 100.0, TP2: 150.0, DP2: 120.0}


def test_equal_then_slower_then_faster(tmp_path):
    base = build_report(tmp_path / "a", TIMES)
    same = versus(base, build_report(tmp_path / "b", TIMES), "A", "B")
    assert [r.regressions for r in same.rows] == [[], [], []] and same.unmatched == []
    assert all(r.time_ratio == pytest.approx(1.0) for r in same.rows)

    changed = versus(base, build_report(tmp_path / "c", {**TIMES, TP2: 300.0, DP2: 60.0}), "A", "C")
    by = {r.other_run: r for r in changed.rows}
    assert [n for n, r in by.items() if r.regressions] == [TP2]
    assert by[TP2].time_ratio == pytest.approx(2.0) and by[TP2].throughput_ratio == pytest.approx(0.5)
    assert by[DP2].verdict.startswith("faster") and by[HET].verdict.startswith("within the noise")
    for form in ("table", "md", "html", "json", "csv"):
        assert TP2 in render(changed, form)


def test_a_layout_on_one_side_only_is_unmatched(tmp_path):
    base = build_report(tmp_path / "a", TIMES)
    other = build_report(tmp_path / "b", TIMES)
    other.runs = [r for r in other.runs if r.name != DP2]
    v = versus(base, other, "A", "B")
    assert len(v.rows) == 2
    assert len(v.unmatched) == 1 and v.unmatched[0].startswith(f"A: {DP2}: no run of layout 1n ")


def test_compare_command_fails_when_nothing_was_compared(tmp_path):
    import shutil

    import duckdb

    from helpers.pair_store import with_failed_first_attempts
    from helpers.submit import cli

    prepare, _ = with_failed_first_attempts(tmp_path)
    build_report(tmp_path, TIMES, prepare=prepare)
    base = tmp_path / "s.duckdb"
    ok = cli("compare", "pairs", "pairs", "--db", base, "--other-db", base, "--format", "json")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert sorted(r["other_run"] for r in json.loads(ok.stdout)["rows"]) == sorted(TIMES)

    # OTHER's latest attempts logged no iteration: every layout matches, none has a time to compare
    empty = tmp_path / "empty.duckdb"
    shutil.copy(base, empty)
    con = duckdb.connect(str(empty))
    con.execute("DELETE FROM iterations WHERE job_id = '7'")
    con.close()
    p = cli("compare", "pairs", "pairs", "--db", base, "--other-db", empty)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "nothing compared: 3 run(s) matched by layout, none with a steady-state time" in p.stderr

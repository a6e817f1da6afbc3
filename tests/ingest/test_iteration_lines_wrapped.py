"""Iteration lines as real logs show them: Megatron-LM's 2019 format (`lm loss 7.7E-02`, no colons) parses;
a line wrapped in two at a terminal's width is counted as garbled and never stored with a cut number; a line
srun --label split in two labelled lines is joined again (the rest is the next line of the same task), and
so is a line of such a log a terminal wrapped in two (the rest is the very next line, without a label); both
scanners store the same rows; and the report gives the steady-state iteration time of a log without a
global batch size, saying why its throughput is missing."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.ingest_runs import FIXTURES, require_ext
from mimo_jobs.ingest import pipeline as ingest
from mimo_jobs.ingest.readers import ScanOptions
from mimo_jobs.report import build
from mimo_jobs.store import connection as store

LINES = FIXTURES / "iterlines"


def _ingest(tmp: Path, name: str, scanner: str, path: Path | None = None):
    if scanner == "c":
        require_ext()
    tmp.mkdir(parents=True, exist_ok=True)
    con = store.connect(tmp / f"{scanner}.duckdb")
    st = ingest.ingest_paths(
        con,
        [path or LINES / name],
        log_run=ingest.LogRunInfo(name="x"),
        options=ScanOptions(scanner=scanner),
    )
    rows = con.execute(
        "SELECT iteration, elapsed_ms, loss, lr, loss_scale, gbs FROM iterations ORDER BY iteration"
    ).fetchall()
    return con, st, rows


@pytest.mark.parametrize("scanner", ["python", "c"])
def test_the_2019_format_parses(tmp_path, scanner):
    con, st, rows = _ingest(tmp_path, "megatron_2019.log", scanner)
    con.close()
    assert rows == [
        (100, 810.9, 5.023855, 1.444e-04, 8192.0, None),
        (200, 844.2, 0.1112287, 1.210e-04, 8192.0, None),
        (300, 824.7, 0.008868908, 8.518e-05, 8192.0, None),
    ]
    assert st.bad_lines == 0


@pytest.mark.parametrize("scanner", ["python", "c"])
def test_a_wrapped_line_is_garbled_never_cut(tmp_path, scanner):
    con, st, rows = _ingest(tmp_path, "wrapped.log", scanner)
    con.close()
    assert [r[0] for r in rows] == [1]  # iterations 70 and 71 were cut: not stored with 5.3 s or 1.823
    assert rows[0][1] == 25361.6
    assert st.bad_lines == 2


@pytest.mark.parametrize("scanner", ["python", "c"])
def test_a_line_srun_split_in_two_is_joined(tmp_path, scanner):
    con, st, rows = _ingest(tmp_path / "split", "srun_label_split.log", scanner)
    con.close()
    # the same rows as the log the lines came from, printed whole
    whole, _, want = _ingest(tmp_path / "whole", "", scanner, FIXTURES / "megatron_upstream.log")
    whole.close()
    assert [r[0] for r in want] == [1, 70, 71, 72, 73]
    assert rows == want  # iteration 72's parts were joined across task 0's line between them
    assert (st.iterations, st.bad_lines) == (5, 0)


@pytest.mark.parametrize("scanner", ["python", "c"])
def test_a_labelled_line_a_paste_wrapped_is_joined(tmp_path, scanner):
    con, st, rows = _ingest(tmp_path / "wrapped", "paste_wrapped.log", scanner)
    con.close()
    whole, _, want = _ingest(tmp_path / "whole", "", scanner, FIXTURES / "megatron_upstream.log")
    whole.close()
    assert rows == want  # 70 and 71 broken mid-number, 72's rest holding no trigger word: all joined
    assert (st.iterations, st.bad_lines) == (5, 0)


def test_both_scanners_store_the_same_rows(tmp_path):
    require_ext()
    for name in ("megatron_2019.log", "wrapped.log", "srun_label_split.log", "paste_wrapped.log"):
        got = {}
        for scanner in ("python", "c"):
            con, st, rows = _ingest(tmp_path / scanner / name, name, scanner)
            con.close()
            got[scanner] = (rows, st.lines, st.bad_lines, st.iterations)
        assert got["python"] == got["c"], name


def test_steady_state_time_without_a_global_batch_size(tmp_path):
    con, _, _ = _ingest(tmp_path / "p", "megatron_2019.log", "python")
    try:
        rep = build(con, "logs")
    finally:
        con.close()
    (run,) = rep.runs
    # steady state: after the first max(1, 10%) of 3 logged iterations -> iterations 200 and 300
    assert run.t_median_ms == pytest.approx((844.2 + 824.7) / 2)
    assert run.slots_per_s_per_gpu is None and run.samples_per_s is None
    assert any("no global batch size" in f for f in run.flags)

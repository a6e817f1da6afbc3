"""What runs cost: GPU-hours and node-hours from every job of a run (a failed first attempt and its retry
both count), GPU-hours per billion carried tokens, the projection to a token budget, and the CLI's token
counts (a real store; the jobs rows as submit writes them)."""

from __future__ import annotations

import pytest

from helpers.pair_store import DP2, HET, TP2, build_report
from mimo_jobs.predict.cost import parse_tokens, tokens_text
from mimo_jobs.report import render

TIMES = {HET: 100.0, TP2: 150.0, DP2: 120.0}
CARRIED = 200  # per iteration, set on every row of HET


def _jobs(con, runs):
    het = runs[HET].run_id
    con.execute(
        """INSERT INTO jobs (run_id, job_id, executor, attempt, state, start_time, end_time) VALUES
           (?, '1', 'slurm', 0, 'FAILED', TIMESTAMP '2026-01-01 00:00:00', TIMESTAMP '2026-01-01 00:30:00'),
           (?, '2', 'slurm', 1, 'COMPLETED', TIMESTAMP '2026-01-01 01:00:00', TIMESTAMP '2026-01-01 02:30:00'),
           (?, '3', 'slurm', 0, 'RUNNING', TIMESTAMP '2026-01-01 01:00:00', NULL)""",
        [het, het, runs[TP2].run_id],
    )
    con.execute("UPDATE iterations SET carried_tokens = ? WHERE run_id = ?", [CARRIED, het])


def test_gpu_hours_count_every_attempt_and_project_a_budget(tmp_path):
    rep = build_report(tmp_path, TIMES, prepare=_jobs, tokens=1e12)
    by = {r.name: r for r in rep.runs}
    h = by[HET]
    assert h.gpus == 2 and h.nodes == 1
    assert h.gpu_hours == pytest.approx(2.0 * 2)  # 0.5 h + 1.5 h, two GPUs
    assert h.node_hours == pytest.approx(2.0)
    assert h.gpu_hours_per_billion_tokens == pytest.approx(4.0 / (CARRIED * 12 / 1e9))
    # steady window: iterations 2..12 at 100 ms each, 200 carried tokens each
    rate = CARRIED / 0.1
    assert h.tokens_per_s == pytest.approx(rate)
    assert h.budget_hours == pytest.approx(1e12 / rate / 3600) and h.budget_gpu_hours == pytest.approx(
        2 * 1e12 / rate / 3600
    )
    assert by[TP2].gpu_hours == 0.0 and by[TP2].jobs_uncosted == 1  # a running job is not costed yet
    assert by[DP2].gpu_hours is None  # no job known: no cost claimed
    (study,) = rep.studies
    assert study.gpu_hours == pytest.approx(4.0)
    text = render(rep, "table")
    assert "hours to 1T tokens" in text and "pairs: 4 GPU-hours" in text


@pytest.mark.parametrize(
    "text, n", [("1T", 1e12), ("500B", 5e11), ("2.5e12", 2.5e12), ("300m", 3e8), (" 7 K ", 7e3)]
)
def test_token_counts_read_as_written(text, n):
    assert parse_tokens(text) == pytest.approx(n)
    assert parse_tokens(tokens_text(n)) == pytest.approx(n)


@pytest.mark.parametrize("text", ["", "T", "1X", "-1T", "0", "1e30", "nan", "1e-300", "0.5"])
def test_bad_token_counts_are_refused(text):
    with pytest.raises(ValueError):
        parse_tokens(text)

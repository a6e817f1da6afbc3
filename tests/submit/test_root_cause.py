"""torchrun's failure summary ("Root Cause (first observed failure)") names the failed rank and how it ended;
the launcher's own `ChildFailedError:` line names nothing. Every summary of a log's failure (the jobs
table's first error, the report's triage) says the root cause in the same words.

The fixtures are real torchrun output (torch 2.13, `--redirects 3 --tee 3` as launch.sh runs it): a worker
killed by SIGKILL, and a worker that raised while its peer was stopped with SIGTERM; and (torch 2.14, two
workers) the trainer refusing its run.yaml: rank 0 prints the trainer's error line and both exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.scaling_store import build_store
from mimo_jobs.ingest import pipeline
from mimo_jobs.ingest.events import first_error, root_cause_message
from mimo_jobs.report import build

FIXTURES = Path(__file__).parent / "fixtures"
SIGKILL_LOG = (FIXTURES / "torchrun_sigkill.log").read_text()
EXCEPTION_LOG = (FIXTURES / "torchrun_exception.log").read_text()
BAD_INPUT_LOG = (FIXTURES / "torchrun_bad_input.log").read_text()
BAD_INPUT = "mimo-jobs trainer: error: /runs/lm/1n-e1x1-l1x1x1-g6-0f3a2c1d/run.yaml: no such run.yaml"
KILLED = "rank 0 killed by SIGKILL (exit -9; often the kernel's OOM killer)"


def srun_prefixed(text: str, task: int = 0) -> str:
    return "".join(f"{task}: {line}\n" for line in text.splitlines())


def older_torch(text: str) -> str:
    """torch before 2.6 printed no signal name after the exit code."""
    return text.replace("(pid: 8793)  (SIGKILL)", "(pid: 8793)")


@pytest.mark.parametrize(
    "log",
    [SIGKILL_LOG, srun_prefixed(SIGKILL_LOG), older_torch(SIGKILL_LOG)],
    ids=["torchrun", "srun-prefixed", "older-torch"],
)
def test_first_error_names_the_killed_rank_not_the_launcher_exception(log):
    assert first_error(log) == KILLED


def test_first_error_a_rank_traceback_says_more_than_an_exit_code():
    # rank 1 raised (its teed traceback), torchrun then stopped rank 0 with SIGTERM (in "Failures:", not
    # the root cause): the exception is the cause
    assert first_error(EXCEPTION_LOG) == "ValueError: bad batch on purpose"
    # without the rank's output (no --tee) the root cause's exit code is all there is
    no_tee = "\n".join(ln for ln in EXCEPTION_LOG.splitlines() if not ln.startswith("[default1]:"))
    assert first_error(no_tee) == "rank 1 exited with code 1"


def test_root_cause_wording():
    assert root_cause_message(0, -9) == KILLED
    assert root_cause_message(3, -11) == "rank 3 killed by SIGSEGV (exit -11)"
    assert root_cause_message(2, 137) == (
        "rank 2 exited with code 137 (128+SIGKILL: killed by a signal; often the kernel's OOM killer)"
    )
    assert root_cause_message(1, 1) == "rank 1 exited with code 1"


def _triage_of(tmp_path: Path, log: str):
    """The report's triage of the 2-node run of a small study whose job 10 ends with `log`."""
    con, runs = build_store(tmp_path)
    run, rd = runs[1]
    con.execute("DELETE FROM iterations WHERE run_id = ? AND iteration > 10", [run.run_id])
    (rd.logs / "slurm-10.out").write_text(log)
    pipeline.ingest_paths(con, [rd.root])
    try:
        (t,) = build(con, "scal").triage
    finally:
        con.close()
    assert t.run_id == run.run_id
    return t


@pytest.mark.parametrize("log", [SIGKILL_LOG, srun_prefixed(SIGKILL_LOG)], ids=["torchrun", "srun-prefixed"])
def test_triage_names_the_killed_rank_like_the_jobs_table(tmp_path, log):
    t = _triage_of(tmp_path, log)
    assert (t.rank, t.kind) == (0, "failed")
    assert t.reason == first_error(log) == KILLED
    assert "ChildFailedError" not in t.reason


def test_triage_of_a_rank_exception_keeps_the_exception(tmp_path):
    t = _triage_of(tmp_path, EXCEPTION_LOG)
    assert (t.rank, t.kind) == (1, "failed") and "ValueError: bad batch on purpose" in t.reason


def test_first_error_of_a_refused_run_yaml_is_the_trainers_error_line_not_the_exit_code():
    assert first_error(BAD_INPUT_LOG) == BAD_INPUT
    assert first_error(srun_prefixed(BAD_INPUT_LOG)) == BAD_INPUT


def test_triage_of_a_refused_run_yaml_names_the_rank_and_the_trainers_error_line(tmp_path):
    t = _triage_of(tmp_path, BAD_INPUT_LOG)
    assert (t.rank, t.kind) == (0, "failed")
    assert t.reason == f"rank 0 failed: {BAD_INPUT}"

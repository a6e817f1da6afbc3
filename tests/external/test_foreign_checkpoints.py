"""Checkpoints of a program other than the packaged trainer: Megatron's tracker file in the checkpoint
directory and its "successfully saved checkpoint" log lines count, so a time limit or preemption after one is
requeued and `status` shows the iteration."""

from __future__ import annotations

from mimo_jobs.contract.rundir import RunDir
from mimo_jobs.submit import checkpoints, policy
from mimo_jobs.submit.service import has_checkpoint
from mimo_jobs.submit.status import last_checkpoint_iteration

OWN = {"trainer": {"command": "python pretrain_gpt.py"}, "point": {}}
LINE = " [rank0]:  successfully saved checkpoint from iteration     {} to /elsewhere [ t 1/1, p 1/1 ]"


def test_megatron_tracker_file_is_a_checkpoint(tmp_path):
    ck = tmp_path / "checkpoints"
    ck.mkdir()
    assert checkpoints.saved_iteration(ck) is None
    (ck / checkpoints.MEGATRON_TRACKER).write_text("")  # being written: names nothing
    assert checkpoints.saved_iteration(ck) is None
    (ck / checkpoints.MEGATRON_TRACKER).write_text("12\n")
    assert checkpoints.saved_iteration(ck) == 12
    (ck / checkpoints.MEGATRON_TRACKER).write_text("release")
    assert checkpoints.megatron_iteration(ck) == 0
    (ck / checkpoints.MEGATRON_TRACKER).write_text("30")
    assert last_checkpoint_iteration(tmp_path, OWN) == 30
    assert has_checkpoint(RunDir(tmp_path), OWN)


def test_saved_lines_name_the_newest_iteration():
    assert checkpoints.logged_iteration([LINE.format(5), "noise", LINE.format(15), LINE.format(10)]) == 15
    assert checkpoints.logged_iteration(["saved checkpoint somewhere", ""]) is None


def _store(tmp_path, lines: list[str]):
    from mimo_jobs.store.connection import connect

    con = connect(tmp_path / "s.duckdb")
    for i, text in enumerate(lines):
        con.execute(
            "INSERT INTO events (run_id, job_id, kind, message, source_file, line_no) VALUES (?, ?, ?, ?, ?, ?)",
            ["r1", "7", "checkpoint_saved", text, "log", i],
        )
    return con


def test_a_run_of_its_own_command_resumes_from_what_its_log_says_it_saved(tmp_path):
    con = _store(tmp_path, [LINE.format(20), LINE.format(40)])
    try:
        assert last_checkpoint_iteration(tmp_path, OWN, con, "r1") == 40
        # the packaged trainer's runs trust only complete checkpoints on disk (their log is not the proof)
        assert last_checkpoint_iteration(tmp_path, {"trainer": {}}, con, "r1") is None
        assert has_checkpoint(RunDir(tmp_path), OWN, con, "r1")
    finally:
        con.close()


def test_a_timeout_or_preemption_after_a_foreign_checkpoint_is_requeued(tmp_path):
    con = _store(tmp_path, [LINE.format(3)])
    try:
        have = has_checkpoint(RunDir(tmp_path), OWN, con, "r1")
    finally:
        con.close()
    for state in ("TIMEOUT", "PREEMPTED"):
        d = policy.classify(state, None, {"checkpoint_saved"}, policy.History(), 2, have)
        assert d.action == "requeue", d
    none = has_checkpoint(RunDir(tmp_path / "other"), OWN)
    assert policy.classify("TIMEOUT", None, set(), policy.History(), 2, none).action == "final"

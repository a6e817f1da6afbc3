"""The retry/requeue policy, first-error extraction and scheduler output parsing: pure functions, checked
against hand-written expectations (the sacct/squeue lines are copied in the format SLURM 22.05 prints).
The policy reads what ingest found in a job's logs as event kinds; the log lines below are the ones ingest
turns into those kinds (test_ingest_turns_the_flaky_lines_into_the_kinds_the_policy_retries)."""

from datetime import datetime

import pytest

from mimo_jobs.contract import events as K
from mimo_jobs.ingest.events import classify_line, first_error
from mimo_jobs.submit import jobs_table, policy, status
from mimo_jobs.submit.executors.slurm.executor import jobs_from_sacct, parse_squeue

NCCL = (
    "[rank3]:[E ProcessGroupNCCL.cpp:616] [Rank 3] Watchdog caught collective operation timeout: "
    "WorkNCCL(SeqNum=51, OpType=ALLREDUCE) ran for 600042 milliseconds before timing out."
)
GLOO = (
    "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Timed out waiting 120000ms for recv"
)
TRACEBACK = """\
[default1]:Traceback (most recent call last):
[default1]:  File "/x/mimo_jobs/trainer/main.py", line 10, in <module>
[default1]:    main()
[default1]:ValueError: seq_length 64 is shorter than the image tokens (96)
"""


def h(retries=0, timeouts=0):
    return policy.History(retries=retries, timeouts=timeouts)


NONE: set[str] = set()


@pytest.mark.parametrize(
    "state,kinds,hist,max_retries,ckpt,action,words",
    [
        ("COMPLETED", NONE, h(), 2, False, "done", "completed"),
        ("PREEMPTED", NONE, h(), 0, True, "requeue", "preempted"),
        ("TIMEOUT", NONE, h(), 2, False, "final", "no checkpoint"),
        ("TIMEOUT", NONE, h(), 2, True, "requeue", "resumes from checkpoint"),
        ("TIMEOUT", NONE, h(timeouts=3), 2, True, "final", "4 times"),
        ("FAILED", {K.NCCL_TIMEOUT}, h(), 2, False, "retry", "nccl_timeout"),
        ("FAILED", {K.GLOO_TIMEOUT, K.TRACEBACK}, h(), 1, False, "retry", "gloo_timeout"),
        ("FAILED", {K.NCCL_TIMEOUT}, h(retries=2), 2, False, "final", "after 2 retries"),
        ("NODE_FAIL", NONE, h(), 1, False, "retry", "node_fail"),
        ("NODE_FAIL", NONE, h(retries=1), 1, False, "final", "max_retries=1"),
        ("FAILED", {K.TRACEBACK}, h(), 5, True, "final", "deterministic"),
        ("FAILED", {K.OOM, K.TRACEBACK}, h(), 5, False, "final", "deterministic"),
        ("CANCELLED", {K.NCCL_TIMEOUT}, h(), 5, False, "final", "cancelled"),
    ],
)
def test_classify(state, kinds, hist, max_retries, ckpt, action, words):
    d = policy.classify(state, 1, kinds, hist, max_retries, ckpt)
    assert d.action == action
    assert words in d.reason


@pytest.mark.parametrize(
    "state,code,kinds,hist,ckpt,action,words",
    [
        # the trainer's requeue request (exit 75 through launch.sh/sbatch.sh) is not a deterministic failure
        ("FAILED", 75, NONE, h(), True, "requeue", "asked for a requeue"),
        # torchrun's exit 1 with a requeue event in the job's logs (marker handled by an older launch.sh)
        ("FAILED", 1, {K.REQUEUE}, h(), True, "requeue", "asked for a requeue"),
        # the limit's TERM came while the stopped trainer was exiting: still its request, not a timeout
        ("TIMEOUT", 75, NONE, h(timeouts=3), True, "requeue", "asked for a requeue"),
        ("FAILED", 75, NONE, h(), False, "final", "no complete checkpoint"),
        (
            "FAILED",
            75,
            NONE,
            policy.History(preemptions=policy.MAX_REQUEUES),
            True,
            "final",
            "not requeued again",
        ),
        ("CANCELLED", 75, {K.REQUEUE}, h(), True, "final", "cancelled"),  # a cancel is never undone
        ("FAILED", 74, NONE, h(), True, "final", "deterministic"),
    ],
)
def test_classify_requeue_request(state, code, kinds, hist, ckpt, action, words):
    d = policy.classify(state, code, kinds, hist, 0, ckpt)
    assert d.action == action
    assert words in d.reason


def test_history_counts_only_what_the_policy_did():
    def row(attempt, state, action):
        return jobs_table.JobRow(
            "r", str(attempt), "slurm", attempt, state, None, None, None, None, None, None, None, action
        )

    got = policy.history_of(
        [
            row(0, "FAILED", "retry"),
            row(1, "TIMEOUT", "requeue"),
            row(2, "PREEMPTED", "requeue"),
            row(3, "FAILED", "final"),
        ]
    )
    assert (got.retries, got.timeouts, got.preemptions) == (1, 1, 1)


def test_first_error_skips_victims_and_finds_the_cause():
    # Rank 1's real error comes after rank 0 already reported the consequence (a gloo timeout).
    log = (
        "0: [default0]:Traceback (most recent call last):\n"
        '0: [default0]:  File "a.py", line 1, in f\n'
        f"0: [default0]:{GLOO}\n" + "".join("1: " + ln + "\n" for ln in TRACEBACK.splitlines())
    )
    assert first_error(log) == "ValueError: seq_length 64 is shorter than the image tokens (96)"


def test_first_error_plain_error_line_and_nothing():
    assert first_error("starting\nerror: cannot open /data/x.tar\nbye\n") == "error: cannot open /data/x.tar"
    assert first_error("all good\niteration 1\n") is None


NODE_FAILURE = (
    "slurmstepd: error: *** JOB 7 ON node2 CANCELLED AT 2026-01-01T00:00:00 DUE TO NODE FAILURE ***"
)


def _kinds(line: str) -> set[str]:
    return {e.kind for e in classify_line(line)}


@pytest.mark.parametrize(
    "line,sig",
    [(NCCL, "nccl_timeout"), (GLOO, "gloo_timeout"), (NODE_FAILURE, "node_fail"), ("ValueError: bad", None)],
)
def test_ingest_turns_the_flaky_lines_into_the_kinds_the_policy_retries(line, sig):
    """The policy's retry decision follows from what ingest stores for a line, never from its own reading."""
    assert policy.flaky_signature(_kinds(line)) == sig


def test_parse_sacct_states_exit_codes_and_steps():
    text = (
        "12|COMPLETED|0:0|2026-11-21T19:04:39|2026-11-21T19:04:40|2026-11-21T19:05:10|node[1-2]|None|/r/a\n"
        "12.batch|COMPLETED|0:0|2026-11-21T19:04:40|2026-11-21T19:04:40|2026-11-21T19:05:10|node1|None|\n"
        "13|FAILED|3:0|2026-11-21T19:04:41|2026-11-21T19:04:42|2026-11-21T19:04:50|node3|NonZeroExitCode|/r/b\n"
        "14|CANCELLED by 0|0:15|2026-11-21T19:04:41|2026-11-21T19:04:42|2026-11-21T19:04:45|node4|None|/r/c\n"
        "15|PENDING|0:0|2026-11-21T19:04:41|Unknown|Unknown|None assigned|Resources|/r/d\n"
        "16|TIMEOUT|0:0|2026-11-21T19:04:41|2026-11-21T19:04:42|2026-11-21T19:06:00|node1|None|/r/e\n"
    )
    got = jobs_from_sacct(text)
    assert sorted(got) == ["12", "13", "14", "15", "16"]  # the .batch step is not a job
    j12, wd = got["12"]
    assert (j12.state, j12.exit_code, j12.node_list, wd) == ("COMPLETED", 0, "node[1-2]", "/r/a")
    # This test machine runs in UTC, so local and UTC agree (the parser converts local -> UTC).
    assert j12.start_time == datetime(2026, 11, 21, 19, 4, 40) and j12.end_time == datetime(
        2026, 11, 21, 19, 5, 10
    )
    assert (got["13"][0].state, got["13"][0].exit_code, got["13"][0].reason) == (
        "FAILED",
        3,
        "NonZeroExitCode",
    )
    assert (got["14"][0].state, got["14"][0].exit_code) == ("CANCELLED", 128 + 15)
    p = got["15"][0]
    assert (p.state, p.start_time, p.node_list, p.reason, p.active) == (
        "PENDING",
        None,
        None,
        "Resources",
        True,
    )
    assert got["16"][0].state == "TIMEOUT" and not got["16"][0].active


def test_parse_squeue():
    got = parse_squeue(
        "21|RUNNING|2026-11-21T19:04:41|2026-11-21T19:04:42|node[1-3]|None|/runs/s/r\n"
        "22|PENDING|2026-11-21T19:04:43|N/A||Resources|/runs/s/q\n"
    )
    assert got["21"][0].state == "RUNNING" and got["21"][1] == "/runs/s/r"
    assert got["22"][0].start_time is None and got["22"][0].reason == "Resources"


def test_last_iteration_from_metrics(tmp_path):
    m = tmp_path / "metrics.jsonl"
    m.write_text(
        '{"kind": "start", "iteration": 0}\n{"kind": "iteration", "iteration": 4, "loss": 2.5}\n'
        '{"kind": "iteration", "iteration": 5, "loss": 2.25}\n{"kind": "end", "iteration": 5}\n'
        '{"kind": "iteration", "iter'
    )  # a line still being written
    assert status.last_iteration_from_metrics(m) == (5, 2.25)
    assert status.last_iteration_from_metrics(tmp_path / "missing.jsonl") is None


def test_has_checkpoint_needs_a_complete_one(tmp_path):
    """Only a checkpoint with its manifest counts (what the trainer can resume from); a save that crashed
    (iter_N.tmp, or a `latest` naming nothing complete) is none, so a timeout is not requeued for nothing."""
    import json

    from mimo_jobs.contract.rundir import RunDir
    from mimo_jobs.submit.service import has_checkpoint

    rd = RunDir(tmp_path)
    ck = tmp_path / "checkpoints"
    (ck / "iter_0000004.tmp").mkdir(parents=True)
    (ck / "latest").write_text("iter_0000004\n")
    assert not has_checkpoint(rd, {})
    (ck / "iter_0000002").mkdir()
    (ck / "iter_0000002" / "manifest.json").write_text(
        json.dumps(
            {
                "format": 1,
                "iteration": 2,
                "consumed_samples": 12,
                "provenance": {"run_id": "r", "study": "s", "run_name": "n", "layout": {}, "world": 2},
            }
        )
    )
    assert has_checkpoint(rd, {})
    # trainer.checkpoint_dir elsewhere (relative paths are relative to the run dir, where the trainer runs)
    assert not has_checkpoint(rd, {"trainer": {"checkpoint_dir": "other"}})
    assert has_checkpoint(RunDir(tmp_path / "x"), {"trainer": {"checkpoint_dir": str(ck)}})

"""Failure signals in real log text (tests/ingest/fixtures/signals/, each file citing the public page its
lines come from): ingested for real (both scanners), each must become an event of the right kind with the
rank or node the text names, and triage must name the first failing rank with its evidence line."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest

from helpers.ingest_runs import FIXTURES, require_ext
from mimo_jobs.ingest import pipeline as ingest
from mimo_jobs.ingest.events import classify_line, first_error, named_identity
from mimo_jobs.ingest.readers import ScanOptions
from mimo_jobs.report.triage import EventRow, triage
from mimo_jobs.store import connection as store

SIGNALS = FIXTURES / "signals"
GPN = 8  # the logs' jobs ran 8 GPUs per node


def ingested(
    tmp: Path, name: str, scanner: str, nodes: int | None = None, iterations: int = 0
) -> list[EventRow]:
    if scanner == "c":
        require_ext()
    con = store.connect(tmp / f"{scanner}.duckdb")
    try:
        stats = ingest.ingest_paths(
            con,
            [SIGNALS / name],
            log_run=ingest.LogRunInfo(gpus_per_node=GPN, nodes=nodes),
            options=ScanOptions(scanner=scanner),
        )
        assert stats.problems == [] and stats.iterations == iterations
        rows = con.execute(
            "SELECT rank, node, time, kind, message, source_file, line_no FROM events ORDER BY line_no, kind"
        ).fetchall()
    finally:
        con.close()
    return [EventRow(*r) for r in rows]


def kinds(evs: list[EventRow]) -> list[tuple]:
    return [(e.line_no, e.kind, e.rank, e.node) for e in evs]


SCANNERS = ["python", "c"]


@pytest.mark.parametrize("scanner", SCANNERS)
def test_slurm_oom_kill_older_wording(tmp_path, scanner):
    evs = ingested(tmp_path, "slurm_oom_kill_step.log", scanner)
    # the cgroup OOM killer (no task named), then srun names task 4: in a log not launched by this
    # toolkit srun runs one task per GPU, so task 4 is rank 4; then SLURM cancels the step
    assert kinds(evs) == [(2, "oom", None, None), (3, "oom", 4, None), (5, "cancelled", None, None)]
    v = triage(evs, world=16)
    assert (v.kind, v.rank) == ("failed", 4) and v.evidence.endswith(":3")
    assert "Out Of Memory" in v.reason


@pytest.mark.parametrize("scanner", SCANNERS)
def test_slurm_oom_kill_newer_wording(tmp_path, scanner):
    evs = ingested(tmp_path, "slurm_oom_kill_stepid.log", scanner)
    assert kinds(evs) == [(2, "oom", None, None), (3, "oom", 0, None)]
    assert triage(evs, world=8).rank == 0


@pytest.mark.parametrize("scanner", SCANNERS)
def test_watchdog_rank_inside_the_message(tmp_path, scanner):
    evs = ingested(tmp_path, "nccl_watchdog_rank_in_message.log", scanner)
    assert [(e.kind, e.rank) for e in evs] == [("nccl_timeout", r) for r in (1, 3, 2, 6, 7)]
    v = triage(evs, world=8)  # ranks 0, 4 and 5 never reported: they went silent
    assert v.kind == "silent" and v.rank == 0 and "rank(s) 0, 4, 5 went silent" in v.reason


@pytest.mark.parametrize("scanner", SCANNERS)
def test_watchdog_with_pg_id_and_prefix(tmp_path, scanner):
    evs = ingested(tmp_path, "nccl_watchdog_pg_id.log", scanner)
    assert [(e.kind, e.rank) for e in evs if e.kind == "nccl_timeout"] == [
        ("nccl_timeout", 1),
        ("nccl_timeout", 0),
        ("nccl_timeout", 2),
    ]
    assert "rank(s) 3 went silent" in triage(evs, world=4).reason


@pytest.mark.parametrize("scanner", SCANNERS)
def test_nccl_warn_out_of_memory_and_lost_peer(tmp_path, scanner):
    evs = ingested(tmp_path, "nccl_warn_cuda_oom.log", scanner)
    assert [(e.line_no, e.kind) for e in evs] == [(2, "peer_lost"), (4, "oom")]
    v = triage(evs, world=8)  # the OOM is the cause; the closed connection is its consequence
    assert v.kind == "failed" and "Cuda failure 'out of memory'" in v.reason and v.evidence.endswith(":4")


@pytest.mark.parametrize("scanner", SCANNERS)
def test_cuda_illegal_memory_access(tmp_path, scanner):
    evs = ingested(tmp_path, "cuda_illegal_memory_access.log", scanner)
    assert [e.kind for e in evs] == ["cuda_error"]
    assert "illegal memory access" in triage(evs, world=8).reason


@pytest.mark.parametrize("scanner", SCANNERS)
def test_an_oom_kill_outranks_the_watchdog_cascade_it_causes(tmp_path, scanner):
    evs = ingested(tmp_path, "oom_kill_then_watchdogs.log", scanner)
    assert {e.rank for e in evs if e.kind == "nccl_timeout"} == {0, 1, 3}
    v = triage(evs, world=4)
    assert (v.kind, v.rank) == ("failed", 2) and "Out Of Memory" in v.reason
    assert "3 other rank(s) then timed out waiting" in v.reason and v.evidence.endswith(":6")


def test_the_fixtures_cite_their_sources():
    for p in SIGNALS.iterdir():
        assert p.read_text().startswith(("# source: https://", "# sources: https://")), p


@pytest.mark.parametrize(
    "line, kind, who",
    [
        ("srun: error: node3: task 3: Killed", "task_exit", (None, 3, None)),
        ("srun: error: node1: tasks 0-3: Killed", "task_exit", (None, 0, None)),
        ("NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.", "gpu_xid", (None,) * 3),
        ("kernel: NVRM: Xid (PCI:0000:b7:00): 48, pid=0, An uncorrectable double bit ECC error", "gpu_xid", (None,) * 3),
        ("RuntimeError: CUDA error: uncorrectable ECC error encountered", "gpu_ecc", (None,) * 3),
        ("[PG ID 0 PG GUID 0(default_pg) Rank 5] Watchdog caught collective operation timeout: x", "nccl_timeout", (5, None, None)),
        ("host:12:34 [6] misc/socket.cc:49 NCCL WARN socketProgress: Connection closed by remote peer h<1>", "peer_lost", (None, None, 6)),
    ],
)  # fmt: skip
def test_one_line_signals(line, kind, who):
    assert kind in [e.kind for e in classify_line(line)]
    assert named_identity(line) == who


@pytest.mark.parametrize("scanner", SCANNERS)
def test_torchrun_root_cause_names_rank_and_signal(tmp_path, scanner):
    (ev,) = ingested(tmp_path, "torchrun_root_cause_sigkill.log", scanner)
    assert (ev.kind, ev.rank, ev.line_no) == ("child_failed", 0, 9)
    assert ev.message == "rank 0 killed by SIGKILL (exit -9; often the kernel's OOM killer)"
    # the jobs table's first error of the same text says the same (one wording)
    assert first_error((SIGNALS / "torchrun_root_cause_sigkill.log").read_text()) == ev.message
    v = triage([ev], world=8)
    assert (v.kind, v.rank, v.reason) == ("failed", 0, ev.message)


@pytest.mark.parametrize("scanner", SCANNERS)
def test_torchrun_root_cause_keeps_the_error_file(tmp_path, scanner):
    (ev,) = ingested(tmp_path, "torchrun_error_file.log", scanner)
    assert (ev.kind, ev.rank) == ("child_failed", 0)
    assert ev.message == (
        "rank 0 exited with code 1; error file /home/kiuk/tmp/elastic/none_3_lsytqe/attempt_0/0/error.json"
    )


@pytest.mark.parametrize("scanner", SCANNERS)
def test_torchrun_other_failures_are_each_an_event_below_the_root_cause(tmp_path, scanner):
    evs = ingested(tmp_path, "torchrun_other_failures.log", scanner)
    assert [(e.kind, e.rank, e.line_no) for e in evs] == [
        ("child_failed_other", r, 3 + 7 * r) for r in (1, 2, 3)
    ]
    assert evs[0].message == "also failed: rank 1 exited with code 1"
    # with the root cause of the same summary, the root cause is the first failing rank
    root = EventRow(0, None, evs[0].time, "child_failed", "rank 0 exited with code 1", "x", 30)
    assert triage([*evs, root], world=4).rank == 0
    assert triage(evs, world=4).rank == 1  # without it, the first rank the launcher says failed


@pytest.mark.parametrize("scanner", SCANNERS)
def test_slurm_time_limit(tmp_path, scanner):
    evs = ingested(tmp_path, "slurm_time_limit.log", scanner)
    assert [(e.kind, e.time) for e in evs] == [("time_limit", datetime(2020, 7, 3, 2, 59, 56))]
    v = triage(evs, world=16)
    assert v.kind == "scheduler" and v.reason.startswith("time limit reached") and v.evidence.endswith(":4")


@pytest.mark.parametrize("scanner", SCANNERS)
def test_slurm_preemption_requeue_and_task_exit(tmp_path, scanner):
    evs = ingested(tmp_path, "slurm_preempted_requeue.log", scanner)
    assert [(e.line_no, e.kind, e.rank) for e in evs] == [
        (2, "preemption", None),
        (3, "requeue", None),
        (4, "requeue", None),
        (9, "task_exit", 2),  # "tasks 2-3": the first task named; one task per GPU outside our runs
    ]
    v = triage(evs, world=4)  # the scheduler ended the job: the exits are its consequence
    assert v.kind == "scheduler" and v.reason.startswith("preempted") and v.evidence.endswith(":2")


@pytest.mark.parametrize("scanner", SCANNERS)
def test_uncorrectable_ecc_named_by_the_watchdog(tmp_path, scanner):
    evs = ingested(tmp_path, "gpu_ecc_watchdog.log", scanner)
    assert [(e.line_no, e.kind, e.rank) for e in evs] == [(2, "gpu_ecc", None), (7, "gpu_ecc", 1)]
    v = triage(evs, world=2)  # the event that names its rank is the first failing rank's evidence
    assert (v.kind, v.rank) == ("failed", 1) and "ECC" in v.reason and v.evidence.endswith(":7")


@pytest.mark.parametrize("scanner", SCANNERS)
def test_gpu_xid(tmp_path, scanner):
    (ev,) = ingested(tmp_path, "gpu_xid.log", scanner)
    assert (ev.kind, ev.line_no) == ("gpu_xid", 2)
    assert "fallen off the bus" in triage([ev], world=8).reason


@pytest.mark.parametrize("scanner", SCANNERS)
def test_srun_task_killed(tmp_path, scanner):
    (ev,) = ingested(tmp_path, "srun_task_killed.log", scanner)
    assert (ev.kind, ev.rank) == ("task_exit", 0)  # outside our runs: task 0 is rank 0
    v = triage([ev], world=8)
    assert (v.kind, v.rank) == ("failed", 0) and v.reason.endswith("task 0: Killed")


@pytest.mark.parametrize("scanner", SCANNERS)
def test_node_failure(tmp_path, scanner):
    (ev,) = ingested(tmp_path, "node_failure.log", scanner)
    assert ev.kind == "node_fail"
    assert "Node failure on worker-1" in triage([ev], world=8).reason


@pytest.mark.parametrize("scanner", SCANNERS)
def test_srun_label_prefixes(tmp_path, scanner):
    # every line starts with srun's "N: " label: the iteration lines are still iterations, and slurmstepd's
    # line (labelled too) names no task; srun's own line does: task 2 is rank 2 (one task per GPU)
    evs = ingested(tmp_path, "srun_label_oom_kill.log", scanner, iterations=2)
    assert kinds(evs) == [(4, "oom", None, None), (5, "oom", 2, None)]
    v = triage(evs, world=8)
    assert (v.kind, v.rank) == ("failed", 2) and v.evidence.endswith(":5")


@pytest.mark.parametrize("scanner", SCANNERS)
def test_a_rank_prefixed_traceback_cut_short_keeps_its_rank(tmp_path, scanner):
    (ev,) = ingested(tmp_path, "rank_traceback_cut.log", scanner)
    assert (ev.kind, ev.rank, ev.line_no) == ("traceback", 12, 2)
    assert "no exception line" in ev.message
    v = triage([ev], world=16)
    assert (v.kind, v.rank) == ("failed", 12) and v.evidence.endswith(":2")


@pytest.mark.parametrize("scanner", SCANNERS)
def test_nccl_lines_behind_a_timestamp_name_their_device(tmp_path, scanner):
    # one node, one process per GPU: NCCL's [device] is the rank
    evs = ingested(tmp_path, "nccl_warn_timestamp_oom.log", scanner, nodes=1)
    assert kinds(evs) == [(2, "peer_lost", 1, 0), (3, "oom", 3, 0)]
    v = triage(evs, world=8)
    assert (v.kind, v.rank) == ("failed", 3) and "Cuda failure 2 'out of memory'" in v.reason


def test_our_own_exception_is_named_without_its_module_path():
    """A trainer rank's traceback ending in this package's exception reads `ArchError: ...` in status and
    report, not the path inside the package; another library's keeps its module (torch.OutOfMemoryError)."""
    trace = (
        "Traceback (most recent call last):\n"
        '  File "/opt/mimo_jobs/trainer/main.py", line 358, in main\n'
        "    return run_training(a.run_yaml, a.reference, a.metrics, a.iters, a.quiet)\n"
        "{exc}\n"
    )
    own = trace.format(exc="mimo_jobs.model.fields.ArchError: 2 encoders (vision, audio)")
    assert first_error(own) == "ArchError: 2 encoders (vision, audio)"
    torch_oom = trace.format(exc="torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")
    assert first_error(torch_oom).startswith("torch.OutOfMemoryError: CUDA out of memory")

"""Failure signals in real log text (tests/ingest/fixtures/signals/, each file citing the public page its
lines come from): ingested for real (both scanners), each must become an event of the right kind with the
rank or node the text names, and triage must name the first failing rank with its evidence line."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.ingest_runs import FIXTURES, require_ext
from mimo_jobs.ingest import pipeline as ingest
from mimo_jobs.ingest.events import classify_line, named_identity
from mimo_jobs.ingest.readers import ScanOptions
from mimo_jobs.report.triage import EventRow, triage
from mimo_jobs.store import connection as store

SIGNALS = FIXTURES / "signals"
GPN = 8  # the logs' jobs ran 8 GPUs per node


def ingested(tmp: Path, name: str, scanner: str) -> list[EventRow]:
    if scanner == "c":
        require_ext()
    con = store.connect(tmp / f"{scanner}.duckdb")
    try:
        stats = ingest.ingest_paths(
            con,
            [SIGNALS / name],
            log_run=ingest.LogRunInfo(gpus_per_node=GPN),
            options=ScanOptions(scanner=scanner),
        )
        assert stats.problems == []
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

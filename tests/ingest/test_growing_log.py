"""A log ingested while it grows, cut inside a multi-line block (a traceback, torchrun's failure summary):
the ingests together give the events one ingest of the whole file gives (both scanners)."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.ingest_runs import FIXTURES, require_ext
from mimo_jobs.ingest import pipeline as ingest
from mimo_jobs.ingest.readers import ScanOptions
from mimo_jobs.store import connection as store

SUMMARY = (FIXTURES / "signals" / "torchrun_root_cause_sigkill.log").read_text()
TRACEBACK = (
    "[rank3]: Traceback (most recent call last):\n"
    '[rank3]:   File "pretrain_gpt.py", line 264, in <module>\n'
    "[rank3]:     pretrain(\n"
    "[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
)


def events_of(tmp: Path, parts: list[str], scanner: str) -> list[tuple]:
    """Write `parts` to one log, ingesting after each; the events stored at the end."""
    if scanner == "c":
        require_ext()
    log = tmp / "slurm-7.out"
    log.write_text("")
    con = store.connect(tmp / "s.duckdb")
    try:
        for part in parts:
            with open(log, "a") as f:
                f.write(part)
            stats = ingest.ingest_paths(con, [log], options=ScanOptions(scanner=scanner))
            assert stats.problems == []
        return con.execute(
            "SELECT line_no, kind, rank, message FROM events ORDER BY line_no, kind"
        ).fetchall()
    finally:
        con.close()


def split_at(text: str, words: str) -> list[str]:
    i = text.index(words)
    return [text[:i], text[i:]]


@pytest.mark.parametrize("scanner", ["python", "c"])
@pytest.mark.parametrize(
    "text, cut",
    [
        (TRACEBACK, "[rank3]:     pretrain("),  # after a frame
        (TRACEBACK, "[rank3]: torch.OutOfMemoryError"),  # just before the exception line
        (SUMMARY, "  rank      :"),  # after the root cause's header, before its fields
        (SUMMARY, "  exitcode  :"),  # between its fields
    ],
)
def test_a_block_split_across_ingests_gives_the_whole_file_events(tmp_path, scanner, text, cut):
    for d in ("whole", "split"):
        (tmp_path / d).mkdir()
    whole = events_of(tmp_path / "whole", [text], scanner)
    split = events_of(tmp_path / "split", split_at(text, cut), scanner)
    assert split == whole
    assert any("exception line" not in e[3] and e[1] in ("traceback", "child_failed") for e in whole)


@pytest.mark.parametrize("scanner", ["python", "c"])
def test_a_block_still_open_is_reported_and_then_completed(tmp_path, scanner):
    first, rest = split_at(TRACEBACK, "[rank3]: torch.OutOfMemoryError")
    assert events_of(tmp_path, [first], scanner) == [
        (1, "traceback", 3, "traceback truncated (no exception line)")
    ]
    with open(tmp_path / "slurm-7.out", "a") as f:
        f.write(rest)
    con = store.connect(tmp_path / "s.duckdb")
    try:
        ingest.ingest_paths(con, [tmp_path / "slurm-7.out"], options=ScanOptions(scanner=scanner))
        got = con.execute("SELECT line_no, kind, rank, message FROM events ORDER BY line_no").fetchall()
    finally:
        con.close()
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    assert got == [(1, "traceback", 3, oom), (4, "oom", 3, oom)]  # the truncated event is replaced

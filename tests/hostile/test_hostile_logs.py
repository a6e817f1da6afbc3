"""Hostile log inputs to `ingest` (and what `report` writes): FIFOs, devices, files that are rewritten,
truncated or read again with --force, a file ingested again under another run name, names that are not
names, and report destinations that cannot be written. One line per case (see tests/helpers/hostile.py);
each runs the real CLI and must end cleanly, within its bound, with the right exit code."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import TESTS
from helpers.hostile import Case, read_only_mount, run_case

DB = "{tmp}/s.duckdb"
REAL_LOG = (TESTS / "ingest" / "fixtures" / "megatron_upstream.log").read_text()
SHORT = "\n".join(REAL_LOG.splitlines()[:5]) + "\n"


def cli(tmp: Path, *argv: str) -> str:
    p = subprocess.run(
        [sys.executable, "-m", "mimo_jobs.cli", *argv], cwd=tmp, capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


def ingested(*argv: str, then=None):
    """setup: `ingest <argv>` into the case's store once (then `then(tmp)`)."""

    def setup(tmp: Path) -> None:
        cli(tmp, "ingest", *[a.replace("{tmp}", str(tmp)) for a in argv], "--db", str(tmp / "s.duckdb"))
        if then is not None:
            then(tmp)

    return setup


def fifo(name: str):
    def setup(tmp: Path) -> None:
        os.mkfifo(tmp / name)

    return setup


def rewrite(name: str, text: str):
    def setup(tmp: Path) -> None:
        (tmp / name).write_text(text)

    return setup


def no_store(tmp: Path, out: str) -> None:
    assert not (tmp / "s.duckdb").exists(), "a refused ingest left a store behind"


def runs_are(*names: str):
    def check(tmp: Path, out: str) -> None:
        import duckdb

        con = duckdb.connect(str(tmp / "s.duckdb"), read_only=True)
        got = sorted(r[0] for r in con.execute("SELECT name FROM runs").fetchall())
        con.close()
        assert got == sorted(names), got

    return check


def no_escape(tmp: Path, out: str) -> None:
    assert "\x1b" not in out, "a raw escape sequence reached the terminal"


def says_ingested(files: int):
    def check(tmp: Path, out: str) -> None:
        assert f"ingested {files} file(s)" in out, out

    return check


ITER = (
    " [2024-04-06 03:02:{s:02d}] iteration {i:8d}/     100 | consumed samples: {c:12d} | elapsed time per "
    "iteration (ms): {ms} | learning rate: 1.4E-05 | global batch size:   128 | lm loss: 1.82E+00 | loss "
    "scale: 1.0 | grad norm: 1.3 | number of skipped iterations:   0 | number of nan iterations:   0 |"
)


def iters(first: int, last: int, ms: str = "5372.3") -> str:
    return "".join(ITER.format(s=i % 60, i=i, c=128 * i, ms=ms) + "\n" for i in range(first, last + 1))


def with_line(line: str) -> str:
    """Ten iteration lines with `line` after the fifth."""
    return iters(1, 5) + line + "\n" + iters(6, 10)


def stored(iterations: int, events: int | None = None):
    def check(tmp: Path, out: str) -> None:
        import duckdb

        con = duckdb.connect(str(tmp / "s.duckdb"), read_only=True)
        got = con.execute("SELECT count(*) FROM iterations").fetchone()[0]
        evs = con.execute("SELECT kind, rank, message FROM events").fetchall()
        con.close()
        assert got == iterations, (got, out)
        assert events is None or len(evs) == events, evs

    return check


TRACEBACK = 'Traceback (most recent call last):\n  File "pretrain_gpt.py", line 264, in <module>'

CASES = [
    # files that are not regular files: refused by name (or skipped inside a directory), never read
    Case("fifo", ["ingest", "{tmp}/f.log", "--db", DB], 2, ("f.log: not a log file (a FIFO)",),
         setup=fifo("f.log"), check=no_store, timeout_s=20),
    Case("dev-zero", ["ingest", "/dev/zero", "--db", DB], 2, ("not a log file (a character device)",),
         check=no_store, timeout_s=20),
    Case("dev-null", ["ingest", "/dev/null", "--db", DB], 2, ("a character device",), check=no_store),
    Case("fifo-inside-a-directory", ["ingest", "{tmp}/logs", "--db", DB], 0, ("ingested 1 file(s)",),
         files={"logs/a.log": SHORT}, setup=fifo("logs/b.log"), timeout_s=20),
    Case("symlink-to-dev-zero", ["ingest", "{tmp}/z.log", "--db", DB], 2, ("a character device",),
         setup=lambda tmp: (tmp / "z.log").symlink_to("/dev/zero"), check=no_store, timeout_s=20),
    # a file read from its start again: --force, rewritten, truncated (as a requeued job's log is)
    Case("force-twice", ["ingest", "{tmp}/t.log", "--force", "--db", DB], 0, ("ingested 1 file(s)",),
         files={"t.log": SHORT}, setup=ingested("{tmp}/t.log", then=ingested("{tmp}/t.log", "--force"))),
    Case("force-after-one", ["ingest", "{tmp}/t.log", "--force", "--db", DB], 0, ("ingested 1 file(s)",),
         files={"t.log": SHORT}, setup=ingested("{tmp}/t.log")),
    Case("rewritten-shorter", ["ingest", "{tmp}/t.log", "--db", DB], 0, ("ingested 1 file(s)",),
         files={"t.log": REAL_LOG}, setup=ingested("{tmp}/t.log", then=rewrite("t.log", SHORT))),
    Case("rewritten-longer", ["ingest", "{tmp}/t.log", "--db", DB], 0, ("ingested 1 file(s)",),
         files={"t.log": SHORT}, setup=ingested("{tmp}/t.log", then=rewrite("t.log", "x\n" + REAL_LOG))),
    Case("truncated-to-empty", ["ingest", "{tmp}/t.log", "--db", DB], 0, ("ingested 1 file(s)",),
         files={"t.log": REAL_LOG}, setup=ingested("{tmp}/t.log", then=rewrite("t.log", ""))),
    Case("unchanged-is-skipped", ["ingest", "{tmp}/t.log", "--db", DB], 0, ("(1 unchanged, skipped)",),
         files={"t.log": SHORT}, setup=ingested("{tmp}/t.log")),
    # one file, one run: another --name or --study is refused before anything is written
    Case("same-file-other-name", ["ingest", "{tmp}/t.log", "--name", "b", "--db", DB], 2,
         ("already ingested as run 'a' of study 'logs'",), files={"t.log": SHORT},
         setup=ingested("{tmp}/t.log", "--name", "a"), check=runs_are("a")),
    Case("same-named-file-other-study", ["ingest", "{tmp}/t.log", "--name", "a", "--study", "s2", "--db", DB], 2,
         ("already ingested as run 'a' of study 'logs'",), files={"t.log": SHORT},
         setup=ingested("{tmp}/t.log", "--name", "a"), check=runs_are("a")),
    # without --name a file is its own run (keyed by its path), whatever --study says: read again, no new run
    Case("unnamed-file-other-study", ["ingest", "{tmp}/t.log", "--study", "s2", "--db", DB], 0,
         ("0 new run(s)",), files={"t.log": SHORT}, setup=ingested("{tmp}/t.log"), check=runs_are("t")),
    Case("same-file-same-name", ["ingest", "{tmp}/t.log", "--name", "a", "--db", DB], 0,
         ("0 new run(s)",), files={"t.log": SHORT}, setup=ingested("{tmp}/t.log", "--name", "a"),
         check=runs_are("a")),
    # names from the command line follow the study-file rule
    Case("formula-study", ["ingest", "{tmp}/t.log", "--study", '=HYPERLINK("http://x","y")', "--db", DB], 2,
         ("--study '=HYPERLINK",), files={"t.log": SHORT}, check=no_store),
    Case("formula-name", ["ingest", "{tmp}/t.log", "--name", "+1+1", "--db", DB], 2, ("--name '+1+1'",),
         files={"t.log": SHORT}, check=no_store),
    Case("path-name", ["ingest", "{tmp}/t.log", "--name", "../../etc", "--db", DB], 2, ("--name",),
         files={"t.log": SHORT}, check=no_store),
    Case("newline-name", ["ingest", "{tmp}/t.log", "--name", "a\nb", "--db", DB], 2, ("--name",),
         files={"t.log": SHORT}, check=no_store),
    Case("escape-name", ["ingest", "{tmp}/t.log", "--name", "\x1b[31mred", "--db", DB], 2, ("--name",),
         files={"t.log": SHORT}, check=no_store),
    Case("empty-name", ["ingest", "{tmp}/t.log", "--name", "", "--db", DB], 2, ("--name ''",),
         files={"t.log": SHORT}, check=no_store),
    Case("long-name", ["ingest", "{tmp}/t.log", "--name", "a" * 65, "--db", DB], 2, ("64 characters",),
         files={"t.log": SHORT}, check=no_store),
    # contents that are not text or not lines
    Case("binary-log", ["ingest", "{tmp}/b.log", "--db", DB], 0, ("undecodable line(s)",),
         files={"b.log": bytes(range(256)) * 64 + b"\n"}),
    Case("empty-log", ["ingest", "{tmp}/e.log", "--db", DB], 0, ("ingested 1 file(s)", "0 lines")),
    Case("no-newline-at-all", ["ingest", "{tmp}/n.log", "--db", DB], 0, ("partial line",),
         files={"n.log": "x" * 2_000_000}),
    # numbers beyond the store's INTEGER columns: the field is dropped or the line tolerated, the rest stored
    Case("rank-beyond-integer", ["ingest", "{tmp}/t.log", "--db", DB], 0, ("10 iterations", "1 events"),
         files={"t.log": with_line("[Rank 99999999999] Watchdog caught collective operation timeout: x")},
         check=stored(10, 1)),
    Case("srun-task-beyond-integer", ["ingest", "{tmp}/t.log", "--db", DB], 0, ("10 iterations",),
         files={"t.log": with_line("srun: error: node1: task 99999999999: Killed")}, check=stored(10, 1)),
    Case("torchrun-rank-beyond-integer", ["ingest", "{tmp}/t.log", "--db", DB], 0, ("10 iterations",),
         files={"t.log": with_line("Root Cause (first observed failure):\n[0]:\n  rank      : 99999999999 "
                                   "(local_rank: 0)\n  exitcode  : -9 (pid: 1)\n  traceback : Signal 9 (SIGKILL)")},
         check=stored(10, 1)),
    Case("iteration-beyond-integer", ["ingest", "{tmp}/t.log", "--db", DB], 0, ("1 bad line(s)",),
         files={"t.log": with_line(ITER.format(s=0, i=3_000_000_000, c=1, ms="1.0"))}, check=stored(10)),
    # an open traceback never swallows the iteration lines after it (they start with a blank, like a frame)
    Case("traceback-then-iterations", ["ingest", "{tmp}/t.log", "--db", DB], 0, ("10 iterations", "1 events"),
         files={"t.log": TRACEBACK + "\n" + iters(1, 10)}, check=stored(10, 1)),
    # an iteration time of zero, below zero, NaN or infinite is no time: the line is garbled
    Case("zero-time", ["ingest", "{tmp}/t.log", "--db", DB], 0, ("3 bad line(s)",),
         files={"t.log": iters(1, 3, ms="0.0") + iters(4, 6)}, check=stored(3)),
    Case("negative-time", ["ingest", "{tmp}/t.log", "--db", DB], 0, ("3 bad line(s)",),
         files={"t.log": iters(1, 3, ms="-5.0") + iters(4, 6)}, check=stored(3)),
    Case("nan-time", ["ingest", "{tmp}/t.log", "--db", DB], 0, ("3 bad line(s)",),
         files={"t.log": iters(1, 3, ms="nan") + iters(4, 6)}, check=stored(3)),
    Case("infinite-time", ["ingest", "{tmp}/t.log", "--db", DB], 0, ("3 bad line(s)",),
         files={"t.log": iters(1, 3, ms="inf") + iters(4, 6)}, check=stored(3)),
    # a run named after its log file: the name is shown, its escape sequence and markup are not obeyed
    Case("status-escape-in-file-name", ["status", "--db", DB], 0, ("[b]\\x1b[31mred",),
         files={"[b]\x1b[31mred.log": SHORT}, setup=ingested("{tmp}/[b]\x1b[31mred.log"), check=no_escape),
    # report destinations that cannot be written
    Case("report-out-under-a-file", ["report", "-f", "csv", "--out", "{tmp}/f.txt/sub", "--db", DB], 1,
         ("--out", "cannot write the report there"), files={"t.log": SHORT, "f.txt": "x"},
         setup=ingested("{tmp}/t.log")),
    Case("report-out-is-a-file", ["report", "-f", "csv", "--out", "{tmp}/f.txt", "--db", DB], 2,
         ("exists and is not a directory",), files={"t.log": SHORT, "f.txt": "x"},
         setup=ingested("{tmp}/t.log")),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_log(case: Case, tmp_path: Path) -> None:
    if case.id == "empty-log":
        (tmp_path / "e.log").write_bytes(b"")
    run_case(case, tmp_path)


def test_report_into_a_read_only_directory_is_named_so(tmp_path: Path) -> None:
    (tmp_path / "t.log").write_text(SHORT)
    ingested("{tmp}/t.log")(tmp_path)
    with read_only_mount(tmp_path) as mnt:
        case = Case(
            "ro-out", ["report", "-f", "md", "--out", str(mnt), "--db", DB], 1, ("Read-only file system",)
        )
        run_case(case, tmp_path)

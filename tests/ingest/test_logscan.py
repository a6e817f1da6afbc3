"""The compiled scanner (mimo_jobs.ingest._logscan) against the pure-Python scan on nasty generated logs: the same
rows, events and counts, whatever the read block size (lines across block ends, a row batch per block,
restarts across batches), with the AVX2 filter and with the portable scalar one."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from helpers.ingest_runs import require_ext  # noqa: E402
from mimo_jobs.ingest import pipeline as ingest
from mimo_jobs.ingest.lines import LineHandler
from mimo_jobs.ingest.readers import ScanOptions
from mimo_jobs.store import connection as store

KEYS = [
    ("consumed samples", lambda r, i: f"{i * 128:12d}"),
    ("elapsed time per iteration (ms)", lambda r, i: f"{r.uniform(100, 9000):.1f}"),
    ("throughput per GPU (TFLOP/s/GPU)", lambda r, i: f"{r.uniform(1, 500):.1f}"),
    ("learning rate", lambda r, i: f"{r.uniform(1e-7, 1e-3):.6E}"),
    ("global batch size", lambda r, i: "  128"),
    ("lm loss", lambda r, i: f"{r.uniform(1, 11):.6E}"),
    ("load_balancing_loss", lambda r, i: f"{r.uniform(1, 1.2):.6E}"),
    ("mtp_1 loss", lambda r, i: f"{r.uniform(1, 3):.6E}"),
    ("loss scale", lambda r, i: "1.0"),
    ("grad norm", lambda r, i: f"{r.uniform(0, 5):.3f}"),
    ("num zeros", lambda r, i: "0.0"),
    ("number of skipped iterations", lambda r, i: "  0"),
    ("number of nan iterations", lambda r, i: "  0"),
]

NOISE = [
    "[W302 10:00:01.1 reducer.cpp:1389] Warning: find_unused_parameters=True was specified in DDP constructor",
    "data loader: lane 3 prefetched 12 samples in 3.1 ms",
    "nid001234:7:7 [7] NCCL INFO Channel 03/32 :    0   1   2   3",
    "successfully saved checkpoint from iteration 40 to /lustre/ckpt [ t 1/ 2, p 1/ 1 ]",
    "loaded checkpoint from iteration 30",
    "ValueError raised and handled by the data loader",
    "slurmstepd: error: *** JOB 77 ON nid0001 CANCELLED AT 2026-03-02T10:10:06 DUE TO TIME LIMIT ***",
    "iteration counter reset",  # holds a trigger, is no iteration line
    "caf\xe9 latin-1 text",
    "\u2588\u2588 progress 50% \u2714",
]


def _iteration_line(r: random.Random, i: int, total: int, t: int) -> str:
    keys = [k for k in KEYS if r.random() > 0.1 or k[0] == "elapsed time per iteration (ms)"]
    fields = " | ".join(f"{k}: {v(r, i)}" for k, v in keys)
    ts = f"[2026-03-02 10:{t // 60 % 60:02d}:{t % 60:02d}{f'.{r.randrange(10**6):06d}' if r.random() < 0.5 else ''}] "
    return f" {ts}iteration {i:8d}/{total:8d} | {fields} |"


def _mutate(r: random.Random, line: str) -> str:
    """Odd but possible input: every branch of the C parser's strict syntax and its refusals."""
    choice = r.randrange(15)
    if choice == 0:
        return line.replace("lm loss: ", "lm loss: nan ", 1)  # not a finite number
    if choice == 1:
        return line.replace(" | ", " | note: text | ", 1)  # a non-number value
    if choice == 2:
        return line.replace("| ", "|\t", 2)  # tabs
    if choice == 3:
        return line + "\r"  # CRLF log
    if choice == 4:
        return line.replace("global batch size:   128", "global batch size: 1e20")  # int overflow
    if choice == 5:
        return line.replace("grad norm", "grad:norm")  # a ':' inside a key
    if choice == 6:
        return line.replace("loss scale: 1.0", "loss scale: 1.0 | loss scale: 2.0")  # repeated key
    if choice == 7:
        return line.replace("2026-03-02 10:", "2026-02-30 10:")  # no such day
    if choice == 8:
        return line[: r.randrange(20, len(line))]  # garbled (interleaved / cut)
    if choice == 9:
        return line.replace("learning rate: ", "learning rate: +")  # float() reads it, JSON does not
    if choice == 10:
        return line.replace("| ", "| \u00b5s: 3 | ", 1)  # non-ASCII key
    if choice == 11:
        return line.replace("lm loss", 'lm "loss"')  # a key that needs JSON escapes
    if choice == 12:
        return line.replace(" | ", " | | ", 2)  # blank segments
    if choice == 13:
        k = r.randrange(20, len(line))
        return line[:k] + "\n" + line[k:]  # wrapped by a terminal: the rest has no prefix
    return line.replace("consumed samples", "consumed_samples", 1)  # an unknown key: extras


def make_log(path: Path, seed: int, n: int = 1500) -> None:
    r = random.Random(seed)
    out: list[bytes] = []
    it = 0
    for k in range(n):
        u = r.random()
        prefix = r.choice(["", "0: ", "3: [default5]:", "1: [default1]:[rank9]: "])
        if u < 0.35:
            it = it + 1 if r.random() > 0.02 else max(1, it - r.randrange(1, 30))  # restarts now and then
            line = _iteration_line(r, it, 5000, k)
            if r.random() < 0.3:
                line = _mutate(r, line)
            out.append((prefix + line).encode())
        elif u < 0.40:
            rank = r.randrange(4)
            out += [
                f"{rank}: [default{rank}]:[rank{rank}]: Traceback (most recent call last):".encode(),
                f'{rank}: [default{rank}]:[rank{rank}]:   File "t.py", line 3, in <module>'.encode(),
                f"{rank}: [default{rank}]:[rank{rank}]: RuntimeError: boom {k}".encode(),
            ]
        elif u < 0.42:
            out.append(
                bytes(r.randrange(256) for _ in range(r.randrange(1, 80))).replace(b"\n", b"")
            )  # garbage
        elif u < 0.43:
            out.append(b"\xff\xfe broken \xc3\x28 iteration 5/ 9 | elapsed time per iteration (ms): 1 |")
        else:
            out.append((prefix + r.choice(NOISE)).encode("utf-8", "surrogateescape"))
    data = b"\n".join(out) + b"\n"
    if seed % 2:
        data += b" [2026-03-02 11:00:00] iteration 99999/ 100000 | elapsed time per"  # truncated last line
    path.write_bytes(data)


def _ingest(db: Path, log: Path, options: ScanOptions | None = None) -> tuple:
    con = store.connect(db)
    info = ingest.LogRunInfo(study="s", name="n", gpus_per_node=4)
    st = ingest.ingest_paths(con, [log], log_run=info, options=options)
    cur = con.execute("SELECT * EXCLUDE (source_file) FROM iterations ORDER BY job_id, iteration, attempt")
    x = [d[0] for d in cur.description].index("extras")
    # the C path keeps the log's number text in extras (1.000000E+00), Python writes repr (1.0)
    rows = [r[:x] + (json.loads(r[x]) if r[x] else None,) + r[x + 1 :] for r in cur.fetchall()]
    ev = con.execute("SELECT * EXCLUDE (source_file) FROM events ORDER BY line_no, kind").fetchall()
    files = con.execute(
        'SELECT lines, bad_lines, undecodable_lines, "offset", truncated, state FROM ingested_files'
    ).fetchall()
    con.close()
    return rows, ev, files, (st.lines, st.iterations, st.bad_lines, st.undecodable, st.truncated_files)


ONE_ITER = b" [2026-03-02 10:00:00] iteration 1/ 2 | elapsed time per iteration (ms): 5.0 | lm loss: 2.0 |\n"


PYTHON = ScanOptions(scanner="python")


def _c(segment: int, **sizes) -> ScanOptions:
    """The compiled scanner, handed `segment` bytes at a time (other sizes: max_line, row_group, as given)."""
    require_ext()
    return ScanOptions(scanner="c", segment=segment, **sizes)


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_compiled_scanner_equals_python(tmp_path, seed):
    require_ext()
    log = tmp_path / "slurm-500.out"
    make_log(log, seed)
    want = _ingest(tmp_path / "py.duckdb", log, PYTHON)
    assert want[3][1] > 300 and want[3][2] > 0 and want[3][3] > 5 and len(want[1]) > 30, want[
        3
    ]  # a nasty log
    # whole file in one block, a few blocks, and many tiny blocks (a batch each, lines across them) and
    # batches of a few rows stored while scanning (take(n) leaves the rest, extras ids stay valid); blocks
    # of 16 KiB that grow for long lines up to a max_line of 64 KiB (filter: simd AVX2, or portable C)
    for segment, simd, group, max_line in (
        (64 << 20, True, 122880, 16 << 20),
        (64 << 10, True, 7, 16 << 20),
        (8 << 10, True, 122880, 16 << 20),
        (8 << 10, False, 3, 16 << 20),
        (16 << 10, True, 5, 64 << 10),
        (16 << 10, False, 5, 64 << 10),
    ):
        case = (segment, simd, group, max_line)
        options = _c(segment, simd=simd, row_group=group, max_line=max_line)
        got = _ingest(tmp_path / f"c-{segment}-{simd}-{max_line}.duckdb", log, options)
        assert got[3] == want[3], case
        assert got[2] == want[2], case
        assert got[1] == want[1], case
        assert got[0] == want[0], case


def test_appends_resume_the_same_way(tmp_path):
    """A log ingested while it grows (3 appends, cut mid-line) ends with the rows of one whole ingest."""
    require_ext()
    (tmp_path / "whole").mkdir()
    full = tmp_path / "whole" / "slurm-500.out"  # same job id as the growing copy
    make_log(full, 7, n=3000)
    data = full.read_bytes()
    options = _c(16 << 10)
    want = _ingest(tmp_path / "whole.duckdb", full, options)
    grow = tmp_path / "slurm-500.out"
    db = tmp_path / "grow.duckdb"
    for cut in (len(data) // 3 + 17, 2 * len(data) // 3 + 5, len(data)):
        grow.write_bytes(data[:cut])
        got = _ingest(db, grow, options)
    assert got[0] == want[0] and got[1] == want[1]
    assert got[2][0][:5] == want[2][0][:5]  # lines, bad, undecodable, offset, truncated


def test_garbage_longer_than_max_line(tmp_path):
    log = tmp_path / "slurm-1.out"
    log.write_bytes(
        ONE_ITER + b"\x07" * (40 << 10) + b"\n" + ONE_ITER.replace(b"iteration 1/", b"iteration 2/")
    )
    options = _c(16 << 10, max_line=32 << 10)  # the read buffer grows to max_line
    rows, _, files, stats = _ingest(tmp_path / "g.duckdb", log, options)
    assert [r[2] for r in rows] == [1, 2]
    assert stats[:3] == (3, 2, 1)  # 3 lines, 2 iterations, the garbage line counted bad
    assert files[0][:2] == (3, 1)


def test_a_failure_mid_scan_rolls_back_everything(tmp_path, monkeypatch):
    """An error while batches are being stored in the background: nothing of the file is kept, and a later
    ingest stores it whole."""
    log = tmp_path / "slurm-500.out"
    make_log(log, 3, n=6000)
    options = _c(16 << 10, row_group=25)  # many background batches
    seen = []
    real = LineHandler.line

    def failing(self, line_no, line):
        seen.append(line_no)
        if len(seen) == 40:
            raise OSError(5, "disk went away")
        return real(self, line_no, line)

    monkeypatch.setattr(LineHandler, "line", failing)
    con = store.connect(tmp_path / "s.duckdb")
    st = ingest.ingest_paths(con, [log], log_run=ingest.LogRunInfo(study="s", name="n"), options=options)
    assert st.problems and "disk went away" in st.problems[0]
    assert con.execute("SELECT count(*) FROM iterations").fetchone()[0] == 0
    assert con.execute("SELECT count(*) FROM ingested_files").fetchone()[0] == 0
    con.close()
    monkeypatch.setattr(LineHandler, "line", real)
    got = _ingest(tmp_path / "s.duckdb", log, options)
    want = _ingest(tmp_path / "py.duckdb", log, PYTHON)
    assert got[0] == want[0] and got[3] == want[3]


def test_garbage_lines_mid_file(tmp_path):
    """Garbage lines (no newline in max_line bytes) in the middle of a log, one of them many read blocks
    long: read alike whatever the block size, and each is exactly one more bad line than the same log
    without them."""
    clean = tmp_path / "clean" / "slurm-4.out"
    clean.parent.mkdir()
    make_log(clean, 9, n=1500)
    data = clean.read_bytes()
    k = data.index(b"\n", len(data) // 3) + 1
    j = data.index(b"\n", 2 * len(data) // 3) + 1
    log = tmp_path / "slurm-4.out"
    log.write_bytes(
        data[:k] + b"\x07" * (40 << 10) + b"\n" + data[k:j] + b"\x01" * (150 << 10) + b"\n" + data[j:]
    )
    got = [
        _ingest(tmp_path / f"{segment}.duckdb", log, _c(segment, max_line=32 << 10))
        for segment in (8 << 10, 32 << 10)
    ]
    assert got[0] == got[1]
    base = _ingest(tmp_path / "clean.duckdb", clean, _c(8 << 10, max_line=32 << 10))
    assert got[0][0] == base[0]  # the same iteration rows
    lines, iters, bad, undecodable, truncated = got[0][3]
    assert (lines, iters, bad, undecodable, truncated) == (
        base[3][0] + 2,
        base[3][1],
        base[3][2] + 2,
        *base[3][3:],
    )


def test_a_long_line_grows_the_buffer(tmp_path):
    """Lines longer than the read buffer (a segment) but within max_line are ordinary lines."""
    log = tmp_path / "slurm-2.out"
    log.write_bytes(b"x" * (40 << 10) + b" successfully saved checkpoint from iteration 1\n" + ONE_ITER)
    rows, events, files, stats = _ingest(tmp_path / "g.duckdb", log, _c(4 << 10))
    assert [r[2] for r in rows] == [1] and [e[5] for e in events] == ["checkpoint_saved"]
    assert stats[:3] == (2, 1, 0)


def test_a_file_truncated_while_read(tmp_path, monkeypatch):
    """A log cut short during the scan (a requeued job reopened it with O_TRUNC): the read ends where the
    file now ends, and what ingest keeps is exactly a whole ingest of the part that is left."""
    log = tmp_path / "slurm-3.out"
    make_log(log, 5, n=3000)
    data = log.read_bytes()
    options = _c(8 << 10)
    real = LineHandler.line
    calls = []

    def truncating(self, line_no, line):
        calls.append(1)
        if len(calls) == 3:
            with open(log, "r+b") as f:
                f.truncate(20 << 10)
        return real(self, line_no, line)

    monkeypatch.setattr(LineHandler, "line", truncating)
    con = store.connect(tmp_path / "t.duckdb")
    st = ingest.ingest_paths(con, [log], log_run=ingest.LogRunInfo(study="s", name="n"), options=options)
    assert not st.problems and 0 < st.lines < 400 and st.files == 1
    rows = con.execute(
        "SELECT iteration, attempt, time, loss, elapsed_ms FROM iterations ORDER BY iteration, attempt"
    ).fetchall()
    lines = con.execute("SELECT lines FROM ingested_files").fetchone()[0]
    con.close()
    monkeypatch.setattr(LineHandler, "line", real)
    keep = tmp_path / "kept" / "slurm-3.out"
    keep.parent.mkdir()
    keep.write_bytes(data[: 20 << 10])
    con = store.connect(tmp_path / "k.duckdb")
    ingest.ingest_paths(con, [keep], log_run=ingest.LogRunInfo(study="s", name="n"), options=options)
    assert (
        rows
        and rows
        == con.execute(
            "SELECT iteration, attempt, time, loss, elapsed_ms FROM iterations ORDER BY iteration, attempt"
        ).fetchall()
    )
    assert lines == con.execute("SELECT lines FROM ingested_files").fetchone()[0]
    con.close()

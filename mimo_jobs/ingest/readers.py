"""Reading files: blocks of complete lines, never a whole file; the lines worth parsing found fast.

Two scanners find a log's candidate lines (those holding one of events.ALL_TRIGGERS) and give the same rows
(tests/ingest/test_logscan.py and test_ingest.py compare them):
- "c": the compiled `_logscan` (mimo_jobs/ingest/_logscan.c) is handed blocks read into one buffer; it counts
  lines and encoding errors, finds candidate lines with a SIMD multi-literal filter and parses iteration lines
  into columns itself; only rare lines (events, tracebacks, odd iteration lines) come back to Python;
- "python": substring scans of each decoded block, for installs without a C compiler.
Candidate lines go to a line handler (lines.LineHandler), C-parsed iteration rows to a stage (staging.Stage).
Which scanner runs, and the block sizes, are a ScanOptions (from MIMO_JOBS_SCANNER by default).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mimo_jobs.errors import MimoJobsError
from mimo_jobs.store import connection as store

from .events import ALL_TRIGGERS
from .iterline import COLUMN_OF, FAST_COLUMNS, INT_COLUMNS

try:
    from . import _logscan
except ImportError:  # built without a C compiler: same results through the pure-Python scanner, slower
    _logscan = None

HAVE_COMPILED = _logscan is not None
SCANNERS = ("c", "python")
CHUNK = 8 << 20  # bytes the pure-Python scanner reads and decodes at a time
SEGMENT = 1 << 20  # bytes the compiled scanner is handed at a time (then progress, storing a row group)
MAX_LINE = 16 << 20  # a "line" longer than this is binary garbage: counted as one bad line and dropped


class ScanError(MimoJobsError, ValueError):
    """Files cannot be scanned as asked (an unusable MIMO_JOBS_SCANNER)."""


@dataclass(frozen=True)
class ScanOptions:
    """How files are scanned. The defaults are what ingest uses; tests make the sizes small to put lines
    across block ends and store many row batches."""

    scanner: str | None = None  # "c" | "python"; None: "c" where it is built, else "python"
    simd: bool = True  # the C filter's AVX2 path where the CPU has it (False: portable C)
    segment: int = SEGMENT  # the compiled scanner's read buffer (it grows for a longer line)
    max_line: int = MAX_LINE  # a longer "line" is garbage: one bad line, skipped
    # C-parsed rows are stored in batches of one DuckDB row group while the file is scanned (their
    # compression then runs on the other core), the rest at the end. All batches of a file share one
    # transaction, so DuckDB writes full row groups straight to the database file (no WAL).
    row_group: int = store.ROW_GROUP

    def __post_init__(self) -> None:
        why = _unusable(self.scanner)
        if why:
            raise ScanError(f"scanner {self.scanner!r}: {why}")

    def scanner_for(self, kind: str) -> str:
        """Which scanner reads a file of this kind (metrics and sacct files: always the Python reader)."""
        if kind != "log":
            return "python"
        return self.scanner or ("c" if HAVE_COMPILED else "python")


def _unusable(scanner: str | None) -> str | None:
    """Why this scanner cannot be used here, or None."""
    if scanner not in (None, *SCANNERS):
        return "use c or python (or leave it unset)"
    if scanner == "c" and not HAVE_COMPILED:
        return "mimo_jobs.ingest._logscan is not built (no C compiler at install)"
    return None


def scan_options() -> ScanOptions:
    """The options MIMO_JOBS_SCANNER asks for (unset or empty: the default); ScanError when unusable."""
    value = os.environ.get("MIMO_JOBS_SCANNER") or None
    why = _unusable(value)
    if why:
        raise ScanError(f"MIMO_JOBS_SCANNER={value!r}: {why}")
    return ScanOptions(scanner=value)


def forced_scanner() -> str | None:
    """The scanner MIMO_JOBS_SCANNER asks for (None: unset), checked before anything is opened."""
    return scan_options().scanner


@dataclass
class FileState:
    """What reading a file has established so far; kept in the store between ingests (appends resume)."""

    lines: int = 0  # complete lines consumed so far (line numbers continue after an append)
    bad: int = 0
    undecodable: int = 0
    last_iter: int | None = None
    restarts: int = 0
    last_time: str | None = None
    # multi-line blocks still open where the last ingest stopped (a traceback without its exception line
    # yet, a torchrun summary entry without all its fields): an append goes on with them, so a log ingested
    # while it grows gives the events of one ingest of the whole file (lines.LineHandler)
    open_blocks: dict | None = None

    def to_json(self) -> str:
        d = {"last_iter": self.last_iter, "restarts": self.restarts, "last_time": self.last_time}
        if self.open_blocks:
            d["open_blocks"] = self.open_blocks
        return json.dumps(d)


def line_text(raw: bytes) -> str:
    return raw.decode("utf-8", "replace").replace("\x00", "")


# ----------------------------------------------------------------------------------------- pure Python


def read_blocks(
    path: Path,
    offset: int,
    st: FileState,
    on_block: Callable[[int, str], None],
    on_bytes: Callable[[int], None] | None,
    max_line: int = MAX_LINE,
) -> tuple[int, bool]:
    """Hand `on_block(first_line_no, text)` blocks of complete lines from `offset` on, counting lines, invalid
    UTF-8 and NUL bytes in `st`. Returns (offset after the last complete line, whether a partial last line
    was left)."""
    consumed = offset
    carry = b""
    with open(path, "rb") as f:
        f.seek(offset)
        while True:
            buf = f.read(CHUNK)
            if on_bytes:
                on_bytes(len(buf))
            if not buf:
                break
            data = carry + buf if carry else buf
            cut = data.rfind(b"\n") + 1
            if cut == 0:
                carry = data
                if len(carry) > max_line:  # no newline in max_line bytes: binary garbage, drop it
                    st.bad += 1
                    consumed += len(carry)
                    carry = b""
                continue
            carry = data[cut:]
            block = data[:cut]
            text = _decode(block, st)
            first = st.lines
            st.lines += block.count(b"\n")
            consumed += cut
            on_block(first, text)
    return consumed, bool(carry)


def _decode(block: bytes, st: FileState) -> str:
    try:
        text = block.decode("utf-8")
    except UnicodeDecodeError:
        out = []
        for p in block.split(b"\n"):
            try:
                out.append(p.decode("utf-8"))
            except UnicodeDecodeError:
                st.undecodable += 1
                out.append(p.decode("utf-8", "replace"))
        text = "\n".join(out)
    if "\x00" in text:  # NUL bytes: binary garbage inside a text log (e.g. a crashed writer's page)
        st.bad += sum(1 for ln in text.split("\n") if "\x00" in ln)
        text = text.replace("\x00", "")
    return text


def candidate_lines(text: str, first: int, wants_next: Callable[[], bool] = lambda: False):
    """(line number, line) of every line of a block holding a trigger: one substring scan per trigger (the
    pure-Python scanner); and the line after one whenever `wants_next()` says so once it was handled (the
    compiled scanner's `next`)."""
    starts: set[int] = {0} if wants_next() and text else set()
    for trig in ALL_TRIGGERS:
        pos = text.find(trig)
        while pos >= 0:
            starts.add(text.rfind("\n", 0, pos) + 1)
            le = text.find("\n", pos)
            if le < 0:
                break
            pos = text.find(trig, le + 1)
    line_no = first
    prev = 0
    for ls in sorted(starts):
        line_no += text.count("\n", prev, ls)
        prev = ls
        le = text.find("\n", ls)
        yield line_no + 1, text[ls:le]
        if wants_next() and le + 1 < len(text) and le + 1 not in starts:
            line_no, prev = line_no + 1, le + 1
            yield line_no + 1, text[le + 1 : text.find("\n", le + 1)]


def scan_python(
    path: Path,
    offset: int,
    st: FileState,
    handler,
    on_bytes: Callable[[int], None] | None,
    options: ScanOptions,
) -> tuple[int, bool]:
    """A log through the pure-Python scanner: each block's candidate lines go to `handler.line`."""

    def on_block(first: int, text: str) -> None:
        for ln, line in candidate_lines(text, first, handler.wants_next):
            handler.line(ln, line)

    return read_blocks(path, offset, st, on_block, on_bytes, options.max_line)


# ----------------------------------------------------------------------------------------- compiled


def _compiled_scanner(handler, options: ScanOptions):
    return _logscan.Scanner(
        tuple(x.encode() for x in ALL_TRIGGERS),
        tuple((k.encode(), FAST_COLUMNS.index(c), c in INT_COLUMNS) for k, c in COLUMN_OF.items()),
        handler.want_iters,
        handler.base_attempt,
        int(options.simd),
    )


def _state_to_c(st: FileState, cs) -> None:
    cs.lines, cs.bad, cs.undecodable = st.lines, st.bad, st.undecodable
    cs.last_iter = -1 if st.last_iter is None else st.last_iter
    cs.restarts, cs.last_time = st.restarts, st.last_time


def _state_from_c(cs, st: FileState) -> None:
    st.lines, st.bad, st.undecodable = cs.lines, cs.bad, cs.undecodable
    st.last_iter = None if cs.last_iter < 0 else cs.last_iter
    st.restarts, st.last_time = cs.restarts, cs.last_time


def scan_compiled(
    con,
    path: Path,
    offset: int,
    size: int,
    st: FileState,
    handler,
    stage,
    on_bytes: Callable[[int], None] | None,
    options: ScanOptions,
) -> tuple[int, bool]:
    """A log through the compiled scanner, read a block at a time up to `size` (the size ingest saw): the
    scanner hands back only the lines Python must see (events, tracebacks, iteration lines outside its strict
    syntax); its rows are stored a row group at a time while the next blocks are scanned. Returns (offset
    after the last complete line, whether a partial last line was left)."""
    cs = _compiled_scanner(handler, options)

    def lines(buf: bytearray, end: int) -> None:
        """The complete lines buf[:end] of a freshly read buffer: Python handles what the scanner hands back."""
        p, fresh = 0, True
        while (hit := cs.scan(buf, p, end, handler.fast(), fresh, handler.wants_next())) is not None:
            fresh = False
            ls, le, line_no = hit
            _state_from_c(cs, st)
            handler.line(line_no, line_text(buf[ls:le]))
            _state_to_c(st, cs)
            p = le + 1
        if on_bytes:
            on_bytes(end)
        if cs.rows >= options.row_group:  # a full row group is stored while the next blocks are scanned
            stage.c_batch(con, cs.take(options.row_group))

    _state_to_c(st, cs)
    with open(path, "rb") as f:
        pos, partial = _walk(f, offset, size, cs, lines, options)
    if cs.rows:
        stage.c_batch(con, cs.take())
    _state_from_c(cs, st)
    return pos, partial


def _walk(f, offset: int, size: int, cs, lines, options: ScanOptions) -> tuple[int, bool]:
    """Read the file from `offset` to `size` into one reused buffer and hand each block of complete lines to
    `lines(buf, end)`; a line longer than the buffer grows it, up to options.max_line (beyond: garbage,
    skipped). A file that shrinks meanwhile just ends early. Returns (offset after the last complete line,
    whether a partial last line was left)."""
    buf = bytearray(options.segment)
    view = memoryview(buf)
    pos, have = offset, 0  # file offset of buf[0]; bytes in buf (a partial line carried over first)
    f.seek(offset)
    while pos + have < size:
        if have == len(buf):  # one line fills the buffer: grow it up to max_line, past that it is garbage
            if len(buf) >= options.max_line:
                pos, have = _skip_garbage(f, pos + have, size, cs), 0
                f.seek(pos)
                continue
            view.release()
            buf.extend(bytes(len(buf)))
            view = memoryview(buf)
        n = f.readinto(view[have : min(len(buf), have + size - pos - have)])
        if not n:
            break  # the file shrank while being read: what was there is what counts
        have += n
        cut = buf.rfind(b"\n", 0, have)
        if cut < 0:
            continue
        end = cut + 1
        lines(buf, end)
        buf[: have - end] = view[end:have]  # the partial last line moves to the front
        pos, have = pos + end, have - end
    view.release()
    return pos, have > 0  # a partial last line: not finished (the file may still be growing)


def _skip_garbage(f, start: int, size: int, cs) -> int:
    """A "line" longer than max_line: counted as one bad line and skipped up to its newline."""
    cs.bad += 1
    cs.lines += 1
    f.seek(start)
    pos = start
    while True:
        buf = f.read(CHUNK)
        if not buf:
            cs.lines -= 1  # ran into the end of the file: consumed, but not a complete line
            return size
        k = buf.find(b"\n")
        if k >= 0:
            return pos + k + 1
        pos += len(buf)

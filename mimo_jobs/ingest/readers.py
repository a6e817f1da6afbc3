"""Reading log files: blocks of complete lines, never a whole file; the lines worth parsing found fast.

Three scanners give the same rows (tests/ingest/test_logscan.py, test_ingest.py compare them):
- "c": the compiled `_logscan` (mimo_jobs/_logscan.c) walks the file mapped MAP_WINDOW bytes at a time (read
  into a buffer where it cannot be mapped, or shrank under the mapping), counts lines and encoding errors,
  finds candidate lines with a SIMD multi-literal filter and parses iteration lines into columns itself; only rare lines (events, tracebacks, odd iteration lines) come back to Python;
- "grep": a grep process finds the candidate lines (logparse.ALL_TRIGGERS) while Python counts lines;
- "python": substring scans of each block in-process.
Candidate lines go to a line handler (ingest._LogScanner), iteration rows to a stage (staging.Stage).
"""

from __future__ import annotations

from mimo_jobs.errors import MimoJobsError

import json
import mmap
import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from . import logparse
from mimo_jobs.store import connection as store


class ScanError(MimoJobsError, ValueError):
    """A file could not be scanned (grep failed, an unusable MIMO_JOBS_SCANNER)."""


CHUNK = 8 << 20
# How log files are scanned for candidate lines: "c" (the compiled _logscan: one pass, iteration lines parsed
# in C), "grep" (a grep process finds candidates, Python parses them), "python" (substring scans in-process).
# None: "c" when the extension is built, else grep for big files. Tests pin each mode to compare their rows.
SCAN: str | None = os.environ.get("MIMO_JOBS_SCANNER") or None
GREP_MIN_BYTES = 4 << 20  # smaller files are scanned in-process (a process start costs more than the scan)
SEGMENT = 1 << 20  # bytes the C path scans between returns to Python (progress, storing a row group)
# The C path maps the file (no copy into a read buffer: ~0.1 s per GiB) unless this is False, MAP_WINDOW
# bytes at a time (more than MAX_LINE: every line that starts in a window's first part ends inside it).
MAP = True
MAP_WINDOW = 64 << 20
# C-parsed rows are stored in batches of one DuckDB row group (store.ROW_GROUP) while the file is scanned
# (their compression then runs on the other core), the rest at the end. All batches of a file share one
# transaction, so DuckDB writes full row groups straight to the database file and the last partial one at
# commit (no WAL).
ROW_GROUP = store.ROW_GROUP
SIMD = 1  # the C path's filter: AVX2 where the CPU has it, 0 = portable C (tests compare the two)
try:
    from . import _logscan
except ImportError:  # built without a C compiler: same results through grep/Python, slower
    _logscan = None
MAX_LINE = 16 << 20  # a "line" longer than this is binary garbage: counted and dropped (C path: skipped whole)


@dataclass
class FileState:
    """What reading a file has established so far; kept in the store between ingests (appends resume)."""

    lines: int = 0  # complete lines consumed so far (line numbers continue after an append)
    bad: int = 0
    undecodable: int = 0
    last_iter: int | None = None
    restarts: int = 0
    last_time: str | None = None

    def to_json(self) -> str:
        return json.dumps(
            {"last_iter": self.last_iter, "restarts": self.restarts, "last_time": self.last_time}
        )


def chunks(
    path: Path, offset: int, st: FileState, on_bytes: Callable[[int], None] | None, need_text: bool = True
):
    """Yield (first_line_no, text) for blocks of complete lines starting at `offset` (text is None when
    not needed: lines are still counted and checked for invalid UTF-8 / NUL bytes). Returns (offset after
    the last complete line, whether a partial last line was left)."""
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
                if len(carry) > MAX_LINE:  # no newline in 16 MiB: binary garbage, drop it
                    st.bad += 1
                    consumed += len(carry)
                    carry = b""
                continue
            carry = data[cut:]
            block = data[:cut]
            if need_text or not block.isascii():
                text = _decode(block, st)
            else:
                text = None  # pure ASCII: nothing to count, and the candidate lines come from grep
                if b"\x00" in block:
                    st.bad += sum(1 for ln in block.split(b"\n") if b"\x00" in ln)
            first = st.lines
            st.lines += block.count(b"\n")
            consumed += cut
            yield first, (text if need_text else None)
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


def _python_candidates(text: str, first: int):
    """(line number, line) of every line holding a trigger: one substring scan per trigger over the block
    (the fallback when grep is not installed)."""
    starts: set[int] = set()
    for trig in logparse.ALL_TRIGGERS:
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
        yield line_no + 1, text[ls : text.find("\n", ls)]


GREP = shutil.which("grep")


def _grep_start(path: Path, offset: int, out_path: str):
    """GNU/BSD grep finds the candidate lines (multi-pattern fixed-string search near `wc -l` speed) in a
    second process, while this one counts lines and checks encodings. Reads from `offset` via stdin."""
    args = [GREP, "-a", "-n", "-F"]
    for t in logparse.ALL_TRIGGERS:
        args += ["-e", t]
    f = open(path, "rb")  # noqa: SIM115 - handed to the child, closed by _grep_lines
    f.seek(offset)
    out = open(out_path, "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        args, stdin=f, stdout=out, stderr=subprocess.PIPE, env=dict(os.environ, LC_ALL="C")
    )
    return proc, f, out


def _grep_lines(proc, f, out, out_path: str, first: int, complete: int):
    proc.wait()
    f.close()
    out.close()
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if proc.returncode not in (0, 1):  # 1 = no match
        raise ScanError(f"grep failed ({proc.returncode}): {err.strip()[:200]}")
    with open(out_path, "rb") as g:
        for raw in g:
            n, _, rest = raw.partition(b":")
            k = int(n)
            if k > complete:  # the partial last line: left for the next ingest
                break
            yield first + k, rest.rstrip(b"\n").decode("utf-8", "replace").replace("\x00", "")


def forced_scanner() -> str | None:
    """The scanner MIMO_JOBS_SCANNER (SCAN) asks for, checked to be usable here; None: choose per file."""
    if SCAN is None:
        return None
    if SCAN not in ("c", "grep", "python"):
        raise ScanError(f"MIMO_JOBS_SCANNER={SCAN!r}: use c, grep or python (or leave it unset)")
    if SCAN == "c" and _logscan is None:
        raise ScanError("MIMO_JOBS_SCANNER=c, but mimo_jobs.ingest._logscan is not built (no C compiler at install)")
    if SCAN == "grep" and GREP is None:
        raise ScanError("MIMO_JOBS_SCANNER=grep, but grep is not installed")
    return SCAN


def scan_mode(kind: str, nbytes: int) -> str:
    """Which scanner reads a file of this kind and size (see SCAN)."""
    if kind != "log":
        return "python"
    forced = forced_scanner()
    if forced is not None:
        return forced
    if _logscan is not None:
        return "c"
    return "grep" if GREP is not None and nbytes >= GREP_MIN_BYTES else "python"


def line_text(raw: bytes) -> str:
    return raw.decode("utf-8", "replace").replace("\x00", "")


def scan_python(
    path: Path,
    kind: str,
    offset: int,
    st: FileState,
    scanner,
    on_block: Callable[[int, str], None],
    on_bytes: Callable[[int], None] | None,
    use_grep: bool,
    work_dir: str,
) -> tuple[int, bool]:
    """Every file kind without the compiled scanner: read blocks of complete lines; blocks of metrics/sacct
    files go to `on_block(first_line_no, text)`, and log candidate lines go to `scanner.line` from grep (a
    second process) or from in-process substring scans. Returns (offset after the last complete line, whether
    a partial last line was left)."""
    grep = _grep_start(path, offset, os.path.join(work_dir, "grep.out")) if use_grep else None
    first_line = st.lines
    gen = chunks(path, offset, st, on_bytes, need_text=not use_grep)
    try:
        while True:
            try:
                first, text = next(gen)
            except StopIteration as e:
                end_offset, partial = e.value
                break
            if kind != "log":
                on_block(first, text)
            elif not use_grep:
                for ln, line in _python_candidates(text, first):
                    scanner.line(ln, line)
    except BaseException:
        if grep is not None:
            grep[0].kill()
            grep[0].wait()
            grep[1].close()
            grep[2].close()
        raise
    if grep is not None:
        cand = _grep_lines(*grep, os.path.join(work_dir, "grep.out"), first_line, st.lines - first_line)
        for ln, line in cand:
            scanner.line(ln, line)
    return end_offset, partial


def scan_compiled(
    con,
    path: Path,
    offset: int,
    size: int,
    st: FileState,
    scanner,
    stage,
    on_bytes: Callable[[int], None] | None,
    mapped: bool | None = None,
) -> tuple[int, bool]:
    """The compiled path: let _logscan walk the file's lines; it hands back only the lines Python must see
    (events, tracebacks, iteration lines outside its strict syntax). The file is memory-mapped (`mapped`,
    default MAP), else read a block at a time. Returns (offset after the last complete line, whether a
    partial last line was left). Raises FileShrank when a mapped file shrinks under the scan: the caller
    drops what was staged and reads the file again unmapped."""
    cs = _logscan.Scanner(
        tuple(x.encode() for x in logparse.ALL_TRIGGERS),
        tuple(
            (k.encode(), logparse.FAST_COLUMNS.index(c), c in logparse._INT_COLUMNS)
            for k, c in logparse._COLUMN_OF.items()
        ),
        scanner.want_iters,
        scanner.base_attempt,
        SIMD,
    )

    def to_c() -> None:
        cs.lines, cs.bad, cs.undecodable = st.lines, st.bad, st.undecodable
        cs.last_iter = -1 if st.last_iter is None else st.last_iter
        cs.restarts, cs.last_time = st.restarts, st.last_time

    def from_c() -> None:
        st.lines, st.bad, st.undecodable = cs.lines, cs.bad, cs.undecodable
        st.last_iter = None if cs.last_iter < 0 else cs.last_iter
        st.restarts, st.last_time = cs.restarts, cs.last_time

    def lines(buf, p: int, end: int, fresh: bool) -> None:
        """Scan the complete lines buf[p:end]: Python handles what the scanner hands back."""
        while (hit := cs.scan(buf, p, end, scanner.fast(), fresh)) is not None:
            fresh = False
            ls, le, line_no = hit
            from_c()
            scanner.line(line_no, line_text(cs.slice(buf, ls, le)))
            to_c()
            p = le + 1

    def flush() -> None:
        if cs.rows >= ROW_GROUP:  # a full row group is stored while the next blocks are scanned
            stage.c_batch(con, cs.take(ROW_GROUP))

    to_c()
    with open(path, "rb") as f:
        try:
            walked = _scan_mapped(f, offset, size, cs, lines, flush, on_bytes) if (
                MAP if mapped is None else mapped) else None
        except _logscan.Shrunk as e:
            raise FileShrank(f"{path}: {e}") from None
        if walked is None:  # not mapped
            walked = _walk_read(f, offset, size, cs, lines, flush, on_bytes)
    pos, partial = walked
    if cs.rows:
        stage.c_batch(con, cs.take())
    from_c()
    return pos, partial


class FileShrank(OSError):
    """A mapped file shrank while it was scanned (see scan_compiled)."""


def _scan_mapped(f, pos: int, size: int, cs, lines, flush, on_bytes) -> tuple[int, bool] | None:
    """The walk over the file mapped MAP_WINDOW bytes at a time (resident memory stays that small), or None
    where it cannot be mapped (not a regular file; already shorter than `size`: the read path copes)."""
    gran = mmap.ALLOCATIONGRANULARITY
    window = max(MAP_WINDOW, MAX_LINE + SEGMENT + 2 * gran)  # each window makes progress
    first = True
    while True:
        base = pos - pos % gran
        last = size - base <= window
        n = size - base if last else window
        if n <= pos - base:
            return pos, False
        try:
            mm = mmap.mmap(f.fileno(), n, offset=base, access=mmap.ACCESS_READ)
        except (OSError, ValueError):
            if first:
                return None
            raise
        first = False
        try:
            # a window ends where a longest line could still start; the last one at the end of the file
            p, status = _walk_mapped(mm, pos - base, n if last else n - MAX_LINE - 1, last, cs, lines, flush,
                                     on_bytes)
        finally:
            mm.close()
        pos = base + p
        if status == "garbage":  # no newline in MAX_LINE bytes: one bad line, skipped up to its end
            pos = _skip_garbage(f, pos + MAX_LINE, size, cs)
            if pos >= size:
                return size, False
        elif last:
            return pos, status == "partial"


def _walk_mapped(mm, p: int, stop: int, last: bool, cs, lines, flush, on_bytes) -> tuple[int, str]:
    """Segments of about SEGMENT bytes of complete lines of one mapped window, from p until `stop`: (where it
    stopped, "done" | "partial" (an unfinished last line of the file) | "garbage" (a line of MAX_LINE bytes
    or more starts there)). Every access to the mapping goes through the scanner (guarded against SIGBUS)."""
    n, fresh = len(mm), True
    while p < stop:
        cut = cs.cut(mm, p, min(p + SEGMENT, n), True)
        if cut < 0:  # a line longer than a segment
            cut = cs.cut(mm, p, min(p + MAX_LINE, n), False)
            if cut < 0:
                return p, ("partial" if last and n - p < MAX_LINE else "garbage")
        lines(mm, p, cut, fresh)
        fresh = False
        if on_bytes:
            on_bytes(cut - p)
        p = cut
        flush()
    return p, "done"


def _walk_read(f, offset: int, size: int, cs, lines, flush, on_bytes) -> tuple[int, bool]:
    """The same walk over blocks read into one reused buffer (files that cannot be mapped, and a file that
    shrank under its mapping: here it just ends early)."""
    buf = bytearray(SEGMENT)
    view = memoryview(buf)
    pos, have = offset, 0  # file offset of buf[0]; bytes in buf (a partial line carried over first)
    f.seek(offset)
    while pos + have < size:
        if have == len(buf):  # one line fills the buffer: grow it up to MAX_LINE, past that it is garbage
            if len(buf) >= MAX_LINE:
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
        lines(buf, 0, end, True)  # offsets restart with each buffer's contents
        if on_bytes:
            on_bytes(end)
        buf[: have - end] = view[end:have]  # the partial last line moves to the front
        pos, have = pos + end, have - end
        flush()
    view.release()
    return pos, have > 0  # a partial last line: not finished (the file may still be growing)


def _skip_garbage(f, start: int, size: int, cs) -> int:
    """A "line" longer than MAX_LINE: counted as one bad line and skipped up to its newline."""
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

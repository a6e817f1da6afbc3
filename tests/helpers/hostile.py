"""Hostile-input cases: one line each, run as a real `mimo-jobs` process.

A case names the files to create (relative path -> bytes or text; "{tmp}" in text and argv becomes the
case's own directory), the command line, the exit code it must end with, and words its output must hold.
Every case also asserts that no Python traceback reaches the user and that the command ends within its
time bound (no input may make a command hang). Extend a test module's CASES with one `Case(...)` line.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from helpers import REPO


@dataclass(frozen=True)
class Case:
    id: str
    argv: list[str]
    exit: int
    says: tuple[str, ...] = ()
    files: dict[str, bytes | str] = field(default_factory=dict)
    setup: Callable[[Path], None] | None = None  # extra preparation (a store, a FIFO, a read-only dir)
    check: Callable[[Path, str], None] | None = None  # extra assertions on the directory and the output
    timeout_s: float = 60.0  # raised to HANG_S: only a hang fails a case, never a slow machine
    env: dict[str, str] = field(default_factory=dict)


HANG_S = 300.0


def run_case(case: Case, tmp: Path) -> str:
    for rel, content in case.files.items():
        p = tmp / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, str):
            p.write_text(content.replace("{tmp}", str(tmp)))
        else:
            p.write_bytes(content)
    if case.setup is not None:
        case.setup(tmp)
    argv = [a.replace("{tmp}", str(tmp)) for a in case.argv]
    env = {**os.environ, "COLUMNS": "", "MIMO_JOBS_DB": str(tmp / "default.duckdb"), **case.env}
    # this checkout's code, never a second installed copy of mimo_jobs (as helpers/launch.py does)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    try:
        p = subprocess.run(
            [sys.executable, "-m", "mimo_jobs.cli", *argv],
            cwd=tmp,
            env=env,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=max(case.timeout_s, HANG_S),
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        raise AssertionError(
            f"{case.id}: `mimo-jobs {' '.join(argv)}` still ran after {max(case.timeout_s, HANG_S):.0f} s"
        ) from None
    out = p.stdout + p.stderr
    assert "Traceback (most recent call last)" not in out, f"{case.id}: a traceback reached the user:\n{out}"
    assert p.returncode == case.exit, f"{case.id}: exit {p.returncode}, expected {case.exit}:\n{out[-3000:]}"
    for words in case.says:
        assert words in out, f"{case.id}: output lacks {words!r}:\n{out[-3000:]}"
    if case.check is not None:
        case.check(tmp, out)
    return out


@contextlib.contextmanager
def read_only_mount(tmp: Path, content: Path | None = None):
    """A tmpfs at tmp/ro holding a copy of `content` (a file, when given), remounted read-only."""
    import pytest

    mnt = tmp / "ro"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(mnt)], capture_output=True).returncode != 0:
        pytest.skip("needs mount(8) (root with CAP_SYS_ADMIN) to make a read-only filesystem")
    try:
        if content is not None:
            shutil.copy(content, mnt / content.name)
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)

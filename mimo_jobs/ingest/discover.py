"""Which files an ingest reads, of which kind, and the run dir each belongs to."""

from __future__ import annotations

import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from mimo_jobs.contract.rundir import RUN_YAML, RunDir
from mimo_jobs.errors import MimoJobsError

LOG_SUFFIXES = (".out", ".err", ".log", ".txt")


class IngestError(MimoJobsError, ValueError):
    """Bad ingest input (missing path, unreadable run.yaml): raised before anything is written."""


@dataclass
class Target:
    path: Path
    kind: str  # metrics | log | sacct | memory
    run_dir: Path | None  # the run dir (run.yaml inside) it belongs to; None: a loose log
    src: str = ""  # the resolved path (the file's key in the store), set by discover: resolving costs lstats


def kind_of(path: Path) -> str | None:
    """metrics (a .jsonl), sacct (a dump: "sacct" in its name), log, or None (not ingested)."""
    n = path.name
    if n.endswith(".jsonl"):
        return "metrics"
    if "sacct" in n:
        return "sacct"
    if n.endswith(LOG_SUFFIXES):
        return "log"
    return None


def run_dir_of(path: Path) -> Path | None:
    """The run dir a file lies in (the nearest of its parents with a run.yaml), or None."""
    for d in [path if path.is_dir() else path.parent, *path.resolve().parents][:10]:
        if RunDir(d).run_yaml.is_file():
            return d
    return None


def _files_of(root: Path, run_dir: Path | None) -> list[Target]:
    """The ingestable files under `root`, in path order."""
    out = []
    for p in sorted(root.rglob("*")):
        k = kind_of(p) if p.is_file() else None
        if k:
            out.append(Target(p, k, run_dir))
    return out


def _run_dir_targets(rd: Path) -> list[Target]:
    """A run dir's metrics.jsonl, then everything ingestable under its logs/."""
    out = []
    m = RunDir(rd).metrics
    if m.is_file():
        out.append(Target(m, "metrics", rd))
    logs = RunDir(rd).logs
    if logs.is_dir():
        out += _files_of(logs, rd)
    mem = rd / "memory"
    if mem.is_dir():  # per-rank memory facts: stored per run (ingest/memory.py), not read line by line
        out += [Target(p, "memory", rd) for p in sorted(mem.glob("rank-*.json")) if p.is_file()]
    return out


def _targets_of(p: Path) -> list[Target]:
    if not p.is_dir():
        return [Target(p, kind_of(p) or "log", run_dir_of(p))]
    if RunDir(p).run_yaml.is_file():
        return _run_dir_targets(p)
    run_dirs = sorted({y.parent for y in p.rglob(RUN_YAML)})
    if not run_dirs:  # a tree of loose logs
        return _files_of(p, None)
    return [t for rd in run_dirs for t in _run_dir_targets(rd)]


_SPECIAL = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _refuse_special(p: Path) -> None:
    """Only regular files are logs: a FIFO would block the read forever, /dev/zero never ends (and reads as
    an empty log), a socket cannot be read. Named files are refused; inside a directory they are skipped."""
    mode = p.stat().st_mode
    if stat.S_ISREG(mode):
        return
    what = next((name for test, name in _SPECIAL if test(mode)), "not a regular file")
    raise IngestError(f"{p}: not a log file ({what}); give regular files or directories")


def check_paths(paths: Iterable[Path]) -> None:
    """What the command line names must exist and be directories or regular files (checked before the
    store is opened, so a typo leaves nothing behind)."""
    missing = [str(p) for p in paths if not Path(p).exists()]
    if missing:
        raise IngestError(f"no such file or directory: {', '.join(missing)}")
    for p in map(Path, paths):
        if not p.is_dir():
            _refuse_special(p)


def discover(paths: Iterable[Path]) -> list[Target]:
    """Files to read: run dirs (run.yaml inside), trees of run dirs, or single log/jsonl/sacct files; each
    file once (by resolved path), in the order given."""
    paths = list(paths)
    check_paths(paths)
    seen: set[str] = set()
    uniq = []
    for p in map(Path, paths):
        for t in _targets_of(p):
            t.src = str(t.path.resolve())
            if t.src not in seen:
                seen.add(t.src)
                uniq.append(t)
    return uniq

"""What can be wrong with a store file, told apart, each in one line a person can act on.

DuckDB reports every failure to open or read a file as an `IOException` (or, deeper in a damaged file, a
`SerializationException` / `InternalException`); its message says which. `explain` is the one place that
reads those messages: only a held lock is worth waiting for, every other cause is final.

A write the filesystem refused for want of room (ENOSPC, EDQUOT) or past the process's file-size limit
(EFBIG) damaged nothing: the errno decides, whether it comes as an OSError or as DuckDB's message (which
carries the operating system's own text for it), and also when DuckDB's later "transaction is aborted" or
"failed to rollback" is what reached the caller (the cause is then earlier in the exception's chain).
"""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

from mimo_jobs.errors import MimoJobsError


class StoreError(MimoJobsError):
    """Something about the store file itself stops the command; nothing in it was changed. Exit 1 when the
    file is fine but unusable now (locked, read-only) or damaged; 2 when --db names the wrong thing."""

    exit_code = 1


class NoStore(StoreError, FileNotFoundError):
    """A command that only reads found no store file."""

    exit_code = 2


class StoreLocked(StoreError, RuntimeError):
    """Another process kept the store's write lock for longer than this one waited."""


class NotAStore(StoreError):
    """The path holds something that is not a DuckDB database (a text file, a directory)."""

    exit_code = 2


class StoreCorrupt(StoreError):
    """A DuckDB file that cannot be read to its end (cut short, overwritten in the middle)."""


class StoreReadOnly(StoreError):
    """A writer cannot write the file or its directory (read-only filesystem, permissions)."""


class StoreFull(StoreError):
    """The store's filesystem ran out of space, or the store reached the process's file-size limit, while a
    command wrote to it."""


class StoreTooNew(StoreError):
    """The store was written by a newer mimo-jobs (a newer schema this version does not know)."""

    exit_code = 2


_LOCK_PID = re.compile(r"\(PID (\d+)\)")


def lock_holder(exc: BaseException) -> str | None:
    """The PID DuckDB names as holding the lock, when the error is a lock conflict."""
    msg = str(exc)
    if "Could not set lock" not in msg and "Conflicting lock" not in msg:
        return None
    m = _LOCK_PID.search(msg)
    return m.group(1) if m else "another process"


def is_lock(exc: BaseException) -> bool:
    return lock_holder(exc) is not None


# errno -> (the kind, what it means for the store, what to do about it)
_ROOM = "free space, or pass --db with a store on another filesystem"
_FULL = {
    errno.ENOSPC: ("disk full", "no space left where the store is", _ROOM),
    errno.EDQUOT: ("disk full", "no space left where the store is (quota)", _ROOM),
    errno.EFBIG: (
        "file size limit",
        "the store reached this process's limit on a file's size",
        "raise the limit (ulimit -f), or pass --db with a store where larger files are allowed",
    ),
}


def out_of_room(code: int, what: str, todo: str | None = None) -> str:
    """The message for a write refused with `code` (one of full_errno's) while writing `what`."""
    kind, _, default = _FULL[code]
    return (
        f"{kind} ({os.strerror(code)}) while {what}; what it was writing was not kept and the store holds "
        f"what it held before: {todo or default}"
    )


def _chain(exc: BaseException):
    """The exception and what it was raised from or while handling, outermost first."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def full_errno(exc: BaseException) -> int | None:
    """ENOSPC, EDQUOT or EFBIG when a write was refused for want of room or past the file-size limit,
    anywhere in the exception's chain: an OSError's errno, or the operating system's text for it in a
    DuckDB message."""
    for e in _chain(exc):
        if isinstance(e, OSError) and e.errno in _FULL:
            return e.errno
        msg = str(e)
        for code in _FULL:
            if os.strerror(code) in msg:
                return code
        if "not enough space" in msg:  # DuckDB's own words when it checks the free space itself
            return errno.ENOSPC
    return None


def explain(exc: BaseException, path: Path | str) -> StoreError:
    """The StoreError a DuckDB failure on `path` means."""
    msg = str(exc)
    where = str(path)
    holder = lock_holder(exc)
    if holder is not None:
        return StoreLocked(f"the store is locked by {_pid(holder)} (another mimo-jobs command)", where)
    if "not a valid DuckDB database" in msg or "Is a directory" in msg:
        return NotAStore(
            "this is not a mimo-jobs store (not a DuckDB database file); pass --db with a store path",
            where,
        )
    code = full_errno(exc)
    if code is not None:
        kind, what, todo = _FULL[code]
        what = f"{kind}: {what}"
        return StoreFull(
            f"{what} ({os.strerror(code)}); what this command was writing was not kept and the store holds "
            f"what it held before: {todo}",
            where,
        )
    if "Read-only file system" in msg or "Permission denied" in msg or "read-only" in msg.lower():
        return StoreReadOnly(
            "cannot write the store here (read-only filesystem or no permission); "
            "pass --db with a writable path",
            where,
        )
    return StoreCorrupt(
        f"the store file is damaged ({_first_line(msg)}); restore it from a copy or re-ingest the "
        "run directories into a new --db",
        where,
    )


def _pid(holder: str) -> str:
    return f"PID {holder}" if holder.isdigit() else holder


def _first_line(msg: str) -> str:
    line = msg.strip().splitlines()[0] if msg.strip() else "unreadable"
    return line.removeprefix("IO Error: ")[:200]

"""Timestamps in log text, and the text form the store is given."""

from __future__ import annotations

import re
from datetime import datetime

_ISO_RE = re.compile(r"(\d{4})-(\d{2})-(\d{2})[ T_](\d{2}):(\d{2}):(\d{2})(?:[.,](\d{1,6}))?")
_GLOG_RE = re.compile(r"\[[EWIF](\d{2})(\d{2}) (\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,6}))?")


def make_time(y, mo, d, h, mi, s, frac) -> datetime | None:
    """A datetime from the text groups of a timestamp (`frac`: up to 6 fraction digits, or None); None when
    there is no such calendar time."""
    try:
        us = int(frac.ljust(6, "0")) if frac else 0
        return datetime(int(y), int(mo), int(d), int(h), int(mi), int(s), us)
    except ValueError:
        return None


def find_time(text: str, year_hint: int | None = None) -> datetime | None:
    """First timestamp in a line: ISO-like (Megatron, SLURM, Python logging) or glog `[E0406 03:04:12.1`
    (NCCL watchdog lines carry no year: `year_hint` supplies it)."""
    m = _ISO_RE.search(text)
    if m:
        return make_time(*m.groups())
    if year_hint:
        m = _GLOG_RE.search(text)
        if m:
            return make_time(year_hint, *m.groups())
    return None


def store_text(t: datetime | None) -> str | None:
    """A time as staged rows carry it (None stays None)."""
    return t.isoformat(sep=" ") if t else None

"""SLURM time limits: the formats `sbatch --time` accepts, read into seconds, every field in range.

sbatch(1): "minutes", "minutes:seconds", "hours:minutes:seconds", "days-hours", "days-hours:minutes" and
"days-hours:minutes:seconds". Minutes and seconds are below 60 wherever a larger unit precedes them, hours
below 24 after days; a limit beyond a year is refused (no cluster grants one; a typo is likelier).
"""

from __future__ import annotations

import re

MAX_SECONDS = 365 * 24 * 3600
FORMATS = "minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS"
_RE = re.compile(r"^(?:(\d{1,3})-)?(\d{1,6})(?::(\d{1,2}))?(?::(\d{1,2}))?\Z")


def seconds(text: str) -> int:
    """The limit in seconds; ValueError naming the rule a malformed or out-of-range limit breaks."""
    m = _RE.match(str(text).strip())
    if not m:
        raise ValueError(f"{text!r} is not a SLURM time ({FORMATS})")
    days, first, second, third = m.groups()
    if days is not None:  # D-HH[:MM[:SS]]
        h, mi, s = int(first), int(second or 0), int(third or 0)
        _below(text, ("hours", h, 24), ("minutes", mi, 60), ("seconds", s, 60))
        total = ((int(days) * 24 + h) * 60 + mi) * 60 + s
    elif third is not None:  # HH:MM:SS
        _below(text, ("minutes", int(second), 60), ("seconds", int(third), 60))
        total = (int(first) * 60 + int(second)) * 60 + int(third)
    elif second is not None:  # MM:SS
        _below(text, ("seconds", int(second), 60))
        total = int(first) * 60 + int(second)
    else:  # minutes
        total = int(first) * 60
    if total <= 0:
        raise ValueError(f"{text!r}: a time limit must be positive")
    if total > MAX_SECONDS:
        raise ValueError(f"{text!r} is more than 365 days")
    return total


def _below(text: str, *fields: tuple[str, int, int]) -> None:
    for name, value, limit in fields:
        if value >= limit:
            raise ValueError(f"{text!r}: {name} {value} must be below {limit} ({FORMATS})")

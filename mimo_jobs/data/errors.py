"""Data errors that name where the problem is (dataset, shard, sample key) and what would fit."""

from __future__ import annotations

from mimo_jobs.errors import MimoJobsError


class DataError(MimoJobsError, ValueError):
    """Bad data or a bad data setting. `where` names the dataset/shard/sample; the message says the rule.

    Single-string constructor on purpose: torch's DataLoader re-raises worker exceptions as
    `type(exc)(message)`, so the class and the full message survive a worker process."""


def describe(key: str | None, shard: str | None, dataset: str | None = None) -> str:
    parts = []
    if dataset:
        parts.append(f"dataset {dataset}")
    if shard:
        parts.append(f"shard {shard}")
    parts.append(f"sample {key!r}" if key else "sample <unknown key>")
    return ", ".join(parts)

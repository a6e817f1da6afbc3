"""What every model description shares: the error that names a field, and the checks of its fields (used
by arch.py's architectures and audio_arch.py's)."""

from __future__ import annotations

from dataclasses import MISSING, fields

from mimo_jobs.errors import MimoJobsError


class ArchError(MimoJobsError, ValueError):
    """A model description that cannot be built; `field` is its dotted path inside trainer.model (callers
    prefix it with where the description sits)."""

    def __init__(self, field: str, msg: str):
        super().__init__(msg, where=field or None)
        self.field = field

    def under(self, prefix: str) -> ArchError:
        """The same error with its field placed under `prefix` (e.g. "trainer.model.llm")."""
        return ArchError(f"{prefix}.{self.field}" if self.field else prefix, str(self))


def check_choice(field: str, value, choices) -> None:
    if value not in choices:
        raise ArchError(field, f"{value!r} is not one of {', '.join(map(str, choices))}")


def check_positive(obj, names) -> None:
    for n in names:
        v = getattr(obj, n)
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise ArchError(n, f"must be a positive integer, got {v!r}")


def check_finite_positive(obj, names) -> None:
    """Float fields a model cannot run without: finite and above 0 (a NaN epsilon or a negative rotary base
    would make every iteration NaN, found only after the job ran)."""
    import math

    for n in names:
        v = getattr(obj, n)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise ArchError(n, f"must be a finite number above 0, got {v!r}")


def known_fields(cls, d: dict, where: str) -> dict:
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(d) - names)
    if unknown:
        raise ArchError(unknown[0], f"unknown {where} field; known: {', '.join(sorted(names))}")
    required = [f.name for f in fields(cls) if f.default is MISSING and f.name not in d]
    if required:
        raise ArchError(required[0], f"missing (a required {where} field)")
    return d

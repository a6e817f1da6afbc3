"""The model families by name (a family's name is its description's `kind`): filled by each family module's
`@register` (model/families/base.py) when the families package loads, which importing mimo_jobs.model does
first (model/__init__.py), so every description sees every family.

It imports nothing: the descriptions (arch.py, audio_arch.py), which the families import, ask it for their
kinds and their family's rules without importing the families back.
"""

from __future__ import annotations

REGISTRY: dict = {}  # name -> its family (a model/families/base.py Family)


def kinds(modality: str) -> tuple[str, ...]:
    """The names of the families of one modality ("image", "audio", "text"), in the order they registered."""
    return tuple(n for n, f in REGISTRY.items() if f.modality == modality)


def family(kind: str):
    """The family called `kind` (a description checks its kind when it is made, so it has one)."""
    return REGISTRY[kind]

"""The stack the trainer is written against, checked before megatron-core is imported.

The trainer uses megatron-core 0.19's modules and process-group arguments (and its CPU shims name 0.19's call
sites): another release fails deep inside model construction or, worse, trains differently. So
`python -m mimo_jobs.trainer` refuses it first, in one line that says what to install.
"""

from __future__ import annotations

import sys
from importlib import metadata

MEGATRON_CORE = "0.19"  # the release line (pyproject's train extra pins its patch release)
PYTHON = (3, 12)  # what megatron-core 0.19 itself requires


def installed_megatron_core() -> str | None:
    try:
        return metadata.version("megatron-core")
    except metadata.PackageNotFoundError:
        return None


def stack_problem(python: tuple[int, int] | None = None, megatron: str | None = "") -> str | None:
    """None when this Python and megatron-core are the ones the trainer needs, else what to do."""
    python = python or sys.version_info[:2]
    megatron = installed_megatron_core() if megatron == "" else megatron
    fix = (
        "install the trainer with `bash install.sh` (a .venv on Python >= 3.12) or pip install -e '.[train]'"
    )
    if python < PYTHON:
        return f"the trainer needs Python >= {PYTHON[0]}.{PYTHON[1]} (megatron-core {MEGATRON_CORE}), this is {python[0]}.{python[1]}: {fix}"
    if megatron is None:
        return f"megatron-core is not installed: {fix}"
    if megatron.split(".")[:2] != MEGATRON_CORE.split("."):
        return f"megatron-core {megatron} is installed, the trainer needs {MEGATRON_CORE}.x: {fix}"
    return None

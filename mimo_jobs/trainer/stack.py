"""The stack the trainer is written against, checked before megatron-core is imported.

The trainer uses megatron-core 0.19's modules and process-group arguments (and its CPU shims name 0.19's call
sites): another release fails deep inside model construction or, worse, trains differently. So
`python -m mimo_jobs.trainer` refuses it first, in one line that says what to install. The release comes
from the package's own `train` requirement (pyproject.toml), the one place it is pinned.
"""

from __future__ import annotations

import re
import sys
from importlib import metadata

PYTHON = (3, 12)  # megatron-core 0.19's own Requires-Python (known before megatron-core is installed)
FIX = "install the trainer with `bash install.sh` (a .venv on Python >= 3.12) or pip install -e '.[train]'"


def required_megatron_core() -> str | None:
    """The release line (major.minor) mimo-jobs' `train` extra pins, None when the metadata is not there."""
    try:
        reqs = metadata.requires("mimo-jobs") or []
    except metadata.PackageNotFoundError:
        return None
    for r in reqs:
        m = re.match(r"megatron-core\s*==\s*(\d+)\.(\d+)", r)
        if m:
            return f"{m.group(1)}.{m.group(2)}"
    return None


def installed_megatron_core() -> str | None:
    try:
        return metadata.version("megatron-core")
    except metadata.PackageNotFoundError:
        return None


def stack_problem(
    python: tuple[int, int] | None = None, megatron: str | None = "", required: str | None = ""
) -> str | None:
    """None when this Python and megatron-core are the ones the trainer needs, else what to do."""
    python = python or sys.version_info[:2]
    megatron = installed_megatron_core() if megatron == "" else megatron
    required = required_megatron_core() if required == "" else required
    if python < PYTHON:
        need = f"megatron-core {required}" if required else "megatron-core"
        return f"the trainer needs Python >= {PYTHON[0]}.{PYTHON[1]} ({need}), this is {python[0]}.{python[1]}: {FIX}"
    if megatron is None:
        return f"megatron-core is not installed: {FIX}"
    if required and megatron.split(".")[:2] != required.split("."):
        return f"megatron-core {megatron} is installed, the trainer needs {required}.x: {FIX}"
    return None

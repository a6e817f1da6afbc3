"""The stack the trainer is written against, checked before megatron-core is imported (and, for Transformer
Engine, which megatron-core imports whenever it is installed, when that import fails).

The trainer uses megatron-core 0.19's modules and process-group arguments (and its CPU shims name 0.19's call
sites): another release fails deep inside model construction or, worse, trains differently. So
`python -m mimo_jobs.trainer` refuses it first, in one line that says what to install. The release comes
from the package's own `train` requirement (pyproject.toml), the one place it is pinned.
"""

from __future__ import annotations

import re
import sys
from importlib import metadata
from pathlib import Path

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


# Transformer Engine's distributions: its loader (transformer_engine/common/__init__.py) refuses a core or torch
# extension of another version than the Python package
TE_DISTRIBUTIONS = (
    "transformer-engine",
    "transformer-engine-cu12",
    "transformer-engine-cu13",
    "transformer-engine-torch",
)
TE_FIX = (
    "megatron-core imports Transformer Engine whenever it is installed; install its distributions together at one "
    "version (megatron-core 0.19 was developed against 2.18), or uninstall them all to train on megatron-core's "
    "local layers"
)


def te_versions() -> dict[str, str]:
    """The installed Transformer Engine distributions and their versions."""
    out = {}
    for d in TE_DISTRIBUTIONS:
        try:
            out[d] = metadata.version(d)
        except metadata.PackageNotFoundError:
            pass
    return out


def _from_transformer_engine(exc: BaseException) -> bool:
    """The failure was raised inside the transformer_engine package (a frame in its files), or is an import
    of one of its modules that failed."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, ImportError) and (e.name or "").split(".")[0] == "transformer_engine":
            return True
        tb = e.__traceback__
        while tb is not None:
            if "transformer_engine" in Path(tb.tb_frame.f_code.co_filename).parts[:-1]:
                return True
            tb = tb.tb_next
        e = e.__cause__ or e.__context__
    return False


def te_import_problem(exc: BaseException, versions: dict[str, str] | None = None) -> str | None:
    """What to say when importing the trainer (megatron-core) failed because Transformer Engine is installed
    but does not load (an extension built for another torch, the distributions at different versions, a
    missing CUDA library); None when the failure is not Transformer Engine's."""
    if not _from_transformer_engine(exc):
        return None
    versions = te_versions() if versions is None else versions
    have = ", ".join(f"{d} {v}" for d, v in versions.items()) or "no distribution metadata found"
    one = len(set(versions.values())) <= 1
    mismatch = "" if one else " (not one version)"
    err = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    return (
        f"Transformer Engine is installed but does not import ({err}); installed: {have}{mismatch}. {TE_FIX}"
    )

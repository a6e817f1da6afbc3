"""CPU or GPU: decided from run.yaml before torch is imported, so a CPU run never touches CUDA.

A CPU run on a machine where CUDA is visible would otherwise get megatron-core buffers on cuda:0 next to a
CPU model. `cpu_environ` hides CUDA (and turns off torch.compile, whose cold start on the CPU fused cross
entropy costs ~16 s) through environment variables that torch reads when it is imported; `prepare` applies
them for `python -m mimo_jobs.trainer` (the CPU launch.sh exports the same CUDA_VISIBLE_DEVICES).
This module imports no torch.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping, Sequence
from pathlib import Path

CPU = "cpu"


def runs_on_cpu(accelerator: str, cuda_available: bool) -> bool:
    """The run's device rule: CPU when run.yaml asks for it or when there is no CUDA (a GPU run.yaml's
    reference run on a CPU machine)."""
    return accelerator == CPU or not cuda_available


def cpu_environ(accelerator: str, environ: MutableMapping[str, str]) -> dict[str, str]:
    """The environment a run needs before torch is imported (empty for a GPU run). An explicit
    TORCHDYNAMO_DISABLE is kept; CUDA is always hidden."""
    if accelerator != CPU:
        return {}
    return {"CUDA_VISIBLE_DEVICES": "", "TORCHDYNAMO_DISABLE": environ.get("TORCHDYNAMO_DISABLE", "1")}


def _accelerator(argv: Sequence[str]) -> str | None:
    """cluster.accelerator of the run.yaml named first on the command line; None when it cannot be read
    (the trainer's preflight then says why, with torch imported or not)."""
    from mimo_jobs.study.runspec import load_run_yaml

    path = next((a for a in argv if not a.startswith("-")), None)
    if path is None or not Path(path).is_file():
        return None
    try:
        run, _ = load_run_yaml(path)
    except Exception:  # noqa: BLE001 - any unreadable run.yaml is reported by preflight
        return None
    return run.cluster.accelerator


def prepare(argv: Sequence[str], environ: MutableMapping[str, str] = os.environ) -> dict[str, str]:
    """Apply cpu_environ for the run.yaml in argv; returns what was set."""
    acc = _accelerator(argv)
    env = cpu_environ(acc, environ) if acc is not None else {}
    environ.update(env)
    return env

"""Shared pieces of the container tests: paths, podman settings, and running a rendered sbatch.sh under a
recording srun (no SLURM here; tests/slurm covers the real cluster)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from helpers import REPO

HERE = REPO / "tests" / "container"
DOCKERFILE = REPO / "Dockerfile"
BUILD_SCRIPT = HERE / "build_image.sh"
PYXIS_SRUN = HERE / "pyxis_srun.sh"
CONTAINERS_CONF = HERE / "containers.conf"

# srun that records its argv (NUL-separated) and does nothing else; scontrol that names the allocation's hosts.
RECORD_SRUN = """#!/bin/bash
printf '%s\\0' "$@" > "$STUB_OUT/srun.argv"
"""
SCONTROL = """#!/bin/bash
[[ "$1 $2" == "show hostnames" ]] || exit 3
echo "${STUB_HOSTS:-localhost}"
"""


def write_stubs(bin_dir: Path, srun: str | Path = RECORD_SRUN) -> None:
    """srun (text, or a script to link) and scontrol on a PATH directory of their own."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    target = bin_dir / "srun"
    if isinstance(srun, Path):
        target.symlink_to(srun)
    else:
        target.write_text(srun)
        target.chmod(0o755)
    (bin_dir / "scontrol").write_text(SCONTROL)
    (bin_dir / "scontrol").chmod(0o755)


def slurm_env(bin_dir: Path, out: Path, job_id: int = 4242, nodes: int = 1, **extra) -> dict[str, str]:
    """A from-scratch batch environment (nothing from the machine's own SLURM_*/MASTER_* leaks in)."""
    env = {
        "PATH": f"{bin_dir}:/usr/local/bin:/usr/bin:/bin",
        "HOME": str(out),
        "STUB_OUT": str(out),
        "LANG": "C.UTF-8",
        "SLURM_JOB_ID": str(job_id),
        "SLURM_JOB_NODELIST": "localhost",
        "SLURM_JOB_NUM_NODES": str(nodes),
    }
    env.update({k: str(v) for k, v in extra.items()})
    return env


def srun_argv(sbatch_sh: Path, tmp: Path) -> list[str]:
    """Run the rendered batch script for real (bash) under the recording srun; return srun's argv."""
    bin_dir, out = tmp / "bin", tmp / "out"
    out.mkdir(parents=True, exist_ok=True)
    write_stubs(bin_dir)
    p = subprocess.run(
        ["bash", str(sbatch_sh)],
        env=slurm_env(bin_dir, out),
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    return (out / "srun.argv").read_bytes().decode().split("\0")[:-1]


def podman_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("CONTAINERS_CONF", str(CONTAINERS_CONF))
    return env


def python_exe() -> str:
    return sys.executable

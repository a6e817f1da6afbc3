"""The real local SLURM cluster for tests marked `slurm`: started once per session through
tests/slurm/cluster.sh (installs what is missing; idempotent) and stopped at the end, by its PID files.
MIMO_SLURM_KEEP=1 leaves it running for the next session (faster local iteration)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
CLUSTER = HERE / "cluster.sh"


@pytest.fixture(scope="session")
def slurm_cluster():
    if os.geteuid() != 0:
        pytest.skip("the local SLURM cluster needs root (tests/slurm/cluster.sh installs and starts daemons)")
    p = subprocess.run(
        ["bash", str(CLUSTER), "start"], check=False, capture_output=True, text=True, timeout=900
    )
    if p.returncode != 0:
        pytest.fail(f"tests/slurm/cluster.sh start failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    yield {"nodes": 4, "gpus_per_node": 2, "partition": "debug"}
    if os.environ.get("MIMO_SLURM_KEEP") != "1":
        subprocess.run(
            ["bash", str(CLUSTER), "stop"], check=False, capture_output=True, text=True, timeout=300
        )

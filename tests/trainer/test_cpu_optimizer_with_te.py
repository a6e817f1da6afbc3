"""A CPU run trains with torch's AdamW even where Transformer Engine is installed (cpu_optimizer_worker.py):
megatron-core would otherwise build TE's FusedAdam, which needs a CUDA driver."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

from helpers.launch import worker_env

HERE = Path(__file__).parent


def test_a_cpu_run_builds_torch_adamw_where_te_would_give_fused_adam():
    r = subprocess.run(
        [sys.executable, str(HERE / "cpu_optimizer_worker.py")],
        capture_output=True,
        text=True,
        timeout=600,
        env=worker_env(),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert "error" not in out, out["error"]
    assert out["optimizers"] == ["AdamW"]
    assert all(math.isfinite(x) for x in out["loss"])

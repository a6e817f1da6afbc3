"""Activation recompute per module: a real heterogeneous run (torchrun, CPU/gloo, fp32) whose encoder
recomputes every layer while its LLM does not gives the same losses and gradient norms as the same run
without recompute, and the memory facts each rank writes show the trade on the encoder rank only: its
saved-activation peak drops, the LLM ranks' stays what it was."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers.trainer import make_run_yaml

RTOL = 1e-5  # the parity tolerance of the trainer's other exactness tests (fp32 on CPU)
FAN_OUT = {"gpn": 3, "enc": {"dp": 1}, "llm": {"dp": 2}}  # rank 0: encoder; ranks 1, 2: LLM


def _run(shared_runs, tmp_path: Path, name: str, trainer: dict) -> tuple[list[dict], dict[int, dict]]:
    ry = make_run_yaml(tmp_path / name, gbs=8, trainer=trainer, **FAN_OUT)
    run = shared_runs.world(ry, 3).ok(name)
    facts = {
        f["rank"]: f
        for f in (json.loads(p.read_text()) for p in sorted((run.run_dir / "memory").glob("rank-*.json")))
    }
    return run.iterations(), facts


@pytest.mark.slow  # two 3-process torchrun jobs: CI runs it, the fast local default does not
def test_encoder_recomputes_llm_does_not(shared_runs, tmp_path):
    plain, plain_facts = _run(shared_runs, tmp_path, "plain", {})
    mixed, mixed_facts = _run(
        shared_runs, tmp_path, "mixed", {"recompute": {"encoder": "full", "llm": "none"}}
    )
    assert len(plain) == len(mixed) == 3
    for a, b in zip(plain, mixed):
        assert b["loss"] == pytest.approx(a["loss"], rel=RTOL), (a, b)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=RTOL), (a, b)
    assert sorted(mixed_facts) == [0, 1, 2] and set(mixed_facts[0]["modules"]) == {"encoder"}
    peak = {
        r: (plain_facts[r]["saved_activation_peak_bytes"], f["saved_activation_peak_bytes"])
        for r, f in mixed_facts.items()
    }
    # full recompute keeps each encoder layer's input only
    assert 0 < peak[0][1] < peak[0][0], peak
    # the LLM ranks build the same graphs as without recompute: the same bytes saved for backward
    assert peak[1][1] == peak[1][0] > 0 and peak[2][1] == peak[2][0] > 0, peak

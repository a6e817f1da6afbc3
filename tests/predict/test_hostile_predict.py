"""Hostile input to `plan` and `predict`: a node count past the study's bound, cluster.hardware figures too
small to price anything, figures on a CPU study, a study of 10,000 runs. Each case runs the real CLI in its
own process within a time bound (tests/helpers/hostile.py); one line per case."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from helpers import STUDIES
from helpers.hostile import Case, run_case

PROD, CPU = (STUDIES / "scale_33n_68n_100n.yaml").read_text(), (STUDIES / "cpu_local.yaml").read_text()


def hardware(text: str, figures: str) -> str:
    return text.replace("cluster:\n", f"cluster:\n  hardware: {{{figures}}}\n", 1)


def many_runs(points: int = 100, repeats: int = 100) -> str:
    rows = "\n".join(f"    - {{nodes: {n}, gbs: {(n - 1) * 8 * 4}}}" for n in range(2, points + 2))
    return (
        "name: big\ncluster: {executor: slurm, gpus_per_node: 8}\ntrainer: {model: tiny, train_iters: 10}\n"
        f"matrix:\n  defaults: {{encoder: {{dp: 8}}, repeats: {repeats}}}\n  points:\n{rows}\n"
    )


def finite_json(tmp: Path, out: str) -> None:
    """Every number of the JSON is finite (json.loads would take NaN and Infinity)."""

    def walk(o):
        if isinstance(o, float):
            assert math.isfinite(o), out[:2000]
        for v in o.values() if isinstance(o, dict) else o if isinstance(o, list) else []:
            walk(v)

    walk(json.loads(out))


def cpu_priced_on(peak: float):
    def check(tmp: Path, out: str) -> None:
        doc = json.loads(out)
        flops = doc["runs"][0]["flops_per_iteration"]
        seconds = doc["runs"][0]["parts_s"]
        assert doc["gpu"] == "cpu" and seconds, doc
        # the compute of a step cannot be faster than the study's peak allows
        assert doc["runs"][0]["iteration_s"] >= (flops["encoder"] + flops["llm"]) / (4 * peak * 1e12) * 0.5

    return check


S = "{tmp}/s.yaml"
PLAN = ["plan", "--from", S]
# fmt: off
CASES = [
    Case("plan-nodes-int-max", [*PLAN, "--nodes", "2147483647"], 2, ("between 1 and 100,000",),
         files={"s.yaml": PROD}, timeout_s=10),
    Case("plan-nodes-10e12", [*PLAN, "--nodes", "1000000000000"], 2, ("between 1 and 100,000",),
         files={"s.yaml": PROD}, timeout_s=10),
    Case("plan-nodes-at-the-bound", [*PLAN, "--nodes", "100000", "--json"], 0, ('"nodes": 100000',),
         files={"s.yaml": PROD}, timeout_s=10),
    Case("predict-peak-5e-324", ["predict", S, "--json"], 2, ("peak_tflops",),
         files={"s.yaml": hardware(PROD, "peak_tflops: 5.0e-324")}),
    Case("predict-ib-1e-300", ["predict", S, "--json"], 2, ("ib_gbps",),
         files={"s.yaml": hardware(PROD, "ib_gbps: 1.0e-300")}),
    Case("predict-memory-1e-300", ["predict", S, "--json"], 2, ("memory_gib",),
         files={"s.yaml": hardware(PROD, "memory_gib: 1.0e-300")}),
    Case("predict-lowest-figures", ["predict", S, "--json"], 0, (),
         files={"s.yaml": hardware(PROD, "peak_tflops: 0.0001, nvlink_gbps: 0.001, ib_gbps: 0.001, memory_gib: 0.001")},
         check=finite_json),
    Case("plan-lowest-figures", [*PLAN, "--nodes", "33", "--json"], 0, (),
         files={"s.yaml": hardware(PROD, "peak_tflops: 0.0001, nvlink_gbps: 0.001, ib_gbps: 0.001")},
         check=finite_json),
    Case("predict-cpu-study-honours-hardware", ["predict", S, "--json"], 0, ('"gpu": "cpu"',),
         files={"s.yaml": hardware(CPU, "peak_tflops: 0.0001")}, check=cpu_priced_on(0.0001)),
    Case("predict-10000-runs", ["predict", S], 0, ("... and 9,950 more run(s)",),
         files={"s.yaml": many_runs()}, timeout_s=30),
]
# fmt: on


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_predict(case: Case, tmp_path: Path) -> None:
    run_case(case, tmp_path)

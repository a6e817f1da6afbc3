"""The trainer's CPU step time under two Python environments (two stacks: say megatron-core 0.16.1 on Python
3.11 and 0.19.2 on Python 3.12), on the packaged demo study's layouts. Prints figures; asserts nothing.

    python benchmarks/stack_cpu.py --python OLD_ENV/bin/python --python NEW_ENV/bin/python [--iters 12]

Each environment runs its own installed mimo_jobs (an editable install of its checkout), on the same
run.yaml files rendered here from studies/cpu_local.yaml, under torchrun with gloo. The environments take turns
layout by layout, `--rounds` times, so drift in the machine's load reaches both alike; the figure per layout is
the median iteration time (elapsed_ms of the metrics' iteration records, the first two of each run left out as
warm-up), and the ratio is the second environment's over the first's.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from mimo_jobs.study.expand import runs_of
from mimo_jobs.study.load import load_study
from mimo_jobs.study.runspec import run_yaml_doc

ROOT = Path(__file__).resolve().parents[1]
STUDY = ROOT / "studies" / "cpu_local.yaml"
WARMUP = 2


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _version(python: str) -> str:
    code = "import sys, megatron.core as m, torch; print(sys.version.split()[0], m.__version__, torch.__version__)"
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, cwd=tempfile.gettempdir())
    return out.stdout.strip() or out.stderr.strip().splitlines()[-1]


def _step_times(python: str, run_yaml: Path, nproc: int, iters: int, out: Path) -> list[float]:
    metrics = out / f"metrics-{abs(hash(python))}.jsonl"
    metrics.unlink(missing_ok=True)
    cmd = [
        python,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(nproc),
        "--master-addr",
        "127.0.0.1",
    ]
    cmd += [
        "--master-port",
        str(_port()),
        "-m",
        "mimo_jobs.trainer",
        str(run_yaml),
        "--metrics",
        str(metrics),
    ]
    cmd += ["--iters", str(iters), "--quiet"]
    env = {
        "TORCHDYNAMO_DISABLE": "1",
        "OMP_NUM_THREADS": "1",
        "PATH": str(Path(python).parent) + ":/usr/bin:/bin",
    }
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=out, env=env, timeout=1200)
    if p.returncode:
        raise SystemExit(f"{python} on {run_yaml}: exit {p.returncode}\n{p.stderr[-3000:]}")
    recs = [json.loads(x) for x in metrics.read_text().splitlines()]
    return [r["elapsed_ms"] / 1e3 for r in recs if r["kind"] == "iteration"][WARMUP:]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", action="append", required=True, help="an environment's python (twice)")
    ap.add_argument("--iters", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    if len(a.python) != 2:
        ap.error("give --python twice: the baseline environment, then the one measured against it")
    for py in a.python:
        print(f"{py}: Python, megatron-core, torch = {_version(py)}")
    runs = runs_of(load_study(STUDY, env={}))
    print(f"{'layout':34} {'first s/iter':>13} {'second s/iter':>14} {'second/first':>13}")
    ratios = []
    with tempfile.TemporaryDirectory() as tmp:
        for run in runs:
            d = Path(tmp) / run.name
            d.mkdir()
            run_yaml = d / "run.yaml"
            run_yaml.write_text(yaml.safe_dump(run_yaml_doc(run, d)))
            times: dict[str, list[float]] = {py: [] for py in a.python}
            for _ in range(a.rounds):
                for py in a.python:
                    times[py] += _step_times(py, run_yaml, run.layout.world, a.iters, d)
            first, second = (statistics.median(times[py]) for py in a.python)
            ratios.append(second / first)
            print(f"{run.name:34} {first:13.3f} {second:14.3f} {second / first:13.2f}")
    print(f"geometric mean of the ratios: {statistics.geometric_mean(ratios):.2f}")


if __name__ == "__main__":
    sys.exit(main())

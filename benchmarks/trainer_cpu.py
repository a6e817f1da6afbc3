"""CPU benchmark of the heterogeneous trainer: per-phase time shares, bridge overhead, hetero vs --reference
step time, peak RSS per rank. Prints figures; asserts nothing.

    python benchmarks/trainer_cpu.py [--iters 12] [--layout fanout|fanin|tp2|moe]

Runs the same run.yaml twice: one --reference process, then the real torchrun job (gloo), each with
MIMO_JOBS_TRAINER_PROFILE set so every rank reports its phase times (iterations after the first) and peak RSS.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from mimo_jobs.plan.expand import runs_of
from mimo_jobs.plan.load import parse_study
from mimo_jobs.plan.runspec import run_yaml_doc

ROOT = Path(__file__).resolve().parents[1]

LAYOUTS = {
    "fanout": {"gpn": 3, "enc": {"dp": 1}, "llm": {"dp": 2}, "mbs": 1, "gbs": 8, "model": "tiny"},
    "fanin": {"gpn": 3, "enc": {"dp": 2}, "llm": {"dp": 1}, "mbs": 2, "gbs": 8, "model": "tiny"},
    "tp2": {"gpn": 4, "enc": {"tp": 2}, "llm": {"tp": 2, "dp": 1}, "mbs": 1, "gbs": 8, "model": "tiny"},
    "moe": {"gpn": 3, "enc": {"dp": 1}, "llm": {"dp": 2, "ep": 2}, "mbs": 1, "gbs": 8, "model": "tiny-moe"},
}


def _run_yaml(d: Path, lay: dict, iters: int) -> Path:
    s = parse_study(
        {
            "name": "bench",
            "cluster": {"executor": "local", "gpus_per_node": lay["gpn"], "accelerator": "cpu"},
            "trainer": {
                "model": lay["model"],
                "seq_length": 64,
                "train_iters": iters,
                "lr": {"schedule": "constant", "max": 1e-3},
            },
            "matrix": {
                "points": [
                    {
                        "nodes": 1,
                        "encoder": lay["enc"],
                        "llm": lay["llm"],
                        "gbs": lay["gbs"],
                        "mbs": lay["mbs"],
                    }
                ]
            },
        }
    )
    run = runs_of(s)[0]
    d.mkdir(parents=True, exist_ok=True)
    (d / "run.yaml").write_text(yaml.safe_dump(run_yaml_doc(run, d)))
    return d / "run.yaml"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=12)
    ap.add_argument("--layout", choices=sorted(LAYOUTS), default="fanout")
    a = ap.parse_args()
    lay = LAYOUTS[a.layout]
    with tempfile.TemporaryDirectory() as td:
        td = Path(td)
        ry = _run_yaml(td / "run", lay, a.iters)
        prof = td / "prof"
        env = dict(
            os.environ,
            TORCHDYNAMO_DISABLE="1",
            PYTHONWARNINGS="ignore",
            OMP_NUM_THREADS="1",
            MIMO_JOBS_TRAINER_PROFILE=str(prof),
        )
        env.pop("WORLD_SIZE", None)
        for cmd in (
            [
                sys.executable,
                "-m",
                "mimo_jobs.trainer",
                str(ry),
                "--reference",
                "--quiet",
                "--metrics",
                str(td / "ref.jsonl"),
            ],
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nproc-per-node",
                str(lay["gpn"]),
                "--master-port",
                str(_port()),
                "-m",
                "mimo_jobs.trainer",
                str(ry),
                "--quiet",
                "--metrics",
                str(td / "het.jsonl"),
            ],
        ):
            p = subprocess.run(cmd, check=False, env=env, capture_output=True, text=True, cwd=ROOT)
            if p.returncode:
                sys.exit(f"failed: {' '.join(cmd)}\n{p.stderr[-4000:]}")
        ranks = sorted(
            (json.loads(f.read_text()) for f in prof.glob("*.json")), key=lambda r: (r["mode"], r["rank"])
        )

    print(
        f"trainer_cpu: layout {a.layout} ({lay}), {a.iters} iterations, figures over iterations 2..{a.iters}"
    )
    ref = next(r for r in ranks if r["mode"] == "reference")
    het = [r for r in ranks if r["mode"] == "hetero"]
    ref_step = ref["elapsed_s"] / ref["iterations"]
    het_step = max(r["elapsed_s"] / r["iterations"] for r in het)
    print(
        f"  step time: reference {ref_step * 1e3:.1f} ms (1 process) | hetero {het_step * 1e3:.1f} ms "
        f"({len(het)} ranks) | hetero/reference = {het_step / ref_step:.2f}"
    )
    print(
        "  per-phase share of the step (per rank; bridge_wait = time blocked in bridge receives, TP broadcasts "
        "and send completion, i.e. transfer plus waiting for the other module):"
    )
    for r in het + [ref]:
        tot = r["elapsed_s"]
        shares = " ".join(f"{k}={v / tot:6.1%}" for k, v in sorted(r["phases_s"].items()))
        other = 1 - sum(r["phases_s"].values()) / tot
        print(f"    {r['mode']:9s} rank {r['rank']} {'+'.join(r['modules']):17s} {shares} other={other:6.1%}")
    llm = [r for r in het if "language" in r["modules"]]
    enc = [r for r in het if "encoder" in r["modules"]]
    bw_llm = sum(r["phases_s"].get("bridge_wait", 0) / r["elapsed_s"] for r in llm) / len(llm)
    bw_enc = sum(r["phases_s"].get("bridge_wait", 0) / r["elapsed_s"] for r in enc) / len(enc)
    print(f"  bridge overhead (bridge_wait / step): LLM ranks {bw_llm:.1%}, encoder ranks {bw_enc:.1%}")
    print(
        "  peak RSS per rank (MB): "
        + ", ".join(f"{r['mode']}:{r['rank']}={r['peak_rss_mb']:.0f}" for r in het + [ref])
    )


if __name__ == "__main__":
    main()

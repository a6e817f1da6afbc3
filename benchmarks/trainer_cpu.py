"""CPU benchmark of the heterogeneous trainer: per-phase time shares, bridge overhead, hetero vs --reference
step time, peak RSS per rank. Prints figures; asserts nothing.

    python benchmarks/trainer_cpu.py [--iters 12] [--layout fanout|fanin|tp2|moe|pp2|colocated]
    python benchmarks/trainer_cpu.py --sweep-m [--layout fanout]   # step time and saved activations vs M

The M sweep runs the layout at 2, 4 and 8 microbatches (gbs scaled), each with the encoder's 1F1B schedule
(encoder_inflight 2) and with every microbatch in flight (encoder_inflight = M: the schedule before 1F1B),
and the reference; it prints step time and each rank's peak bytes of activations saved for backward.

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

from mimo_jobs.study.expand import runs_of
from mimo_jobs.study.load import parse_study
from mimo_jobs.study.runspec import run_yaml_doc

ROOT = Path(__file__).resolve().parents[1]

LAYOUTS = {
    "fanout": {"gpn": 3, "enc": {"dp": 1}, "llm": {"dp": 2}, "mbs": 1, "gbs": 8, "model": "tiny"},
    "fanin": {"gpn": 3, "enc": {"dp": 2}, "llm": {"dp": 1}, "mbs": 2, "gbs": 8, "model": "tiny"},
    "tp2": {"gpn": 4, "enc": {"tp": 2}, "llm": {"tp": 2, "dp": 1}, "mbs": 1, "gbs": 8, "model": "tiny"},
    "moe": {"gpn": 3, "enc": {"dp": 1}, "llm": {"dp": 2, "ep": 2}, "mbs": 1, "gbs": 8, "model": "tiny-moe"},
    "pp2": {"gpn": 5, "enc": {"dp": 1}, "llm": {"pp": 2, "dp": 2}, "mbs": 1, "gbs": 8, "model": "tiny"},
    "colocated": {"gpn": 2, "colocated": True, "llm": {"dp": 2}, "mbs": 1, "gbs": 8, "model": "tiny"},
}


def _run_yaml(d: Path, lay: dict, iters: int, trainer: dict | None = None) -> Path:
    s = parse_study(
        {
            "name": "bench",
            "cluster": {"executor": "local", "gpus_per_node": lay["gpn"], "accelerator": "cpu"},
            "trainer": {
                "model": lay["model"],
                "seq_length": 64,
                "train_iters": iters,
                "lr": {"schedule": "constant", "max": 1e-3},
                **(trainer or {}),
            },
            "matrix": {
                "points": [
                    {
                        "nodes": 1,
                        **({"colocated": True} if lay.get("colocated") else {"encoder": lay["enc"]}),
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


def run_pair(lay: dict, iters: int, trainer: dict | None = None) -> list[dict]:
    """The reference and the torchrun job of one run.yaml; every rank's profile (see RankProfile)."""
    with tempfile.TemporaryDirectory() as td:
        td = Path(td)
        ry = _run_yaml(td / "run", lay, iters, trainer)
        prof = td / "prof"
        env = dict(
            os.environ,
            TORCHDYNAMO_DISABLE="1",
            PYTHONWARNINGS="ignore",
            OMP_NUM_THREADS="1",
            MIMO_JOBS_TRAINER_PROFILE=str(prof),
        )
        env.pop("WORLD_SIZE", None)
        trainer_cmd = ["-m", "mimo_jobs.trainer", str(ry), "--quiet"]
        for cmd in (
            [sys.executable, *trainer_cmd, "--reference", "--metrics", str(td / "ref.jsonl")],
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nproc-per-node",
                str(lay["gpn"]),
                "--master-port",
                str(_port()),
                *trainer_cmd,
                "--metrics",
                str(td / "het.jsonl"),
            ],
        ):
            p = subprocess.run(cmd, check=False, env=env, capture_output=True, text=True, cwd=ROOT)
            if p.returncode:
                sys.exit(f"failed: {' '.join(cmd)}\n{p.stderr[-4000:]}")
        return sorted(
            (json.loads(f.read_text()) for f in prof.glob("*.json")), key=lambda r: (r["mode"], r["rank"])
        )


def _step_ms(ranks: list[dict], mode: str) -> float:
    return max(r["elapsed_s"] / r["iterations"] for r in ranks if r["mode"] == mode) * 1e3


def sweep_m(layout: str, iters: int) -> None:
    base = LAYOUTS[layout]
    lanes = base["llm"].get("dp", 1)
    print(
        f"trainer_cpu --sweep-m: layout {layout}, {iters} iterations; saved = peak bytes autograd kept for backward"
    )
    for m in (2, 4, 8):
        lay = {**base, "gbs": m * base["mbs"] * lanes}
        new = run_pair(lay, iters, {"encoder_inflight": 2})
        old = run_pair(lay, iters, {"encoder_inflight": m})
        mode = next(r["mode"] for r in new if r["mode"] != "reference")
        ref_ms = _step_ms(new, "reference")
        saved = {
            name: ", ".join(
                f"r{r['rank']}={r['saved_activation_peak_bytes'] / 1024:.0f}K"
                for r in rs
                if r["mode"] == mode
            )
            for name, rs in (("1F1B", new), ("all in flight", old))
        }
        print(
            f"  M={m}: step 1F1B {_step_ms(new, mode):.1f} ms | all in flight {_step_ms(old, mode):.1f} ms | "
            f"reference {ref_ms:.1f} ms (hetero/reference {_step_ms(new, mode) / ref_ms:.2f})"
        )
        for name, text in saved.items():
            print(f"      saved, {name}: {text}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=12)
    ap.add_argument("--layout", choices=sorted(LAYOUTS), default="fanout")
    ap.add_argument("--sweep-m", action="store_true", help="step time and saved activations against M")
    a = ap.parse_args()
    if a.sweep_m:
        sweep_m(a.layout, a.iters)
        return
    lay = LAYOUTS[a.layout]
    ranks = run_pair(lay, a.iters)
    print(
        f"trainer_cpu: layout {a.layout} ({lay}), {a.iters} iterations, figures over iterations 2..{a.iters}"
    )
    ref = next(r for r in ranks if r["mode"] == "reference")
    het = [r for r in ranks if r["mode"] != "reference"]
    ref_step = ref["elapsed_s"] / ref["iterations"]
    het_step = max(r["elapsed_s"] / r["iterations"] for r in het)
    print(
        f"  step time: reference {ref_step * 1e3:.1f} ms (1 process) | {het[0]['mode']} {het_step * 1e3:.1f} ms "
        f"({len(het)} ranks) | {het[0]['mode']}/reference = {het_step / ref_step:.2f}"
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
    print(
        "  peak saved activations per rank (KiB): "
        + ", ".join(
            f"{r['mode']}:{r['rank']}={r['saved_activation_peak_bytes'] / 1024:.0f}" for r in het + [ref]
        )
    )


if __name__ == "__main__":
    main()

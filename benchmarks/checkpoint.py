"""Checkpoint benchmark: save and load time and size per rank (prints figures; never run by the tests).

For each preset, a real trainer state is built under torchrun on CPU/gloo (encoder 1 rank + LLM DP 2, so
world 3; MoE presets use llm.ep=2), one training step fills the optimizer state, then every rank times
R checkpoint saves and R loads through mimo_jobs.trainer.checkpoint.checkpointer. Baseline in the same process: a plain
torch.save / torch.load of the same rank's model + optimizer state_dict into one file (no fsync, no
atomic rename, no world agreement), so the ratio shows what the protocol costs on top of serialisation.

    python benchmarks/checkpoint.py                        # tiny and tiny-moe, distributed optimizer on/off
    python benchmarks/checkpoint.py --presets tiny --repeats 5

The GPU-sized presets (dense-1b, moe-8x1b) do not fit this 24 GB CPU machine in fp32 (dense-1b alone needs
~21 GB for weights + fp32 grad buffers + Adam moments); run the same script on a GPU node for them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def render(root: Path, preset: str, distopt: bool) -> Path:
    import yaml

    from mimo_jobs.contract.rundir import RunDir
    from mimo_jobs.model.presets import get_preset
    from mimo_jobs.study.expand import runs_of
    from mimo_jobs.study.load import parse_study
    from mimo_jobs.study.runspec import run_yaml_doc

    moe = get_preset(preset).llm.num_experts > 0
    study = parse_study(
        {
            "name": "ckptbench",
            "cluster": {"executor": "local", "accelerator": "cpu", "gpus_per_node": 3},
            "trainer": {
                "model": preset,
                "seq_length": 64,
                "train_iters": 10,
                "use_distributed_optimizer": distopt,
            },
            "matrix": {
                "points": [
                    {
                        "nodes": 1,
                        "encoder": {"dp": 1},
                        "llm": {"dp": 2, "ep": 2 if moe else 1},
                        "gbs": 4,
                        "mbs": 1,
                    }
                ]
            },
        },
        env={},
    )
    (spec,) = runs_of(study)
    rd = RunDir.of(
        root / "runs", spec.study, f"{spec.name}-{preset}-{'distopt' if distopt else 'opt'}", spec.run_id
    )
    rd.root.mkdir(parents=True, exist_ok=True)
    rd.run_yaml.write_text(yaml.safe_dump(run_yaml_doc(spec, rd.root, {"git_sha": None}), sort_keys=False))
    return rd.run_yaml


def worker(run_yaml: Path, out: Path, repeats: int) -> None:
    """One rank (under torchrun): build, one step, R saves + R loads, plain-torch baseline."""
    import datetime

    import torch
    import torch.distributed as dist

    from mimo_jobs.contract.manifest import latest_checkpoint
    from mimo_jobs.study.runspec import load_run_yaml
    from mimo_jobs.trainer.build import build_state
    from mimo_jobs.trainer.checkpoint.checkpointer import Checkpointer, checkpoint_dir_of, modules_of
    from mimo_jobs.trainer.checkpoint.state import optimizer_state
    from mimo_jobs.trainer.cuda_shims import install
    from mimo_jobs.trainer.step import train_step

    install()
    run, doc = load_run_yaml(run_yaml)
    timeout = datetime.timedelta(seconds=300)
    dist.init_process_group("gloo", timeout=timeout)
    st = build_state(run, run.rank_layout(), False, timeout)
    train_step(st)
    ck = Checkpointer(run, doc, checkpoint_dir_of(run, doc, run_yaml), dist.get_world_size())
    rank = dist.get_rank()
    saves, loads = [], []
    for _ in range(repeats):
        st.iteration += 1  # a new checkpoint each time (keep_checkpoints prunes the older ones)
        dist.barrier()
        t0 = time.perf_counter()
        ck.save(st)
        saves.append(time.perf_counter() - t0)
    for _ in range(repeats):
        dist.barrier()
        t0 = time.perf_counter()
        ck.resume(st)
        loads.append(time.perf_counter() - t0)
    info = latest_checkpoint(ck.dir)
    mine = sum(n for f, n in info.files.items() if f.endswith(f"-{rank:05d}.pt"))

    # baseline: plain torch.save/torch.load of this rank's model + optimizer state in one file
    mods = modules_of(st)
    blob = {
        m.name: {
            "model": m.model.state_dict(),
            "optim": None if m.optimizer is None else optimizer_state(m.optimizer),
        }
        for m in mods
    }
    base_s, base_l = [], []
    with tempfile.TemporaryDirectory() as td:
        f = Path(td) / "plain.pt"
        for _ in range(repeats):
            t0 = time.perf_counter()
            torch.save(blob, f)
            base_s.append(time.perf_counter() - t0)
        for _ in range(repeats):
            t0 = time.perf_counter()
            torch.load(f, weights_only=False)
            base_l.append(time.perf_counter() - t0)
        plain = f.stat().st_size
    rec = {
        "rank": rank,
        "module": "+".join(m.name for m in mods),
        "bytes": mine,
        "plain_bytes": plain,
        "save_s": statistics.median(saves),
        "load_s": statistics.median(loads),
        "plain_save_s": statistics.median(base_s),
        "plain_load_s": statistics.median(base_l),
        "total_bytes": info.bytes,
    }
    recs: list = [None] * dist.get_world_size()
    dist.all_gather_object(recs, rec)
    if rank == 0:
        out.write_text(json.dumps(recs))
    dist.barrier()
    dist.destroy_process_group()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", nargs="+", default=["tiny", "tiny-moe"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--worker", nargs=2, metavar=("RUN_YAML", "OUT"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        worker(Path(a.worker[0]), Path(a.worker[1]), a.repeats)
        return 0
    env = dict(os.environ, OMP_NUM_THREADS="1", TORCHDYNAMO_DISABLE="1")
    print(f"checkpoint save/load per rank (median of {a.repeats}); world 3 = encoder 1 + LLM DP 2; CPU/gloo")
    print(
        f"{'preset':<9} {'optimizer':<8} {'rank':>4} {'module':<9} {'bytes':>10} {'save ms':>8} {'load ms':>8} "
        f"{'save/plain':>10} {'load/plain':>10}"
    )
    with tempfile.TemporaryDirectory() as td:
        for preset in a.presets:
            for distopt in (False, True):
                y = render(Path(td), preset, distopt)
                out = Path(td) / f"{preset}-{distopt}.json"
                cmd = [
                    sys.executable,
                    "-m",
                    "torch.distributed.run",
                    "--standalone",
                    "--nproc-per-node=3",
                    str(Path(__file__).resolve()),
                    "--repeats",
                    str(a.repeats),
                    "--worker",
                    str(y),
                    str(out),
                ]
                r = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
                if r.returncode != 0:
                    print(f"{preset}: failed\n{r.stderr[-3000:]}")
                    return 1
                recs = json.loads(out.read_text())
                for x in recs:
                    print(
                        f"{preset:<9} {'distopt' if distopt else 'plain':<8} {x['rank']:>4} {x['module']:<9} "
                        f"{x['bytes']:>10,} {x['save_s'] * 1e3:>8.1f} {x['load_s'] * 1e3:>8.1f} "
                        f"{x['save_s'] / x['plain_save_s']:>10.2f} {x['load_s'] / x['plain_load_s']:>10.2f}"
                    )
                print(
                    f"{preset:<9} {'distopt' if distopt else 'plain':<8}  all {'':<9} {recs[0]['total_bytes']:>10,}"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())

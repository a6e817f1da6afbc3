"""Loading HuggingFace safetensors into the trainer's LLM at TP2 on CPU: seconds and peak host memory per
rank against the rank's shard (prints figures; never run by the tests).

A synthetic Llama-style checkpoint (random tensors, written in ~0.5 GB files with an index, as
save_pretrained shards) is loaded under torchrun (2 ranks, gloo) by trainer/weights/hf_load.py, each rank
reading only its slices through safetensors' get_slice. Per rank:
  load s       the load (all of its parameters), after the model is built
  +load/shard  the private memory the load adds at its peak (RssAnon sampled every 2 ms) over the bytes of
               the rank's own parameters: the process holds about its shard + libraries + this
  load/read    load s over reading every file of the checkpoint whole into memory (safetensors load_file)
               in the same process: what a loader without slicing pays, at least, per rank

    python benchmarks/weights.py                 # 4 layers of a 1B shape (~0.3 B parameters)
    python benchmarks/weights.py --layers 18     # ~1 B parameters (4 GB in fp32; ~12 GB of RAM in all)

The default is scaled down so that it runs next to other work on a 2-core CPU machine; --layers 18 is the
~1 B-parameter case.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SHAPE = dict(
    hidden_size=2048, ffn_hidden_size=5632, num_attention_heads=16, num_query_groups=8, vocab_size=32000
)


def _arch(layers: int):
    from mimo_jobs.model.arch import LLMArch, ModelArch
    from mimo_jobs.model.presets import PRESETS

    llm = LLMArch(
        num_layers=layers,
        **SHAPE,
        activation="silu",
        gated_linear_unit=True,
        normalization="RMSNorm",
        add_qkv_bias=False,
        add_bias_linear=False,
    )
    return ModelArch("bench", PRESETS["tiny"].encoder, llm)


def write_checkpoint(d: Path, layers: int, file_bytes: int = 2**29) -> int:
    """A Llama-family HF directory of random fp32 tensors; returns its parameter count."""
    import torch
    from safetensors.torch import save_file

    from mimo_jobs.model.hf import llm_config, llm_layout

    llm = _arch(layers).llm
    shapes = llm_layout(llm, "llama", 1).hf_shapes
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(llm_config(llm)))
    g = torch.Generator().manual_seed(0)
    files, cur, size, n = [], {}, 0, 0
    for name, shape in shapes.items():
        t = torch.randn(shape, generator=g) * 0.02
        cur[name], size, n = t, size + t.numel() * 4, n + t.numel()
        if size >= file_bytes:
            files.append(cur)
            cur, size = {}, 0
    if cur:
        files.append(cur)
    weight_map = {}
    for i, tensors in enumerate(files):
        fname = f"model-{i + 1:05d}-of-{len(files):05d}.safetensors"
        save_file(tensors, str(d / fname), metadata={"format": "pt"})
        weight_map |= dict.fromkeys(tensors, fname)
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return n


def _status(key: str) -> int:
    """A /proc/self/status figure in bytes (VmRSS, VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return 0


def worker(d: Path, layers: int) -> None:
    import datetime

    import torch.distributed as dist

    import mimo_jobs.trainer.model.models as M
    import mimo_jobs.trainer.parallel.grids as G
    from mimo_jobs.study.spec import InitSpec
    from mimo_jobs.trainer import cuda_shims
    from mimo_jobs.trainer.build import _seed_megatron
    from mimo_jobs.trainer.weights import hf_load

    cuda_shims.install()
    dist.init_process_group("gloo")
    tp = dist.get_world_size()
    shape = G.ModuleShape(G.LANGUAGE, 0, tp, 1, 1)
    grids = G.build_grids(
        {"vision": G.ModuleShape(G.ENCODER, 0, tp, 1, 1)}, shape, "gloo", datetime.timedelta(seconds=600)
    )
    _seed_megatron(grids, 1)
    arch = _arch(layers)
    prec = M.Precision(use_gpu=False, bf16=False)
    pgc = grids.language.pgc
    gpt = M.build_llm(arch, M.llm_config(arch, tp, 1, 1, prec), pgc, prec, 128)
    shard = sum(p.numel() * p.element_size() for p in gpt.parameters())
    cut = {"tp_rank": pgc.tp.rank(), "tp_size": tp}
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS: the peak of the load alone from here
    anon0 = _status("RssAnon")
    peak_anon = [anon0]
    done = threading.Event()

    def sample() -> None:  # the peak of anonymous memory (file pages of the mmapped shards are page cache)
        while not done.is_set():
            peak_anon[0] = max(peak_anon[0], _status("RssAnon"))
            time.sleep(0.002)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    t0 = time.perf_counter()
    n = hf_load.load_llm(InitSpec(llm=str(d)), arch.llm, gpt, cut)
    load_s = time.perf_counter() - t0
    done.set()
    th.join()
    peak = _status("VmHWM")
    from safetensors.torch import load_file

    t0 = time.perf_counter()
    for f in sorted(d.glob("*.safetensors")):
        # every tensor of the file read into memory, as a loader without slicing reads it
        whole = {k: v.clone() for k, v in load_file(str(f)).items()}
        del whole
    read_s = time.perf_counter() - t0
    out = {
        "rank": dist.get_rank(),
        "params_loaded": n,
        "shard_gb": shard / 1e9,
        "anon_before_gb": anon0 / 1e9,
        "extra_gb": (peak_anon[0] - anon0) / 1e9,
        "peak_anon_gb": peak_anon[0] / 1e9,
        "peak_rss_gb": peak / 1e9,
        "load_s": load_s,
        "read_s": read_s,
    }
    print("RESULT " + json.dumps(out), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--worker", type=Path, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker is not None:
        worker(a.worker, a.layers)
        return
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / "hf"
        t0 = time.perf_counter()
        n = write_checkpoint(d, a.layers)
        disk = sum(f.stat().st_size for f in d.glob("*.safetensors"))
        print(
            f"synthetic Llama checkpoint: {n / 1e9:.2f} B parameters, {disk / 1e9:.2f} GB in "
            f"{len(list(d.glob('*.safetensors')))} files (written in {time.perf_counter() - t0:.1f} s)"
        )
        env = dict(os.environ, TORCHDYNAMO_DISABLE="1", PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(a.tp)]
        cmd += ["--master-addr", "127.0.0.1", "--master-port", "29517", __file__]
        p = subprocess.run(
            [*cmd, "--worker", str(d), "--layers", str(a.layers)], capture_output=True, text=True, env=env
        )
        if p.returncode != 0:
            sys.exit(p.stdout[-3000:] + p.stderr[-6000:])
        rows = sorted(
            (json.loads(ln[7:]) for ln in p.stdout.splitlines() if ln.startswith("RESULT ")),
            key=lambda r: r["rank"],
        )
        print(
            f"{'rank':>4} {'shard GB':>9} {'anon GB':>8} {'+load GB':>9} {'+load/shard':>11} {'RSS GB':>7} "
            f"{'load s':>7} {'read s':>7} {'load/read':>9}"
        )
        for r in rows:
            print(
                f"{r['rank']:>4} {r['shard_gb']:>9.2f} {r['anon_before_gb']:>8.2f} {r['extra_gb']:>9.3f} "
                f"{r['extra_gb'] / r['shard_gb']:>11.3f} {r['peak_rss_gb']:>7.2f} {r['load_s']:>7.1f} "
                f"{r['read_s']:>7.1f} {r['load_s'] / r['read_s']:>9.2f}"
            )
        print(
            "anon GB: the rank's private memory before the load (libraries + its model shard); +load: what the "
            "load added at its peak; RSS: the peak resident set during the load, mmapped file pages included "
            "(page cache, which the kernel reclaims); read s: reading every file whole, in the same process"
        )


if __name__ == "__main__":
    main()

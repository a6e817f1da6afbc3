"""Operator tables for the planner: GEMM and attention time by shape on this device, as YAML.

  python3 benchmarks/gpu/ops.py --out benchmarks/measured/ops_h200.yaml            (a GPU, under 3 minutes)
  python3 benchmarks/gpu/ops.py --device cpu --quick --out /tmp/ops.yaml            (seconds: the script works)

GEMMs are `a @ b` of [m, k] x [k, n] (2mnk FLOPs); attention is torch's fused
`scaled_dot_product_attention` on [b, h, s, d] (4·b·h·s²·d FLOPs, half of it when causal), forward only.
Each shape: warm-up calls, then the median of timed calls (CUDA events on a GPU). Shapes past `--budget-s`
are skipped and listed, so the table never runs past its time. A study names the file as
`cluster.hardware.ops` and the planner prices GEMMs and attention from it (mimo_jobs/study/opsfile.py reads
it, mimo_jobs/contract/opstable.py holds the format and in docs/predict.md).
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
import yaml

# hidden sizes of the presets (1B-class and the MoE's experts) by token counts of a microbatch
GEMMS = [
    (t, n, k) for t in (2048, 8192) for (n, k) in ((2048, 2048), (6144, 2048), (8192, 2048), (2048, 8192))
]
ATTENTION = [(b, 16, s, 128, c) for (b, s) in ((4, 1024), (2, 4096), (1, 8192)) for c in (True, False)]
QUICK_GEMMS = [(64, 32, 48), (128, 64, 64)]
QUICK_ATTENTION = [(1, 2, 32, 16, True), (1, 2, 64, 16, False)]
DTYPE_WORDS = {torch.bfloat16: "bf16", torch.float32: "fp32"}  # a GEMM row's dtype, as the planner names it


@dataclass(frozen=True)
class Timed:
    shape: dict
    flops: float
    ms: float

    @property
    def tflops(self) -> float:
        return self.flops / (self.ms * 1e-3) / 1e12


def time_ms(fn, device: str, warmup: int, reps: int) -> float:
    """Median milliseconds of `fn()` over `reps` calls after `warmup`."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def gemm(m: int, n: int, k: int, dtype, device: str, warmup: int, reps: int) -> Timed:
    a, b = torch.randn(m, k, dtype=dtype, device=device), torch.randn(k, n, dtype=dtype, device=device)
    return Timed({"m": m, "n": n, "k": k}, 2.0 * m * n * k, time_ms(lambda: a @ b, device, warmup, reps))


def attention(
    b: int, h: int, s: int, d: int, causal: bool, dtype, device: str, warmup: int, reps: int
) -> Timed:
    q, k, v = (torch.randn(b, h, s, d, dtype=dtype, device=device) for _ in range(3))
    flops = 4.0 * b * h * s * s * d * (0.5 if causal else 1.0)

    def run():
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    shape = {"b": b, "h": h, "s": s, "d": d, "causal": causal}
    return Timed(shape, flops, time_ms(run, device, warmup, reps))


def table(device: str, dtype, quick: bool, budget_s: float) -> dict:
    warmup, reps = (1, 3) if quick else (3, 10)
    t0 = time.monotonic()
    rows: dict[str, list] = {"gemm": [], "attention": []}
    skipped: list[dict] = []
    jobs = [("gemm", s) for s in (QUICK_GEMMS if quick else GEMMS)]
    jobs += [("attention", s) for s in (QUICK_ATTENTION if quick else ATTENTION)]
    for kind, shape in jobs:
        if time.monotonic() - t0 > budget_s:
            skipped.append({"op": kind, "shape": list(shape)})
            continue
        fn = gemm if kind == "gemm" else attention
        r = fn(*shape, dtype, device, warmup, reps)
        extra = {"dtype": DTYPE_WORDS[dtype]} if kind == "gemm" else {}
        rows[kind].append({**r.shape, **extra, "ms": r.ms, "tflops": r.tflops})
    name = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    return {
        "device": name,
        "torch": str(torch.__version__),
        "gemm": rows["gemm"],
        "attention": rows["attention"],
        "skipped": skipped,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp32"), help="what the planner prices: bf16")
    ap.add_argument("--quick", action="store_true", help="tiny shapes: that the script works")
    ap.add_argument(
        "--budget-s", type=float, default=150.0, help="skip the shapes left after this many seconds"
    )
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[a.dtype]
    doc = table(a.device, dtype, a.quick, a.budget_s)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(yaml.safe_dump(doc, sort_keys=False))
    print(
        f"{a.out}: {len(doc['gemm'])} GEMM and {len(doc['attention'])} attention shapes, {len(doc['skipped'])} skipped"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

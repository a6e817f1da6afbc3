"""Data pipeline cost on a synthetic energon dataset (num_workers=0, so all work is in this process and CPU
time is a fair measure even on a busy machine).

    python benchmarks/data.py [--samples 2000] [--mbs 4] [--steps 60] [--image-sizes 8,12,16]

1. Samples/s of one lane: our provider (LLM side: tokenize + header check, no pixels; encoder side: also
   decode + normalize) against a bare energon loader on the same data (default decoder, batches as lists,
   no task work) -- the ratio is our overhead.
2. The encoder rank's loading cost as lanes_per_encoder grows (1, 4, 16): the encoder replica builds one
   loader per lane it serves (what the trainer does), against one multiplexed loader of our pipeline that
   reads the same number of samples per step (k*mbs per batch, world size llm_dp/k; cost-equivalent but NOT
   lane-aligned: a yardstick for the per-lane design's overhead). Reported: build time, first step, steady CPU ms per step and per
   sample, resident memory growth.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import resource
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def cfg_for(path: str, llm_dp: int, mbs: int):
    from mimo_jobs.data.energon_provider import LoaderConfig
    from mimo_jobs.data.images import ImageGeometry

    return LoaderConfig(
        path=path,
        llm_dp=llm_dp,
        mbs=mbs,
        num_microbatches=1,
        seq_length=64,
        geometry=ImageGeometry(4, 16),
        vocab_size=128,
    )


def timed_steps(step, steps: int) -> tuple[float, float, float]:
    """(first-step wall s, steady CPU s per step, steady wall s per step)."""
    t0 = time.perf_counter()
    step()
    first = time.perf_counter() - t0
    for _ in range(3):  # warm the shuffle buffers
        step()
    c0, w0 = time.process_time(), time.perf_counter()
    for _ in range(steps):
        step()
    return first, (time.process_time() - c0) / steps, (time.perf_counter() - w0) / steps


def bare_loader(path: str, rank: int, world: int, batch: int):
    from megatron.energon import DefaultTaskEncoder, WorkerConfig, get_savable_loader, get_train_dataset

    class ListBatches(DefaultTaskEncoder):
        def batch(self, samples):  # no collation: images have different sizes
            return samples

    wc = WorkerConfig(rank=rank, world_size=world, num_workers=0)
    ds = get_train_dataset(
        path,
        worker_config=wc,
        batch_size=batch,
        shuffle_buffer_size=100,
        max_samples_per_sequence=100,
        task_encoder=ListBatches(),
    )
    return iter(get_savable_loader(ds))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=2000)
    ap.add_argument("--mbs", type=int, default=4)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--image-sizes", default="8,12,16")
    ap.add_argument("--lanes", default="1,4,16")
    a = ap.parse_args()

    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    from mimo_jobs.data.energon_provider import EnergonProvider
    from mimo_jobs.data.synth import SynthConfig, parse_size, synth

    con = Console(width=None if sys.stdout.isatty() else 150)
    tmp = Path(tempfile.mkdtemp(prefix="mimo-data-bench-"))
    sizes = tuple(parse_size(s) for s in a.image_sizes.split(","))
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        res = synth(
            tmp,
            SynthConfig(samples=a.samples, text_only_fraction=0.25, image_sizes=sizes, samples_per_shard=100),
        )
    con.print(
        f"dataset: {a.samples} samples (25% text-only, images {a.image_sizes}) in {tmp}, "
        f"made in {time.perf_counter() - t0:.2f} s; mbs={a.mbs}, {a.steps} steady steps, num_workers=0"
    )
    blend = str(res.blend)
    lanes_list = [int(x) for x in a.lanes.split(",")]

    with Progress(console=con, transient=True) as prog:
        task = prog.add_task("benchmark", total=3 + 2 * len(lanes_list))
        # ---------------------------------------------------------------- 1. one lane
        rows1 = []
        it = bare_loader(blend, 0, 1, a.mbs)
        first, cpu, wall = timed_steps(lambda: next(it), a.steps)
        it.close()
        rows1.append(("bare energon (decode, no task work)", first, cpu, wall))
        prog.advance(task)
        for name, need in (("ours, LLM lane (no pixels)", False), ("ours, encoder side (decode)", True)):
            p = EnergonProvider(cfg_for(blend, 1, a.mbs), [0], need_images=need)
            first, cpu, wall = timed_steps(lambda p=p: p.next(0), a.steps)
            p.close()
            rows1.append((name, first, cpu, wall))
            prog.advance(task)

        # ---------------------------------------------------------------- 2. encoder rank vs lanes
        rows2 = []
        kmax = max(lanes_list)
        for k in lanes_list:
            gc.collect()
            m0, b0 = rss_mb(), time.perf_counter()
            p = EnergonProvider(cfg_for(blend, kmax, a.mbs), list(range(k)), need_images=True)
            build = time.perf_counter() - b0

            def step(p=p, k=k):
                for lane in range(k):
                    p.next(lane)

            first, cpu, wall = timed_steps(step, max(4, a.steps // k))
            rows2.append((f"per-lane loaders, k={k}", k, build, first, cpu, wall, rss_mb() - m0))
            p.close()
            del p
            prog.advance(task)
            gc.collect()
            m0, b0 = rss_mb(), time.perf_counter()
            enc_world = max(1, kmax // k)
            p = EnergonProvider(cfg_for(blend, enc_world, k * a.mbs), [0], need_images=True)
            build = time.perf_counter() - b0
            first, cpu, wall = timed_steps(lambda p=p: p.next(0), max(4, a.steps // k))
            rows2.append((f"one loader, {k}x{a.mbs} per batch", k, build, first, cpu, wall, rss_mb() - m0))
            p.close()
            prog.advance(task)

    t1 = Table(title="1. one lane: samples/s (CPU) and ratio to the bare energon loader")
    for c in (
        "pipeline",
        "first step s",
        "CPU ms/step",
        "samples/s (CPU)",
        "samples/s (wall)",
        "ratio vs bare",
    ):
        t1.add_column(c, justify="right" if c != "pipeline" else "left")
    base = a.mbs / rows1[0][2]
    for name, first, cpu, wall in rows1:
        sps = a.mbs / cpu
        t1.add_row(
            name,
            f"{first:.2f}",
            f"{cpu * 1e3:.2f}",
            f"{sps:,.0f}",
            f"{a.mbs / wall:,.0f}",
            f"{sps / base:.2f}",
        )
    con.print(t1)

    t2 = Table(
        title="2. encoder rank: loading cost vs lanes_per_encoder (one step = one microbatch per lane)"
    )
    for c in ("loader", "k", "build s", "first step s", "CPU ms/step", "CPU ms/sample", "RSS +MB"):
        t2.add_column(c, justify="right" if c != "loader" else "left")
    for name, k, build, first, cpu, _wall, mem in rows2:
        t2.add_row(
            name,
            str(k),
            f"{build:.2f}",
            f"{first:.2f}",
            f"{cpu * 1e3:.2f}",
            f"{cpu * 1e3 / (k * a.mbs):.3f}",
            f"{mem:.0f}",
        )
    con.print(t2)
    per = {r[1]: r[4] / (r[1] * a.mbs) for r in rows2 if r[0].startswith("per-lane")}
    mux = {r[1]: r[4] / (r[1] * a.mbs) for r in rows2 if not r[0].startswith("per-lane")}
    k1 = min(per)
    con.print(
        "per-sample CPU cost relative to k=1 (per-lane): "
        + ", ".join(f"k={k}: {per[k] / per[k1]:.2f}x" for k in sorted(per))
        + "; per-lane / multiplexed: "
        + ", ".join(f"k={k}: {per[k] / mux[k]:.2f}x" for k in sorted(per))
    )


if __name__ == "__main__":
    main()

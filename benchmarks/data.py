"""Data pipeline cost on a synthetic energon dataset (cases 1 and 2 with num_workers=0, so all work is in
this process and CPU time is a fair measure even on a busy machine).

    python benchmarks/data.py [--samples 2000] [--mbs 4] [--steps 60] [--image-sizes 8,12,16]

1. Samples/s of one lane: our provider (LLM side: tokenize + header check, no pixels; encoder side: also
   decode + normalize) against a bare energon loader on the same data (default decoder, batches as lists,
   no task work) -- the ratio is our overhead.
2. The encoder rank's loading cost as lanes_per_encoder grows (1, 4, 16), num_workers=0: one loader per
   lane it serves, against the one multiplexed loader the trainer builds (mimo_jobs/data/mux.py; the same
   samples per lane). Reported: build time, first step, steady CPU ms per step and per sample, resident
   memory growth.
3. Fan-out --fanout (8) with --workers (2) worker processes per loader: samples/s (wall, and per CPU
   second of this process and its workers), worker processes and open shard files per encoder rank, one
   loader per lane against one multiplexed loader, and their ratio. Each lane reads its own slices of the
   dataset, so the shard files open at once follow the lanes served either way. Wall figures share the machine with whatever else
   runs; the CPU-second figure does not.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import os
import resource
import subprocess
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


def children() -> list[int]:
    """Live child processes of this process (the loaders' workers), from /proc."""
    me, out = os.getpid(), []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == me:  # field 4 of stat: the parent pid
                out.append(int(d.name))
    return out


def cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds of these processes (utime, stime: fields 14 and 15 of /proc/PID/stat)."""
    tick, total = os.sysconf("SC_CLK_TCK"), 0.0
    for pid in pids:
        with contextlib.suppress(OSError):
            f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(f[11]) + int(f[12])) / tick
    return total


def open_shards(pids: list[int]) -> int:
    """Shard files (.tar) these processes hold open, from /proc/PID/fd."""
    n = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                with contextlib.suppress(OSError):
                    n += os.readlink(fd).endswith(".tar")
    return n


def fanout_case(blend: str, fanout: int, workers: int, mbs: int, steps: int, multiplex: bool) -> dict:
    """One encoder rank serving `fanout` lanes: build, first step, then `steps` steady steps (one microbatch
    per lane each)."""
    import dataclasses

    import mimo_jobs.data.mux
    import mimo_jobs.data.task_encoder  # noqa: F401 -- imports (energon, torch) outside the build time
    from mimo_jobs.data.energon_provider import EnergonProvider

    cfg = dataclasses.replace(cfg_for(blend, fanout, mbs), num_workers=workers)
    lanes = list(range(fanout))
    b0 = time.perf_counter()
    p = EnergonProvider(cfg, lanes, need_images=True, multiplex=multiplex)
    build = time.perf_counter() - b0

    def step():
        for lane in lanes:
            p.next(lane)

    t0 = time.perf_counter()
    step()
    first = time.perf_counter() - t0
    for _ in range(3):
        step()
    procs = children()
    c0, w0 = cpu_s([os.getpid(), *procs]), time.perf_counter()
    for _ in range(steps):
        step()
    wall, cpu = time.perf_counter() - w0, cpu_s([os.getpid(), *procs]) - c0
    shards = open_shards([os.getpid(), *procs])
    p.close()
    n = steps * fanout * mbs
    return {
        "build": build,
        "first": first,
        "workers": len(procs),
        "shards": shards,
        "sps": n / wall,
        "sps_cpu": n / cpu,
    }


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
    ap.add_argument("--fanout", type=int, default=8)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--fanout-case", nargs=2, metavar=("BLEND", "MULTIPLEX"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if (
        a.fanout_case
    ):  # case 3 runs in a fresh process: forked workers would inherit earlier cases' open files
        blend, mux = a.fanout_case
        row = fanout_case(blend, a.fanout, a.workers, a.mbs, max(8, a.steps // 2), mux == "1")
        print("@@ROW@@" + json.dumps(row))
        return

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
        f"made in {time.perf_counter() - t0:.2f} s; mbs={a.mbs}, {a.steps} steady steps"
    )
    blend = str(res.blend)
    lanes_list = [int(x) for x in a.lanes.split(",")]

    with Progress(console=con, transient=True) as prog:
        task = prog.add_task("benchmark", total=5 + 2 * len(lanes_list))
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
            p = EnergonProvider(cfg_for(blend, kmax, a.mbs), list(range(k)), need_images=True, multiplex=True)
            build = time.perf_counter() - b0

            def step(p=p, k=k):
                for lane in range(k):
                    p.next(lane)

            first, cpu, wall = timed_steps(step, max(4, a.steps // k))
            rows2.append((f"one multiplexed loader, k={k}", k, build, first, cpu, wall, rss_mb() - m0))
            p.close()
            prog.advance(task)

        # ---------------------------------------------------------------- 3. fan-out with workers
        rows3 = {}
        for name, mux in (("one loader per lane", False), ("one multiplexed loader", True)):
            args = [f"--{k}={getattr(a, k)}" for k in ("fanout", "workers", "mbs", "steps")]
            out = subprocess.run(
                [sys.executable, __file__, *args, "--fanout-case", blend, str(int(mux))],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            rows3[name] = json.loads(out.split("@@ROW@@", 1)[1])
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

    t3 = Table(
        title=f"3. encoder rank serving {a.fanout} lanes, {a.workers} workers per loader "
        "(one step = one microbatch per lane)"
    )
    for c in (
        "loader",
        "worker processes",
        "open shard files",
        "build s",
        "first step s",
        "samples/s (wall)",
        "samples/CPU s",
    ):
        t3.add_column(c, justify="right" if c != "loader" else "left")
    for name, r in rows3.items():
        t3.add_row(
            name,
            str(r["workers"]),
            str(r["shards"]),
            f"{r['build']:.2f}",
            f"{r['first']:.2f}",
            f"{r['sps']:,.0f}",
            f"{r['sps_cpu']:,.0f}",
        )
    con.print(t3)
    per, mux = rows3["one loader per lane"], rows3["one multiplexed loader"]
    con.print(
        f"multiplexed / per-lane at fan-out {a.fanout}: worker processes {mux['workers']}/{per['workers']}, "
        f"samples/s (wall) {mux['sps'] / per['sps']:.2f}x, samples per CPU second "
        f"{mux['sps_cpu'] / per['sps_cpu']:.2f}x, first step {mux['first'] / per['first']:.2f}x"
    )


if __name__ == "__main__":
    main()

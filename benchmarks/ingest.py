"""Ingest and report benchmarks (print figures; never run by the test suite).

1. ingest rate: a generated multi-rank SLURM log (default ~1 GiB: 64 ranks on 8 nodes, srun --label +
   torchrun --tee prefixes). As in real Megatron only the last rank prints the iteration line (one per
   iteration, upstream's exact format incl. MoE load-balancing loss); all ranks print noise between them
   (24 lines per iteration: DDP/deprecation warnings, NCCL INFO chatter, data-loader/bridge/memory
   messages), a checkpoint save every 1000 iterations, and at the end a traceback on one rank and NCCL
   watchdog timeouts on the 63 others. About 4% of the lines (~16% of the bytes) are iteration lines. Ingested
   into a fresh DuckDB store, against `wc -l` on the same (page-cached) file. Target: within 3x of `wc -l`.
   As root, the pair is also timed with the page cache dropped before each (a log read once after its job).
   Also printed: the compiled scanner alone (no store), and the pure-Python scanner (what ingest uses without
   a C compiler) on a prefix of the log.
2. report latency: a store with R runs x I iterations (default 100 x 50,000, phases included), timed for
   build() + table rendering, and for the `mimo-jobs report` command end to end. Target: under 1 s.

    python benchmarks/ingest.py                       # both, full size
    python benchmarks/ingest.py --size-mb 200 --runs 20 --iters 10000   # quicker
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

NOISE = [
    "[W{md} {hms}.{us} reducer.cpp:1389] Warning: find_unused_parameters=True was specified in DDP constructor, "
    "but did not find any unused parameters in the forward pass.",
    "data loader: lane {lane} prefetched {n} samples ({img} images, {txt} text-only) in {ms:.1f} ms",
    "bridge: sent {n} image embeddings [{tok}, 2048] to lanes {lane}..{lane2} in {ms:.2f} ms",
    "/usr/local/lib/python3.11/dist-packages/torch/utils/checkpoint.py:295: FutureWarning: "
    "`torch.cpu.amp.autocast(args...)` is deprecated.",
    "rank memory: allocated {a:.2f} GiB, reserved {r:.2f} GiB, max allocated {m:.2f} GiB",
    # NCCL_DEBUG=INFO chatter, as every rank prints it when communicators are (re)built
    "nid{tok:06d}:{n}:{lane} [{lane}] NCCL INFO Channel {n:02d}/32 :    0   1   2   3   4   5   6   7",
    "nid{tok:06d}:{n}:{lane} [{lane}] NCCL INFO comm 0x{tok:x}e50 rank {lane} nRanks 64 nNodes 8 localRanks 8 "
    "localRank {lane2} MNNVL 0 - Init COMPLETE",
]

ITER = (
    " [2026-03-02 {hms}.{us}] iteration {it:8d}/  500000 | consumed samples: {cs:12d} | elapsed time per "
    "iteration (ms): {ms:.1f} | throughput per GPU (TFLOP/s/GPU): {tf:.1f} | learning rate: {lr:.6E} | "
    "global batch size:   768 | lm loss: {loss:.6E} | load_balancing_loss: {lb:.6E} | loss scale: 1.0 | "
    "grad norm: {gn:.3f} | number of skipped iterations:   0 | number of nan iterations:   0 |"
)


def generate_log(path: Path, size_mb: int, nodes: int = 8, gpn: int = 8, noise_per_iter: int = 24) -> dict:
    """Write the multi-rank log; returns its composition."""
    import random

    rng = random.Random(0)
    target = size_mb << 20
    world = nodes * gpn
    last = world - 1
    it = 0
    lines = 0
    iters = 0
    written = 0
    with open(path, "w", buffering=1 << 22) as f:
        while written < target:
            buf = []
            for _ in range(200):
                it += 1
                s = it % 86400
                hms = f"{(s // 3600) % 24:02d}:{(s // 60) % 60:02d}:{s % 60:02d}"
                for _ in range(noise_per_iter):
                    r = rng.randrange(world)
                    tmpl = NOISE[rng.randrange(len(NOISE))]
                    buf.append(
                        f"{r // gpn}: [default{r % gpn}]:"
                        + tmpl.format(
                            md="0302",
                            hms=hms,
                            us=rng.randrange(10**6),
                            lane=r % 16,
                            lane2=r % 16 + 3,
                            n=rng.randrange(1, 64),
                            img=rng.randrange(48),
                            txt=rng.randrange(16),
                            ms=rng.random() * 50,
                            tok=rng.randrange(1000, 9000),
                            a=rng.random() * 60,
                            r=rng.random() * 70,
                            m=rng.random() * 75,
                        )
                    )
                buf.append(
                    f"{last // gpn}: [default{last % gpn}]:"
                    + ITER.format(
                        hms=hms,
                        us=rng.randrange(10**6),
                        it=it,
                        cs=it * 768,
                        ms=2000 + rng.random() * 50,
                        tf=400 + rng.random() * 5,
                        lr=3e-4,
                        loss=2 + 8 / it**0.3,
                        lb=1.01,
                        gn=1 + rng.random(),
                    )
                )
                iters += 1
                if it % 1000 == 0:
                    buf.append(
                        f"{last // gpn}: [default{last % gpn}]:  successfully saved checkpoint from iteration "
                        f"{it:8d} to /lustre/ckpt [ t 1/ 2, p 1/ 1 ]"
                    )
            text = "\n".join(buf) + "\n"
            f.write(text)
            written += len(text)
            lines += len(buf)
        tail = [
            "3: [default5]:[rank29]: Traceback (most recent call last):",
            '3: [default5]:[rank29]:   File "/opt/mimo_jobs/trainer/step.py", line 88, in llm_forward',
            "3: [default5]:[rank29]: RuntimeError: shape mismatch",
        ]
        tail += [
            f"{r // gpn}: [default{r % gpn}]:[rank{r}]:[E0302 10:10:06.3 ProcessGroupNCCL.cpp:632] [Rank {r}] "
            "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=41, OpType=ALLREDUCE)"
            for r in range(world)
            if r != 29
        ]
        f.write("\n".join(tail) + "\n")
        lines += len(tail)
    return {"lines": lines, "iteration_lines": iters, "bytes": path.stat().st_size, "ranks": world}


def _cpu() -> float:
    """CPU seconds of this process and its finished children (DuckDB threads included): unlike
    wall time it does not grow when other work shares the machine."""
    import resource

    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime


def best_of(n: int, fn) -> tuple[float, float]:
    """(best wall seconds, best CPU seconds) over n runs."""
    wall, cpu = [], []
    for _ in range(n):
        t, c = time.perf_counter(), _cpu()
        fn()
        wall.append(time.perf_counter() - t)
        cpu.append(_cpu() - c)
    return min(wall), min(cpu)


DROP_CACHES = Path("/proc/sys/vm/drop_caches")


def _drop_page_cache() -> None:
    os.sync()  # dirty pages (the store just written) cannot be dropped
    DROP_CACHES.write_text("3\n")


def _cold_cache(log: Path, run_ingest, reps: int = 3) -> None:
    """The same comparison with the page cache dropped before each contender: how a log is read once after its
    job (from local disk or a parallel file system), where both are bound by reading the file, not by CPU.
    Needs root (writing /proc/sys/vm/drop_caches); the warm figures above are the strict ones."""
    if not os.access(DROP_CACHES, os.W_OK):
        print("cold page cache: skipped (dropping the page cache needs root)")
        return
    pairs = []
    for _ in range(reps):
        _drop_page_cache()
        wc = best_of(
            1, lambda: subprocess.run(["wc", "-l", str(log)], stdout=subprocess.DEVNULL, check=True)
        )[0]
        _drop_page_cache()
        pairs.append((best_of(1, run_ingest)[0], wc))
    ing, wc = sorted(pairs, key=lambda p: p[0] / p[1])[
        len(pairs) // 2
    ]  # the median ratio of back-to-back pairs
    print(
        f"cold page cache (dropped before each; median of {reps} pairs): wc -l {wc:.3f} s, ingest {ing:.3f} s, "
        f"ratio {ing / wc:.2f}x"
    )
    subprocess.run(["cat", str(log)], stdout=subprocess.DEVNULL, check=True)  # warm again for what follows


def _scan_only(log: Path, keep: list | None = None) -> None:
    """ingest's compiled read path over the whole file with the rows dropped instead of stored: what the C
    pass costs next to wc -l. `keep` collects the row batches instead."""
    from mimo_jobs.ingest import readers
    from mimo_jobs.ingest.lines import LineHandler
    from mimo_jobs.ingest.origin import PathInfo
    from mimo_jobs.ingest.runs import RunCtx
    from mimo_jobs.ingest.staging import Stage

    class Discard(Stage):
        def c_batch(self, con, cols):  # the rows are parsed, then dropped (or kept)
            if keep is not None:
                keep.append(cols)

    st, stage = readers.FileState(), Discard()
    try:
        handler = LineHandler(
            st, RunCtx("bench", 8, False), "1000", PathInfo(), stage, str(log), want_iters=True
        )
        readers.scan_compiled(
            None, log, 0, log.stat().st_size, st, handler, stage, None, readers.ScanOptions("c")
        )
    finally:
        stage.close()


def _store_only(db: Path, batches: list) -> None:
    """ingest's storing of the C-parsed row batches alone (scanned beforehand): the other half of the work."""
    from mimo_jobs.ingest.staging import Stage
    from mimo_jobs.store import connection as store

    if db.exists():
        db.unlink()
    con = store.connect(db)
    stage = Stage()
    stage.log_const = ("bench-run", "1000", "/bench/slurm-1000.out")
    try:
        with store.transaction(con):
            for cols in batches:
                stage.c_batch(con, cols)
            stage.wait()
    finally:
        stage.close()
        con.close()


def bench_ingest(size_mb: int, workdir: Path, python_mb: int) -> None:
    from mimo_jobs.ingest import pipeline as ingest
    from mimo_jobs.ingest import readers
    from mimo_jobs.ingest.staging import Stage
    from mimo_jobs.store import connection as store

    log = workdir / "slurm-1000.out"
    t = time.perf_counter()
    comp = generate_log(log, size_mb)
    print(
        f"generated {comp['bytes'] / 2**20:,.0f} MiB log in {time.perf_counter() - t:.1f} s: {comp['lines']:,} lines "
        f"from {comp['ranks']} ranks, {comp['iteration_lines']:,} iteration lines"
    )
    subprocess.run(["cat", str(log)], stdout=subprocess.DEVNULL, check=True)  # page cache for both contenders
    wc = best_of(3, lambda: subprocess.run(["wc", "-l", str(log)], stdout=subprocess.DEVNULL, check=True))
    db = workdir / "bench.duckdb"

    info = ingest.LogRunInfo(study="bench", name="big", nodes=8, gpus_per_node=8, seq_length=4096)

    def run_ingest(path: Path = log, options: readers.ScanOptions | None = None):
        if db.exists():
            db.unlink()
        con = store.connect(db)
        st = ingest.ingest_paths(con, [path], log_run=info, options=options)
        con.close()
        run_ingest.stats = st

    mode = readers.scan_options().scanner_for("log")
    ing = best_of(3, run_ingest)
    st = run_ingest.stats
    mb = comp["bytes"] / 2**20
    print(
        f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} (wall times grow with load); "
        f"scanner: {mode}"
    )
    print(f"wc -l:   wall {wc[0]:.3f} s ({mb / wc[0]:,.0f} MiB/s), cpu {wc[1]:.3f} s")
    print(
        f"ingest:  wall {ing[0]:.3f} s ({mb / ing[0]:,.0f} MiB/s), cpu {ing[1]:.3f} s; {st.lines:,} lines, "
        f"{st.iterations:,} iterations, {st.events:,} events, {st.bad_lines} bad"
    )
    print(f"ratio ingest / wc -l: wall {ing[0] / wc[0]:.2f}x, cpu {ing[1] / wc[1]:.2f}x   (target <= 3x)")
    import resource

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"peak RSS of this process so far: {rss:,.0f} MiB (the log is {mb:,.0f} MiB: it is streamed, not loaded)"
    )
    if mode == "c":
        sc = best_of(3, lambda: _scan_only(log))
        batches: list = []
        _scan_only(log, keep=batches)
        so = best_of(3, lambda: _store_only(workdir / "store-only.duckdb", batches))
        print(
            f"  of which the C scan alone (rows parsed, not stored): wall {sc[0]:.3f} s, "
            f"cpu {sc[1]:.3f} s = {sc[1] / wc[1]:.2f}x wc -l cpu"
        )
        print(
            f"  DuckDB storing the {sum(len(b['iteration']) // 4 for b in batches):,} parsed rows alone: "
            f"wall {so[0]:.3f} s, cpu {so[1]:.3f} s = {so[1] / wc[1]:.2f}x wc -l cpu (ingest overlaps the two "
            f"on 2 cores)"
        )
        keep_batch = Stage.c_batch
        Stage.c_batch = lambda self, con, cols: (
            None
        )  # the parsed rows are dropped: DuckDB stores none of them
        try:
            free = best_of(3, run_ingest)
        finally:
            Stage.c_batch = keep_batch
        print(
            f"  the whole ingest with the parsed rows dropped instead of stored (a store that cost nothing): "
            f"wall {free[0]:.3f} s = {free[0] / wc[0]:.2f}x wc -l"
        )
    _cold_cache(log, run_ingest)
    con = store.connect(db)
    t = time.perf_counter()
    st2 = ingest.ingest_paths(con, [log], log_run=info)  # a file belongs to the run it was ingested into
    con.close()
    print(
        f"re-ingest of the unchanged file: {time.perf_counter() - t:.3f} s (skipped {st2.skipped_unchanged})"
    )
    if python_mb:  # the pure-Python path (no compiler at install time) on a prefix of the same log
        small = workdir / "slurm-1001.out"
        with open(log, "rb") as src, open(small, "wb") as dst:
            dst.write(src.read(python_mb << 20))
            dst.write(src.readline())
        rates = {}
        for m in readers.SCANNERS if readers.HAVE_COMPILED else ("python",):
            rates[m] = best_of(1, lambda m=m: run_ingest(small, readers.ScanOptions(m)))
        print(
            f"same {python_mb} MiB prefix, pure Python: wall {rates['python'][0]:.3f} s, cpu {rates['python'][1]:.3f} s"
        )
        if "c" in rates:
            print(
                f"  compiled: wall {rates['c'][0]:.3f} s, cpu {rates['c'][1]:.3f} s "
                f"(pure Python / compiled cpu: {rates['python'][1] / rates['c'][1]:.1f}x)"
            )


def bench_rank_files(n: int, workdir: Path) -> None:
    """Per-rank torchrun logs (logs/job-<id>/node-<n>/<rdzv>/attempt_0/<local rank>/{stdout,stderr}.log) of
    one run: the per-file cost of ingest, which dominates a study of many small files."""
    import random
    import shutil

    import yaml

    from mimo_jobs.contract.rundir import RunDir
    from mimo_jobs.ingest import pipeline as ingest
    from mimo_jobs.store import connection as store
    from mimo_jobs.study.expand import runs_of
    from mimo_jobs.study.load import parse_study
    from mimo_jobs.study.runspec import run_yaml_doc

    doc = {
        "name": "ranks",
        "cluster": {"executor": "slurm", "accelerator": "gpu", "gpus_per_node": 8},
        "trainer": {"model": "tiny", "train_iters": 100, "seq_length": 64},
        "matrix": {
            "points": [
                {"nodes": max(1, n // 16), "gbs": 8 * max(1, n // 16), "encoder": {"dp": 4 * max(1, n // 16)}}
            ]
        },
    }
    run = runs_of(parse_study(doc, env={}))[0]
    root = workdir / "rank-runs"
    shutil.rmtree(root, ignore_errors=True)
    rd = RunDir.of(root, run.study, run.name, run.run_id)
    rd.logs.mkdir(parents=True)
    rd.run_yaml.write_text(yaml.safe_dump(run_yaml_doc(run, rd.root, {})))
    rng = random.Random(1)
    for r in range(n // 2):
        d = rd.logs / "job-77" / f"node-{r // 8}" / "rdzv" / "attempt_0" / str(r % 8)
        d.mkdir(parents=True)
        out = [
            NOISE[rng.randrange(3)].format(
                md="0302",
                hms="10:00:00",
                us=1,
                lane=r,
                lane2=r,
                n=i,
                img=1,
                txt=1,
                ms=1.0,
                tok=1000,
                a=1,
                r=1,
                m=1,
            )
            for i in range(100)
        ]
        (d / "stdout.log").write_text("\n".join(out) + "\n")
        (d / "stderr.log").write_text("\n".join(out[:20]) + "\n")
    db = workdir / "ranks.duckdb"

    def once():
        if db.exists():
            db.unlink()
        con = store.connect(db)
        once.st = ingest.ingest_paths(con, [rd.root])
        con.close()

    w, c = best_of(3, once)
    print(
        f"{once.st.files} per-rank log files ({sum(p.stat().st_size for p in rd.logs.rglob('*.log')) / 2**20:.1f} MiB): "
        f"wall {w:.3f} s = {1000 * w / once.st.files:.1f} ms per file, cpu {c:.3f} s"
    )


def bench_report(runs: int, iters: int, workdir: Path) -> None:
    from mimo_jobs.report import build, render
    from mimo_jobs.store import connection as store

    db = workdir / "report.duckdb"
    if db.exists():
        db.unlink()
    con = store.connect(db)
    t = time.perf_counter()
    node_counts = [33, 68, 100, 132]
    con.execute("""INSERT INTO studies (name, scaling, baseline_nodes) VALUES ('big', 'strong', 33)""")
    con.execute(f"""INSERT INTO runs (run_id, study, name, idx, nodes, gpus_per_node, world, gbs, seq_length, model,
                                      accelerator)
                    SELECT 'run' || i, 'big', 'r' || i, i, n, 8, n * 8, 768, 4096, 'moe-8x1b', 'gpu'
                    FROM (SELECT i, list_extract({node_counts}, (i % {len(node_counts)}) + 1) AS n
                          FROM range({runs}) t(i))""")
    con.execute(f"""INSERT INTO iterations (run_id, job_id, iteration, time, elapsed_ms, loss, lr, grad_norm,
                        consumed_samples, gbs, source, attempt, train_iters, superseded, phases, enc_fwd_ms,
                        enc_bwd_ms, bridge_wait_ms, llm_fwd_ms, llm_bwd_ms, optimizer_ms, data_ms)
                    SELECT 'run' || r, '1', it, TIMESTAMP '2026-01-01' + to_seconds(it * 2), 2000 + (it % 7) * 3.0 + r,
                           2 + 8 / pow(it, 0.3), 3e-4, 1.0, it * 768, 768, 'jsonl', 0, {iters}, false,
                           '{{"enc_fwd": 300.0, "enc_bwd": 500.0, "bridge_wait": 40.0, "llm_fwd": 400.0, '
                           || '"llm_bwd": 700.0, "optimizer": 60.0, "data": 5.0}}',
                           300.0, 500.0, 40.0, 400.0, 700.0, 60.0, 5.0  -- as ingest stores a metrics.jsonl record
                    FROM range({runs}) a(r), range(1, {iters} + 1) b(it)""")
    con.execute("CHECKPOINT")
    con.close()
    print(
        f"built a store of {runs} runs x {iters:,} iterations ({runs * iters:,} rows) in "
        f"{time.perf_counter() - t:.1f} s ({db.stat().st_size / 2**20:,.0f} MiB)"
    )
    con = store.connect(db, read_only=True)
    build(con, "big", gpu="H100")  # warm the file cache
    lat = best_of(3, lambda: render(build(con, "big", gpu="H100"), "table"))
    con.close()
    print(
        f"report build+render (in process): wall {lat[0]:.3f} s, cpu {lat[1]:.3f} s   (target < 1 s; "
        f"load average {os.getloadavg()[0]:.1f})"
    )
    t = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "mimo_jobs.cli", "report", "big", "--db", str(db), "--format", "csv"],
        stdout=subprocess.DEVNULL,
        check=True,
        env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1])),
    )
    print(f"`mimo-jobs report` end to end (process start included): {time.perf_counter() - t:.3f} s")


def bench_reingest(n: int, workdir: Path) -> None:
    """Re-ingesting a tree of `n` loose, unchanged tiny logs (a second `ingest` of the same directory, as a
    cron job does): it should cost about a stat per file. Printed against the first ingest and against
    os.stat of the same files, timed in this process."""
    import shutil

    from mimo_jobs.ingest import pipeline as ingest
    from mimo_jobs.store import connection as store

    root = workdir / "loose"
    shutil.rmtree(root, ignore_errors=True)
    for i in range(n):
        d = root / f"job-{i // 100}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"slurm-{i}.out").write_text(f"starting job {i}\nsome output\n")
    files = sorted(root.rglob("*.out"))
    db = workdir / "loose.duckdb"
    db.unlink(missing_ok=True)

    def ingest_once():
        con = store.connect(db)
        ingest_once.st = ingest.ingest_paths(con, [root])
        con.close()

    t0 = time.perf_counter()
    ingest_once()
    first = time.perf_counter() - t0
    again, _ = best_of(3, ingest_once)
    assert ingest_once.st.skipped_unchanged == n, ingest_once.st
    stat, _ = best_of(3, lambda: [f.stat() for f in files])
    print(
        f"re-ingest of {n} unchanged loose logs: {again:.3f} s ({1e3 * again / n:.3f} ms per file); "
        f"first ingest {first:.3f} s ({again / first:.3f}x of it); os.stat of every file {stat:.3f} s "
        f"({again / stat:.1f}x of it)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=int, default=1024, help="size of the generated log (MiB)")
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--iters", type=int, default=50_000)
    ap.add_argument("--dir", type=Path, default=None, help="work directory (default: a temp dir, removed)")
    ap.add_argument("--skip-ingest", action="store_true")
    ap.add_argument("--skip-report", action="store_true")
    ap.add_argument(
        "--rank-files", type=int, default=512, help="per-rank log files for the per-file figure (0: no)"
    )
    ap.add_argument(
        "--python-mb",
        type=int,
        default=64,
        help="also time the pure-Python scanner (and the compiled one) on this prefix (0: no)",
    )
    ap.add_argument(
        "--reingest-files",
        type=int,
        default=5000,
        help="loose logs for the unchanged re-ingest figure (0: no)",
    )
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=a.dir) as d:
        work = Path(d)
        if not a.skip_ingest:
            bench_ingest(a.size_mb, work, a.python_mb)
            if a.rank_files:
                bench_rank_files(a.rank_files, work)
            if a.reingest_files:
                bench_reingest(a.reingest_files, work)
        if not a.skip_report:
            bench_report(a.runs, a.iters, work)


if __name__ == "__main__":
    main()

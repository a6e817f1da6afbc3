"""Submission and status cost on the real local SLURM cluster (tests/slurm/cluster.sh must be up), or locally.

    python benchmarks/submit.py                 # N = 3 and 30, slurm
    python benchmarks/submit.py --n 3 30 100 --executor local

For each N it submits a fresh N-run study (one 1-node point with `repeats: N`; the FAKE workload of
tests/submit/fake_templates sleeps, so jobs stay active) into a fresh store and prints:
- submit: render (all N run dirs), scheduler calls (sbatch / runner start) and store writes, per run, and
  the ratio to a bare `sbatch --wrap true` measured in the same process (the scheduler's own floor);
- status latency: one `refresh + run_statuses` (what `mimo-jobs status` does after start-up), with the
  sacct/squeue time separated, the ratio to one bare `sacct -j <all ids>` call, and the whole CLI
  (`mimo-jobs status`, a fresh process) wall time.
Jobs are cancelled at the end.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
FAKE_TEMPLATES = REPO / "tests/submit/fake_templates"


def study_doc(name: str, n: int, executor: str) -> dict:
    cluster = {
        "executor": executor,
        "accelerator": "cpu",
        "gpus_per_node": 2,
        "time_limit": "00:05:00",
        "exclusive": False,
        "requeue": False,
        "env": {"FAKE_SLEEP": "120"},
    }
    if executor == "slurm":
        cluster["partition"] = "debug"
    return {
        "name": name,
        "cluster": cluster,
        "trainer": {"model": "tiny", "train_iters": 2},
        "matrix": {"points": [{"nodes": 1, "gbs": 6, "repeats": n}]},
    }


def bare_sbatch(k: int = 5) -> float:
    ts = []
    for _ in range(k):
        t0 = time.perf_counter()
        jid = subprocess.run(
            ["sbatch", "--parsable", "-p", "debug", "--wrap", "true", "-o", "/dev/null"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        ts.append(time.perf_counter() - t0)
        subprocess.run(["scancel", jid], check=False)
    return statistics.median(ts)


def bare_sacct(ids: list[str], k: int = 5) -> float:
    ts = []
    for _ in range(k):
        t0 = time.perf_counter()
        subprocess.run(
            ["sacct", "-X", "-n", "-P", "-o", "JobID,State", "-j", ",".join(ids)],
            check=True,
            capture_output=True,
        )
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def run(n: int, executor: str, work: Path) -> None:
    from mimo_jobs.store import connection as store
    from mimo_jobs.study.expand import runs_of
    from mimo_jobs.study.load import parse_study
    from mimo_jobs.submit import service, status

    name = f"bench_{executor}_{n}"
    spec = parse_study(study_doc(name, n, executor))
    runs = runs_of(spec)
    db = work / f"{name}.duckdb"
    con = store.connect(db)
    ex = service.executor(executor)

    t0 = time.perf_counter()
    sel = service.plan_submit(con, runs, force=False)
    prepared = service.prepare(sel.submit, work / "runs", executor, FAKE_TEMPLATES)
    t_render = time.perf_counter() - t0
    sched = []
    orig = ex.submit

    def timed_submit(*a, **k):
        s = time.perf_counter()
        try:
            return orig(*a, **k)
        finally:
            sched.append(time.perf_counter() - s)

    ex.submit = timed_submit  # type: ignore[method-assign]
    t1 = time.perf_counter()
    subs = service.submit_runs(con, spec, None, prepared, sel, ex)
    t_submit = time.perf_counter() - t1
    ex.submit = orig  # type: ignore[method-assign]
    t_sched = sum(sched)
    total = t_render + t_submit
    print(f"\n== N={n} runs, executor {executor}")
    print(
        f"submit total {total:7.3f} s  = {1e3 * total / n:6.1f} ms/run  (render {1e3 * t_render / n:5.1f}, "
        f"scheduler {1e3 * t_sched / n:5.1f}, store+intent {1e3 * (t_submit - t_sched) / n:5.1f} ms/run)"
    )
    if executor == "slurm":
        floor = bare_sbatch()
        print(
            f"  bare `sbatch --wrap true`: {1e3 * floor:5.1f} ms/job -> mimo-jobs submit costs "
            f"{total / n / floor:4.2f}x the scheduler floor per run"
        )

    lat, sac = [], []
    for _ in range(5):
        s0, c0 = getattr(ex, "sacct_s", 0.0), time.perf_counter()
        service.refresh(con, name)
        status.run_statuses(con, name)
        lat.append(time.perf_counter() - c0)
        sac.append(getattr(ex, "sacct_s", 0.0) - s0)
    med, med_s = statistics.median(lat), statistics.median(sac)
    print(
        f"status latency {1e3 * med:7.1f} ms (median of 5; sacct/squeue {1e3 * med_s:6.1f} ms, "
        f"store+policy {1e3 * (med - med_s):6.1f} ms) for {n} active jobs"
    )
    if executor == "slurm":
        floor = bare_sacct([s.job_id for s in subs])
        print(
            f"  bare `sacct -j <{n} ids>`: {1e3 * floor:5.1f} ms -> status costs {med / floor:4.2f}x one sacct call"
        )
    con.close()
    c0 = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "mimo_jobs.cli", "status", name, "--db", str(db)],
        check=True,
        capture_output=True,
    )
    print(
        f"`mimo-jobs status` CLI wall time (fresh process, imports included): {time.perf_counter() - c0:5.2f} s"
    )
    con = store.connect(db)
    service.cancel(con, name)
    con.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, nargs="+", default=[3, 30])
    ap.add_argument("--executor", choices=["slurm", "local"], default="slurm")
    a = ap.parse_args()
    if (
        a.executor == "slurm"
        and subprocess.run(["scontrol", "ping"], capture_output=True, check=False).returncode
    ):
        sys.exit("no SLURM controller answers: start it with `bash tests/slurm/cluster.sh` (as root)")
    with tempfile.TemporaryDirectory(prefix="mimo-bench-") as d:
        for n in a.n:
            run(n, a.executor, Path(d))
    print(
        yaml.safe_dump(
            {"note": "figures depend on the machine's load; compare ratios within one run"}
        ).strip()
    )


if __name__ == "__main__":
    main()

"""CLI start-up: wall time of `mimo-jobs --help` and `mimo-jobs validate <production study>` against
`python -c pass`, and proof that neither imports a heavy module (HEAVY below: torch, megatron, energon,
transformer_engine, numpy, einops, duckdb).

    python benchmarks/cli_startup.py [--reps 7]

Prints medians (and min) over the repetitions and the ratio to the bare interpreter start measured in the
same run, then the heavy modules found in sys.modules after each command ran in-process (must be none),
and the top imports by cumulative time from `python -X importtime`.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROD = REPO / "studies" / "scale_33n_68n_100n.yaml"
HEAVY = (
    "torch",
    "megatron",
    "megatron.core",
    "megatron.energon",
    "transformer_engine",
    "numpy",
    "einops",
    "duckdb",
    "kubernetes",  # the Kubernetes executor imports its client when a job is submitted or followed
    "kubeflow_trainer_api",
)

# Runs the CLI in-process (as the console script does), then reports which heavy modules got imported.
PROBE = r"""
import sys
from mimo_jobs.cli.app import app
try:
    app(sys.argv[1:], standalone_mode=False)
except SystemExit:
    pass
heavy = sorted(m for m in sys.modules if m.split('.')[0] in {h.split('.')[0] for h in @HEAVY@})
print("HEAVY:" + ",".join(heavy))
""".replace("@HEAVY@", repr(HEAVY))


def timed(cmd: list[str], reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    py = sys.executable
    cli = [py, "-m", "mimo_jobs.cli"]
    cases = {
        "python -c pass (baseline)": [py, "-c", "pass"],
        "python -c 'import torch' (for scale)": [py, "-c", "import torch"],
        "mimo-jobs --help": cli + ["--help"],
        "mimo-jobs validate <production>": cli + ["validate", str(PROD)],
        "mimo-jobs validate --json <production>": cli + ["validate", "--json", str(PROD)],
    }
    timed(cases["python -c pass (baseline)"], 2)  # warm the page cache
    results = {name: timed(cmd, args.reps) for name, cmd in cases.items()}
    base = statistics.median(results["python -c pass (baseline)"])
    print(
        f"CLI start-up, {args.reps} repetitions each (median / min wall seconds, ratio of medians to baseline)"
    )
    for name, ts in results.items():
        med = statistics.median(ts)
        print(f"  {name:42s} {med:7.3f} s  (min {min(ts):.3f})  x{med / base:6.1f}")

    print("\nHeavy modules imported by the command itself (must be none):")
    ok = True
    for argv in (["--help"], ["validate", str(PROD)]):
        r = subprocess.run([py, "-c", PROBE, *argv], capture_output=True, text=True, check=False)
        line = [x for x in r.stdout.splitlines() if x.startswith("HEAVY:")]
        heavy = line[0][len("HEAVY:") :] if line else "<probe failed: " + r.stderr[-300:] + ">"
        ok &= heavy == ""
        print(f"  mimo-jobs {argv[0]:10s} -> {heavy or 'none'}")

    r = subprocess.run(
        [py, "-X", "importtime", "-m", "mimo_jobs.cli", "validate", str(PROD)],
        capture_output=True,
        text=True,
        check=False,
    )
    rows = []
    for line in r.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            _, cum, name = (x.strip() for x in line[len("import time:") :].split("|"))
            if cum.isdigit():
                rows.append((int(cum), name))
    names = {n.strip() for _, n in rows}
    bad = sorted(n for n in names if n.split(".")[0] in {h.split(".")[0] for h in HEAVY})
    ok &= not bad
    print(f"\n-X importtime of validate: {len(rows)} modules; heavy ones: {bad or 'none'}; top cumulative:")
    for cum, name in sorted(rows, reverse=True)[:8]:
        print(f"  {cum / 1000:8.1f} ms  {name}")
    roots = "/".join(dict.fromkeys(h.split(".")[0] for h in HEAVY))
    print("\nRESULT:", f"OK, no {roots} at start-up" if ok else "FAIL: heavy imports found")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

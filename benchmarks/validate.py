"""`mimo-jobs validate` of a study of many runs (default 10,000: 100 points x 100 repeats), timed in this
process: the default table (the first rows and a summary), the whole table (--all, the baseline) and
--json. Prints seconds and the ratio to the baseline; never run by the test suite.

    python benchmarks/validate.py [--points 100] [--repeats 100]
"""

from __future__ import annotations

import argparse
import io
import sys
import tempfile
import time
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def study_text(points: int, repeats: int) -> str:
    rows = "\n".join(f"    - {{nodes: {n}, gbs: {(n - 1) * 8 * 4}}}" for n in range(2, points + 2))
    return (
        "name: big\ncluster: {executor: slurm, gpus_per_node: 8}\ntrainer: {model: tiny, train_iters: 10}\n"
        f"matrix:\n  defaults: {{encoder: {{dp: 8}}, repeats: {repeats}}}\n  points:\n{rows}\n"
    )


def timed(argv: list[str]) -> float:
    from typer.testing import CliRunner

    from mimo_jobs.cli.app import app

    t0 = time.perf_counter()
    with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
        r = CliRunner().invoke(app, argv)
    took = time.perf_counter() - t0
    assert r.exit_code == 0, r.output[-2000:]
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--points", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=100)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "big.yaml"
        path.write_text(study_text(a.points, a.repeats))
        timed(["validate", str(path)])  # warm: imports, pydantic schemas
        base = timed(["validate", str(path), "--all"])
        table = timed(["validate", str(path)])
        js = timed(["validate", str(path), "--json"])
    n = a.points * a.repeats
    print(f"validate of a {n:,}-run study: whole table (--all) {base:.2f} s (baseline)")
    print(f"  default table (first rows + summary) {table:.2f} s = {table / base:.3f}x of the baseline")
    print(f"  --json {js:.2f} s = {js / base:.3f}x of the baseline")


if __name__ == "__main__":
    main()

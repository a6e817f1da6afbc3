"""The hostile inputs of `plan`, `predict` and `report` (tests/predict/test_hostile_predict.py,
tests/hostile/test_hostile_stores.py), each timed as its own `mimo-jobs` process: a node count past the
study's bound, a 10,000-run study, a store of an older schema, a store of zero and infinite iteration times,
another application's DuckDB file. Prints seconds per case (each should take a few at most); never run by
the test suite.

    python benchmarks/hostile_results.py
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from validate import study_text  # noqa: E402

LOG = REPO / "tests" / "ingest" / "fixtures" / "slurm-4242.out"
PROD = REPO / "studies" / "scale_33n_68n_100n.yaml"


def cli(*argv: str) -> tuple[float, int]:
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "mimo_jobs.cli", *argv], capture_output=True)
    return time.perf_counter() - t0, p.returncode


def altered(src: Path, dst: Path, *stmts: str) -> Path:
    import duckdb

    shutil.copy(src, dst)
    con = duckdb.connect(str(dst))
    for s in stmts:
        con.execute(s)
    con.close()
    return dst


def main() -> None:
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        db = tmp / "real.duckdb"
        cli("ingest", str(LOG), "--db", str(db))
        big = tmp / "big.yaml"
        big.write_text(study_text(100, 100))
        old = altered(
            db,
            tmp / "v4.duckdb",
            "DROP TABLE rank_memory",
            "ALTER TABLE iterations DROP COLUMN pipeline_wait_ms",
            "UPDATE meta SET value = '4' WHERE key = 'schema_version'",
        )
        zero = altered(db, tmp / "zero.duckdb", "UPDATE iterations SET elapsed_ms = 0")
        inf = altered(db, tmp / "inf.duckdb", "UPDATE iterations SET elapsed_ms = 'inf'::DOUBLE")
        other = tmp / "other.duckdb"
        altered(db, other, *[f"DROP TABLE {t}" for t in ("meta", "runs", "jobs", "studies")])
        cases = {
            "plan --nodes 2147483647": ["plan", "--nodes", "2147483647", "--from", str(PROD)],
            "plan --nodes 10^12": ["plan", "--nodes", str(10**12), "--from", str(PROD)],
            "predict, 10,000 runs": ["predict", str(big)],
            "validate, 10,000 runs (reference)": ["validate", str(big)],
            "report, schema-4 store": ["report", "--db", str(old)],
            "report -f json, zero times": ["report", "--db", str(zero), "-f", "json"],
            "report -f html, infinite times": ["report", "--db", str(inf), "-f", "html", "--out", str(tmp)],
            "status, another application's DuckDB": ["status", "--db", str(other)],
        }
        for name, argv in cases.items():
            took, rc = cli(*argv)
            print(f"{name:40s} {took:6.2f} s  exit {rc}")


if __name__ == "__main__":
    main()

"""Helpers for the submission tests: write small studies, run the real CLI, wait for jobs in the store."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

from helpers import TESTS

FAKE_TEMPLATES = TESTS / "submit" / "fake_templates"


def write_study(
    path: Path,
    name: str,
    points: list[dict],
    env: dict | None = None,
    executor: str = "local",
    time_limit: str = "00:05:00",
    max_retries: int = 0,
    gpus_per_node: int = 2,
    train_iters: int = 2,
    signal: str = "USR2@60",
    lr: float | None = None,
) -> Path:
    doc = {
        "name": name,
        "cluster": {
            "executor": executor,
            "partition": "debug" if executor == "slurm" else None,
            "accelerator": "cpu",
            "gpus_per_node": gpus_per_node,
            "time_limit": time_limit,
            "exclusive": False,
            "requeue": False,
            "max_retries": max_retries,
            "signal": signal,
            "env": {k: str(v) for k, v in (env or {}).items()},
        },
        "trainer": {"model": "tiny", "train_iters": train_iters, **({"lr": {"max": lr}} if lr else {})},
        "matrix": {"defaults": {"gbs": 6, "encoder": {"tp": 1, "dp": 1}, "llm": {"tp": 1}}, "points": points},
    }
    if executor != "slurm":
        del doc["cluster"]["partition"]
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def cli(
    *args: str, env: dict | None = None, timeout: float = 300, check: bool = False
) -> subprocess.CompletedProcess:
    """The real command line in a fresh process (as a user runs it)."""
    e = dict(os.environ, COLUMNS="250")  # wide tables, whatever width the runner's own COLUMNS says
    e.update(env or {})
    p = subprocess.run(
        [sys.executable, "-m", "mimo_jobs.cli", *map(str, args)],
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=e,
    )
    if check and p.returncode != 0:
        raise AssertionError(
            f"mimo-jobs {' '.join(map(str, args))} -> {p.returncode}\n{p.stdout}\n{p.stderr}"
        )
    return p


def query(db: Path, sql: str, params: list | None = None) -> list[tuple]:
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(sql, params or []).fetchall()
    finally:
        con.close()


def job_rows(db: Path, study: str) -> list[dict]:
    cols = [
        "run",
        "job_id",
        "executor",
        "attempt",
        "state",
        "reason",
        "exit_code",
        "submit_time",
        "start_time",
        "end_time",
        "node_list",
        "action",
        "next_job_id",
        "first_error",
        "log_path",
        "run_dir",
    ]
    rows = query(
        db,
        """SELECT r.name, j.job_id, j.executor, j.attempt, j.state, j.reason, j.exit_code,
                               j.submit_time, j.start_time, j.end_time, j.node_list, j.action, j.next_job_id,
                               j.first_error, j.log_path, r.run_dir
                        FROM jobs j JOIN runs r USING (run_id) WHERE r.study = ? ORDER BY r.name, j.attempt""",
        [study],
    )
    return [dict(zip(cols, r)) for r in rows]


def wait_until(
    db: Path,
    study: str,
    done,
    timeout: float,
    env: dict | None = None,
    every: float = 1.0,
    seen: dict | None = None,
) -> list[dict]:
    """Run `mimo-jobs status` (which polls the scheduler and applies the policy) until done(rows) holds.
    `seen` collects every (run, job) -> states observed along the way. `timeout` only catches a hang: it is
    never less than 5 minutes, whatever a caller expects, so a loaded machine cannot fail a test."""
    timeout = max(timeout, 300)
    deadline = time.monotonic() + timeout
    while True:
        cli("status", study, "--db", db, env=env, check=True)
        rows = job_rows(db, study)
        if seen is not None:
            for r in rows:
                states = seen.setdefault((r["run"], r["job_id"]), [])
                if not states or states[-1] != r["state"]:
                    states.append(r["state"])
        if rows and done(rows):
            return rows
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s; jobs: {rows}")
        time.sleep(every)


def all_ended(rows: list[dict]) -> bool:
    from mimo_jobs.submit.jobs_table import ACTIVE_STATES

    return all(r["state"] not in ACTIVE_STATES and r["action"] is not None for r in rows)


def submit_fake(ws: dict, study: Path, *extra: str, check: bool = True):
    """`mimo-jobs submit` of a study into a test workspace (store, runs root, env) with the FAKE templates."""
    return cli(
        "submit",
        study,
        "--db",
        ws["db"],
        "--runs-dir",
        ws["runs"],
        "--templates",
        FAKE_TEMPLATES,
        *extra,
        env=ws["env"],
        check=check,
    )

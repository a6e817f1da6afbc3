"""A real store of one study with one heterogeneous and two colocated layouts at 1 node, GBS 8 (run dirs
written by the study code, records ingested), each run's steady iteration time given by the test."""

from __future__ import annotations

from pathlib import Path

import yaml

from helpers.ingest_runs import record, write_jsonl
from mimo_jobs.contract.rundir import RunDir
from mimo_jobs.ingest import pipeline as ingest
from mimo_jobs.report import build
from mimo_jobs.store import connection as store
from mimo_jobs.study.expand import runs_of
from mimo_jobs.study.load import parse_study
from mimo_jobs.study.runspec import run_yaml_doc

HET, TP2, DP2 = "1n-e1x1-l1x1x1-g8", "1n-colo-l2x1x1-g8", "1n-colo-l1x1x2-g8"
DOC = {
    "name": "pairs",
    "cluster": {"executor": "slurm", "accelerator": "gpu", "gpus_per_node": 2},
    "trainer": {"model": "tiny", "train_iters": 12, "seq_length": 32},
    "matrix": {
        "defaults": {"nodes": 1, "gbs": 8},
        "points": [
            {"encoder": {"dp": 1}, "llm": {"dp": 1}},
            {"colocated": True, "llm": {"tp": 2}},
            {"colocated": True, "llm": {"dp": 2}},
        ],
    },
}


def build_report(tmp: Path, times: dict[str, float], doc: dict = DOC, prepare=None, **kw):
    """A store of the study `doc` whose runs have the steady iteration times `times` (ms), and its report
    (build's keywords `kw`); `prepare(con, runs by name)` runs on the store before the report is built."""
    runs = runs_of(parse_study(doc, env={}))
    assert sorted(r.name for r in runs) == sorted(times)
    for run in runs:
        rd = RunDir.of(tmp / "runs", run.study, run.name, run.run_id)
        rd.logs.mkdir(parents=True)
        rd.run_yaml.write_text(yaml.safe_dump(run_yaml_doc(run, rd.root, {"version": "test"})))
        t = times[run.name]
        recs = [record(run, "7", 0, i, 1000.0 if i == 1 else t, 5.0 - 0.1 * i, {}) for i in range(1, 13)]
        write_jsonl(rd.metrics, recs)
    con = store.connect(tmp / "s.duckdb")
    try:
        ingest.ingest_paths(con, [tmp / "runs"])
        if prepare is not None:
            prepare(con, {r.name: r for r in runs})
        return build(con, doc["name"], **kw)
    finally:
        con.close()


def with_failed_first_attempts(tmp: Path, doc: dict = DOC):
    """A `prepare` for build_report: before the study's runs, every point had a first attempt that failed
    (the study file then said train_iters 20: another run id under the same name). Its run dirs are
    written and ingested like the others (three iterations each); the scheduler's jobs say the failed
    attempts (job 6) were submitted an hour before the runs that completed (job 7)."""
    from datetime import datetime

    from mimo_jobs.submit import jobs_table
    from mimo_jobs.submit.jobs_table import JobFacts

    first = runs_of(parse_study({**doc, "trainer": {**doc["trainer"], "train_iters": 20}}, env={}))

    def prepare(con, runs: dict) -> None:
        for run in first:
            rd = RunDir.of(tmp / "first", run.study, run.name, run.run_id)
            rd.logs.mkdir(parents=True)
            rd.run_yaml.write_text(yaml.safe_dump(run_yaml_doc(run, rd.root, {"version": "test"})))
            write_jsonl(rd.metrics, [record(run, "6", 0, i, 1000.0, 9.0, {}) for i in range(1, 4)])
        ingest.ingest_paths(con, [tmp / "first"])
        for rid, job, hour, state, code in [
            *((r.run_id, "6", 9, "FAILED", 1) for r in first),
            *((r.run_id, "7", 10, "COMPLETED", 0) for r in runs.values()),
        ]:
            at = datetime(2026, 1, 1, hour)
            jobs_table.insert_job(con, rid, job, "slurm", 0, None, None, submit_time=at, state="PENDING")
            jobs_table.update_facts(con, rid, JobFacts(job, state, code, at, at, at))

    return prepare, {r.name: r.run_id for r in first}

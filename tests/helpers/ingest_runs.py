"""Helpers that build real run dirs (run.yaml written by the study code) and trainer metrics for tests."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from helpers import TESTS
from mimo_jobs.contract.iteration import IterationRecord
from mimo_jobs.contract.rundir import RunDir
from mimo_jobs.study.expand import runs_of
from mimo_jobs.study.load import parse_study
from mimo_jobs.study.runspec import RunSpec, run_yaml_doc

FIXTURES = TESTS / "ingest" / "fixtures"


def require_ext() -> None:
    """The compiled scanner is optional for users, but CI (MIMO_JOBS_REQUIRE_EXT=1) must test it."""
    from mimo_jobs.ingest import readers

    if not readers.HAVE_COMPILED:
        if os.environ.get("MIMO_JOBS_REQUIRE_EXT") == "1":
            pytest.fail("mimo_jobs.ingest._logscan is not built (pip install -e . needs a C compiler)")
        pytest.skip("mimo_jobs.ingest._logscan not built")


def study_doc(
    name: str = "scal",
    nodes=(1, 2, 4),
    gbs: int = 8,
    train_iters: int = 20,
    scaling: str = "strong",
    model: str = "tiny",
    seq_length: int = 64,
) -> dict:
    # Two "GPUs" per node: the encoder gets half of the ranks, the LLM the other half (enc_dp = llm_dp).
    return {
        "name": name,
        "scaling": scaling,
        "cluster": {"executor": "slurm", "accelerator": "gpu", "gpus_per_node": 2},
        "trainer": {"model": model, "train_iters": train_iters, "seq_length": seq_length},
        "matrix": {"points": [{"nodes": n, "gbs": gbs, "encoder": {"dp": n}} for n in nodes]},
    }


def make_runs(root: Path, **kw) -> list[tuple[RunSpec, RunDir]]:
    spec = parse_study(study_doc(**kw), env={})
    out = []
    for run in runs_of(spec):
        rd = RunDir.of(root, run.study, run.name, run.run_id)
        rd.root.mkdir(parents=True, exist_ok=True)
        rd.logs.mkdir(exist_ok=True)
        rd.run_yaml.write_text(yaml.safe_dump(run_yaml_doc(run, rd.root, {"version": "test"})))
        out.append((run, rd))
    return out


def record(
    run: RunSpec,
    job: str,
    attempt: int,
    it: int,
    elapsed_ms: float,
    loss: float,
    phases: dict | None = None,
    time: str | None = None,
) -> dict:
    gbs = run.layout.gbs
    return IterationRecord(
        kind="iteration",
        run_id=run.run_id,
        job_id=job,
        attempt=attempt,
        time=time or f"2026-01-01T00:{it // 60:02d}:{it % 60:02d}Z",
        iteration=it,
        train_iters=run.trainer.train_iters,
        consumed_samples=gbs * it,
        elapsed_ms=elapsed_ms,
        lr=1e-4,
        gbs=gbs,
        loss=loss,
        grad_norm=1.0,
        phases_ms=phases or {},
    ).to_json()


def write_jsonl(path: Path, records: list[dict], tail: bytes = b"") -> None:
    with open(path, "ab") as f:
        for r in records:
            f.write((json.dumps(r) + "\n").encode())
        f.write(tail)

"""Helpers for the trainer tests: run.yaml from a study dict, real torchrun launches, metrics reading."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import yaml

from helpers import STUDIES
from helpers.launch import trainer, worker_env
from mimo_jobs.study.expand import runs_of
from mimo_jobs.study.load import parse_study
from mimo_jobs.study.runspec import run_yaml_doc

# The packaged study of several encoder modules (a vision tower and a Whisper-class audio encoder, colocated):
# its model and mock data are what every vision+audio trainer test runs.
OMNI_STUDY = STUDIES / "cpu_omni.yaml"
_OMNI = yaml.safe_load(OMNI_STUDY.read_text())["trainer"]
OMNI, OMNI_DATA = _OMNI["model"], _OMNI["data"]


def study_run_yaml(out: Path, study: Path, index: int, **trainer) -> Path:
    """run.yaml of the study's run `index`, with these trainer settings changed (e.g. train_iters)."""
    doc = yaml.safe_load(study.read_text())
    doc["trainer"].update(trainer)
    run = runs_of(parse_study(doc, env={}))[index]
    out.mkdir(parents=True, exist_ok=True)
    p = out / "run.yaml"
    p.write_text(yaml.safe_dump(run_yaml_doc(run, out), sort_keys=False))  # the modules in the study's order
    return p


def make_run_yaml(
    out: Path,
    *,
    gpn: int,
    gbs: int,
    mbs: int = 1,
    enc: dict | None = None,
    llm: dict | None = None,
    model: str | dict = "tiny",
    iters: int = 3,
    trainer: dict | None = None,
    data: dict | None = None,
    colocated: bool = False,
) -> Path:
    t = {
        "model": model,
        "seq_length": 32,
        "train_iters": iters,
        "lr": {"schedule": "cosine", "max": 1e-3, "min": 1e-4, "warmup_samples": 2 * gbs},
        "optimizer": {"name": "adam", "eps": 1e-8, "clip_grad": 1.0},
        "timeout_s": 60,
    }
    if data:
        t["data"] = data
    t.update(trainer or {})
    s = parse_study(
        {
            "name": "tr",
            "cluster": {"executor": "local", "gpus_per_node": gpn, "accelerator": "cpu"},
            "trainer": t,
            "matrix": {
                "points": [
                    {
                        "nodes": 1,
                        **_encoder_sizes(model, enc),
                        "llm": llm or {},
                        "gbs": gbs,
                        "mbs": mbs,
                        "colocated": colocated,
                    }
                ]
            },
        }
    )
    run = runs_of(s)[0]
    out.mkdir(parents=True, exist_ok=True)
    p = out / "run.yaml"
    p.write_text(yaml.safe_dump(run_yaml_doc(run, out)))
    return p


def _encoder_sizes(model, enc: dict | None) -> dict:
    """The point's encoder sizes: `encoder` of a one-encoder model; a model of several encoder modules
    (trainer.model.encoders) sizes each by name (`enc`: {name: sizes}; none for a colocated point)."""
    if isinstance(model, dict) and "encoders" in model:
        return {"encoders": enc} if enc else {}
    return {"encoder": enc or {}}


def run_reference(run_yaml: Path, metrics: Path, timeout: int = 240) -> subprocess.CompletedProcess:
    return subprocess.run(
        trainer(run_yaml, "--reference", "--metrics", str(metrics)),
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=worker_env(),
    )


def run_torchrun(
    run_yaml: Path, nproc: int, metrics: Path, timeout: int = 300
) -> subprocess.CompletedProcess:
    return subprocess.run(
        trainer(run_yaml, "--metrics", str(metrics), nproc=nproc),
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=worker_env(),
    )


def iterations(metrics: Path) -> list[dict]:
    return [r for r in map(json.loads, metrics.read_text().splitlines()) if r["kind"] == "iteration"]


def assert_ok(p: subprocess.CompletedProcess, what: str) -> None:
    assert p.returncode == 0, f"{what} failed (rc={p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-6000:]}"


def launch_run(run_yaml: Path, metrics: Path, reference: bool, nproc: int) -> subprocess.CompletedProcess:
    """The launcher of the test-run-wide cache (helpers.runs): the reference or a torchrun world."""
    return run_reference(run_yaml, metrics) if reference else run_torchrun(run_yaml, nproc, metrics)

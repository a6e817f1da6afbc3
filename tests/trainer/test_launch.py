"""Bad launches and failing ranks end the job with one clear message, on every rank, without a hang."""

from __future__ import annotations

import os
import subprocess

import pytest
import yaml

from helpers.launch import free_port, trainer, worker_env
from helpers.trainer import iterations, make_run_yaml, run_reference, run_torchrun


def _spawn_ranks(run_yaml, world: int):
    """Start `world` trainer processes by hand (what torchrun would do), so each rank's exit is observed."""
    port = str(free_port())
    procs = []
    for r in range(world):
        env = dict(
            worker_env(),
            WORLD_SIZE=str(world),
            RANK=str(r),
            LOCAL_RANK=str(r),
            LOCAL_WORLD_SIZE=str(world),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=port,
        )
        procs.append(
            subprocess.Popen(
                trainer(run_yaml),
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    return [(p, *p.communicate(timeout=120)) for p in procs]


def test_wrong_world_size_exits_on_every_rank_with_one_message(tmp_path):
    ry = make_run_yaml(tmp_path / "run", gpn=3, gbs=4, enc={"dp": 1}, llm={"dp": 2})  # needs 3 ranks
    res = _spawn_ranks(ry, 2)
    assert [p.returncode for p, _, _ in res] == [2, 2]
    msgs = [line for _, _, err in res for line in err.splitlines() if "mimo-jobs trainer: error" in line]
    assert len(msgs) == 1, [err for _, _, err in res]
    assert "WORLD_SIZE=2" in msgs[0] and "needs 3 ranks" in msgs[0] and "--nproc-per-node 3" in msgs[0]
    assert not (tmp_path / "run" / "metrics.jsonl").exists()  # nothing half-written


@pytest.mark.slow  # multi-process or real jobs: CI runs it, the fast local default does not
def test_unsupported_and_tampered_run_yaml_are_refused(tmp_path):
    # the encoder is one stage: a pipelined encoder is refused by the trainer too, with what fits
    ry = make_run_yaml(tmp_path / "pp", gpn=3, gbs=4, enc={"dp": 1}, llm={"dp": 2})
    doc = yaml.safe_load(ry.read_text())
    doc["run"]["layout"].update(enc_pp=2, llm_dp=1)  # still 3 ranks
    ry.write_text(yaml.safe_dump(doc))
    p = run_reference(ry, tmp_path / "m.jsonl")
    assert p.returncode == 2 and "encoder.pp=2" in p.stderr and "encoder.pp=1" in p.stderr, p.stderr[-2000:]

    ry = make_run_yaml(tmp_path / "t", gpn=3, gbs=4, enc={"dp": 1}, llm={"dp": 2})
    doc = yaml.safe_load(ry.read_text())
    doc["plan"]["num_microbatches"] = 7
    ry.write_text(yaml.safe_dump(doc))
    p = run_reference(ry, tmp_path / "m.jsonl")
    assert p.returncode == 2 and "stored plan does not match" in p.stderr and "num_microbatches" in p.stderr
    assert not (tmp_path / "m.jsonl").exists()


@pytest.mark.slow  # multi-process or real jobs: CI runs it, the fast local default does not
def test_one_failing_rank_ends_the_job_naming_it(tmp_path):
    # a collective timeout of 5 minutes: the job must end long before it through torchrun's teardown
    ry = make_run_yaml(
        tmp_path / "run", gpn=3, gbs=4, enc={"dp": 1}, llm={"dp": 2}, iters=4, trainer={"timeout_s": 300}
    )
    os.environ["MIMO_JOBS_TRAINER_FAIL"] = "0:2"  # the encoder rank, before iteration 2
    try:
        p = run_torchrun(ry, 3, tmp_path / "m.jsonl", timeout=150)
    finally:
        del os.environ["MIMO_JOBS_TRAINER_FAIL"]
    assert p.returncode != 0
    assert "mimo-jobs trainer: rank 0 failed: RuntimeError: injected failure" in p.stderr
    its = [line for line in (tmp_path / "m.jsonl").read_text().splitlines() if '"iteration"' in line]
    assert (
        len([x for x in its if '"kind": "iteration"' in x]) == 1
    )  # iteration 1 completed, then the job ended


def test_garbage_run_yaml_is_one_clear_error(tmp_path):
    bad = tmp_path / "run.yaml"
    bad.write_text("run: {study: x}\n")
    p = run_reference(bad, tmp_path / "m.jsonl")
    assert p.returncode == 2
    assert f"{bad}: not a valid run.yaml (KeyError: 'name')" in p.stderr
    assert "Traceback" not in p.stderr


@pytest.mark.slow  # a one-process trainer run: CI runs it, the fast local default does not
def test_a_run_that_only_makes_nan_stops_with_one_line(tmp_path):
    # a learning rate of 1e30 blows the weights up after the first step: every later iteration is NaN and
    # skipped, so the run is not training; it stops after 3 of them instead of reporting success
    trainer = {"lr": {"schedule": "constant", "max": 1e30}, "optimizer": {"name": "sgd"}}
    ry = make_run_yaml(tmp_path / "run", gpn=2, gbs=2, iters=8, colocated=True, trainer=trainer)
    p = run_reference(ry, tmp_path / "m.jsonl")
    assert p.returncode == 1, p.stderr[-2000:]
    errors = [ln for ln in p.stderr.splitlines() if "error" in ln.lower()]
    assert errors == [
        "mimo-jobs trainer: error: iterations 2-4 all had a NaN/Inf loss or gradient and were skipped: the model "
        "is not training (check the starting weights, trainer.init, the learning rate and the data)"
    ], p.stderr[-2000:]
    recs = iterations(tmp_path / "m.jsonl")
    assert [(r["iteration"], r["nan"], r["skipped"]) for r in recs] == [
        (1, 0, 0),
        (2, 1, 1),
        (3, 1, 1),
        (4, 1, 1),
    ]

"""A study holding a packaged-trainer point and a point running its own program (tests/external/
megatron_gpt_trainer.py, written on megatron-core alone) at the same layout, end to end on this machine:
`submit --executor local --wait`, `status` (the program's own checkpoint), `ingest` (its iteration lines
with their TFLOP/s/GPU), `report` (both runs side by side); then a second submission with more iterations
resumes the program from its own --load."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from helpers.submit import cli, query

pytestmark = pytest.mark.slow

TRAINER = Path(__file__).parent / "megatron_gpt_trainer.py"
COMMAND = (
    "{{ python }} " + str(TRAINER) + " --tensor-model-parallel-size {{ llm.tp }}"
    " --pipeline-model-parallel-size {{ llm.pp }} --expert-model-parallel-size {{ llm.ep }}"
    " --global-batch-size {{ gbs }} --micro-batch-size {{ mbs }} --seq-length {{ seq_length }}"
    " --train-iters {{ train_iters }} --seed {{ seed }} --save {{ checkpoint_dir }} --load {{ checkpoint_dir }}"
    " --save-interval 2"
)


def study(path: Path, iters: int) -> Path:
    point = {"nodes": 1, "colocated": True, "gbs": 4, "llm": {"tp": 1}}
    doc = {
        "name": "byo",
        "cluster": {
            "executor": "local",
            "accelerator": "cpu",
            "gpus_per_node": 2,
            "time_limit": "00:10:00",
            "exclusive": False,
            "requeue": False,
            "max_retries": 0,
            "python": sys.executable,
            "env": {"OMP_NUM_THREADS": "1"},
        },
        "trainer": {"model": "tiny", "seq_length": 32, "train_iters": iters, "timeout_s": 120},
        "matrix": {"points": [point, {**point, "command": COMMAND}]},
    }
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def test_own_program_beside_the_packaged_trainer_end_to_end(tmp_path):
    db, runs = tmp_path / "s.duckdb", tmp_path / "runs"
    common = ("--db", db, "--runs-dir", runs)
    f = study(tmp_path / "byo.yaml", 4)
    p = cli("submit", f, "--executor", "local", "--wait", *common, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    (own_dir,) = runs.glob("byo/*-cmd-*")
    assert (own_dir / "checkpoints" / "latest_checkpointed_iteration.txt").read_text() == "4"

    from mimo_jobs.store.connection import connect
    from mimo_jobs.submit.status import run_statuses

    con = connect(db, read_only=True)
    try:
        statuses = {s.run: s for s in run_statuses(con, "byo")}
    finally:
        con.close()
    own_status = next(s for name, s in statuses.items() if name.endswith("-cmd"))
    assert own_status.checkpoint == 4 and own_status.job.state == "COMPLETED", own_status

    cli("ingest", runs, "--db", db, check=True)
    got = query(
        db,
        """SELECT r.name, count(*), max(i.iteration), count(i.tflops_per_gpu), min(i.loss)
           FROM iterations i JOIN runs r USING (run_id) GROUP BY r.name ORDER BY r.name""",
    )
    by_name = {g[0]: g[1:] for g in got}
    own_name = next(n for n in by_name if n.endswith("-cmd"))
    packaged = next(n for n in by_name if not n.endswith("-cmd"))
    assert by_name[own_name][:3] == (4, 4, 4)  # every iteration line, each with its own TFLOP/s/GPU
    assert by_name[packaged][1] == 4
    assert 0 < by_name[own_name][3] < 10  # a cross-entropy over 64 tokens

    rep = cli("report", "byo", "--db", db, "--format", "json", check=True)
    text = rep.stdout
    assert own_name in text and packaged in text
    doc = json.loads(text)
    (pair,) = doc["program_pairs"]  # the two programs at one layout, side by side
    assert (pair["command_run"], pair["packaged_run"]) == (own_name, packaged)
    own_row = next(r for r in doc["runs"] if r["name"] == own_name)
    assert pair["time_ratio"] == pytest.approx(own_row["t_median_ms"] / pair["packaged_ms"])
    assert pair["loss_max_rel_diff"] is not None  # both logged consumed samples
    assert own_row["program"] == "own command" and own_row["log_tflops_per_gpu"] is not None

    # the dry run shows the command each node's torchrun would run (on a fresh store: completed runs are
    # never submitted again, --force included)
    fresh = ("--db", tmp_path / "dry.duckdb", "--runs-dir", tmp_path / "dry-runs")
    p = cli("submit", f, "--executor", "local", "--dry-run", *fresh, check=True)
    assert "training command" in p.stdout and "--train-iters 4" in p.stdout


def test_own_program_stopped_by_its_deadline_is_requeued_and_resumes_from_its_checkpoint(tmp_path):
    """MIMO_JOB_DEADLINE in the past: the program saves after every iteration, writes the requeue marker and
    exits; launch.sh exits 75, the policy requeues, and each attempt resumes from the program's own --load."""
    db, runs = tmp_path / "s.duckdb", tmp_path / "runs"
    f = study(tmp_path / "rq.yaml", 3)
    doc = yaml.safe_load(f.read_text())
    own = doc["matrix"]["points"][1]
    own["command"] = "env MIMO_JOB_DEADLINE=1 " + own["command"]
    doc["matrix"]["points"] = [own]
    f.write_text(yaml.safe_dump(doc, sort_keys=False))
    p = cli("submit", f, "--executor", "local", "--wait", "--db", db, "--runs-dir", runs, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    jobs = query(db, "SELECT attempt, state, exit_code, action FROM jobs ORDER BY attempt")
    assert [j[1] for j in jobs] == ["FAILED", "FAILED", "COMPLETED"] or len(jobs) == 3, jobs
    assert [j[3] for j in jobs][:2] == ["requeue", "requeue"], jobs
    cli("ingest", runs, "--db", db, check=True)
    its = query(db, "SELECT iteration FROM iterations WHERE NOT coalesce(superseded, false) ORDER BY 1")
    assert [i[0] for i in its] == [1, 2, 3]
    logs = "".join(p.read_text() for p in runs.rglob("local-*.out"))
    assert logs.count("successfully loaded checkpoint") == 2, logs[-3000:]

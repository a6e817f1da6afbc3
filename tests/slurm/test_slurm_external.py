"""A program of its own (tests/external/megatron_gpt_trainer.py, on megatron-core alone) on the real local
SLURM cluster, next to the packaged trainer's tests: it ignores the warning signal and the deadline and only
saves every 2 iterations, like a Megatron-LM run without --exit-signal-handler. Its job reaches the time
limit (TIMEOUT); the policy sees Megatron's tracker file in the checkpoint directory and requeues the run;
the next attempt resumes from the program's own --load and completes. The store holds one curve 1..N."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from helpers.submit import all_ended, cli, query, wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

ITERS = 16
TRAINER = Path(__file__).resolve().parents[1] / "external" / "megatron_gpt_trainer.py"


def test_own_program_reaching_the_time_limit_is_requeued_from_its_own_checkpoint(slurm_cluster, tmp_path):
    db, runs = tmp_path / "store.duckdb", tmp_path / "runs"
    doc = {
        "name": "sl_external",
        "cluster": {
            "executor": "slurm",
            "partition": slurm_cluster["partition"],
            "accelerator": "cpu",
            "gpus_per_node": 2,
            "time_limit": "00:02:00",
            "exclusive": False,
            "requeue": False,
            "max_retries": 0,
            "python": sys.executable,
            "env": {"OMP_NUM_THREADS": "1"},
        },
        "trainer": {
            "seq_length": 32,
            "train_iters": ITERS,
            # Until it has resumed from a checkpoint of its own, 10 s per iteration: 16 (160 s) never fit in the two-minute
            # limit, however fast the start-up, and its first save (iteration 2, 20 s) fits with 100 s to spare
            # for starting under load. Resumed, it runs at full speed: the rest fits in any later attempt,
            # far inside the policy's bound on timeouts.
            "command": f"{{{{ python }}}} {TRAINER} --tensor-model-parallel-size {{{{ llm.tp }}}}"
            " --global-batch-size {{ gbs }} --micro-batch-size {{ mbs }} --seq-length {{ seq_length }}"
            " --train-iters {{ train_iters }} --save {{ checkpoint_dir }} --load {{ checkpoint_dir }}"
            " --save-interval 2 --sleep-per-iter 10 --sleep-until-resumed --no-requeue-contract",
        },
        "matrix": {"points": [{"nodes": 1, "colocated": True, "gbs": 4, "llm": {"tp": 1}}]},
    }
    study = tmp_path / "sl_external.yaml"
    study.write_text(yaml.safe_dump(doc, sort_keys=False))
    out = cli("submit", study, "--db", db, "--runs-dir", runs, check=True).stdout
    assert out.count("as slurm job") == 1

    rows = wait_until(
        db, "sl_external", lambda rs: all_ended(rs) and rs[-1]["action"] in ("done", "final"), 1800, every=3
    )
    first, *_, last = rows
    assert (first["state"], first["action"]) == ("TIMEOUT", "requeue"), rows
    assert (last["state"], last["action"]) == ("COMPLETED", "done"), rows
    rd = Path(last["run_dir"])
    assert (rd / "checkpoints" / "latest_checkpointed_iteration.txt").read_text() == str(ITERS)
    logs = "".join(f.read_text(errors="replace") for f in rd.rglob("*.out"))
    logs += "".join(f.read_text(errors="replace") for f in (rd / "logs").rglob("*.log"))
    assert "successfully loaded checkpoint" in logs

    cli("ingest", runs, "--db", db, check=True)
    got = query(
        db,
        """SELECT iteration FROM iterations JOIN runs USING (run_id)
           WHERE study = 'sl_external' AND NOT coalesce(superseded, false) ORDER BY iteration""",
    )
    assert [i for (i,) in got] == list(range(1, ITERS + 1))
    st = cli("status", "sl_external", "--db", db, check=True).stdout
    assert "COMPLETED" in st and str(ITERS) in st

"""The report's module phases (report/modules.py) of a real heterogeneous run whose LLM is a two-stage pipeline:
the real trainer on 3 CPU processes (1 encoder rank, LLM PP2), run, ingested and reported by `mimo-jobs demo`.
Each LLM stage is its own row, made of exactly the ranks whose facts name that stage, and the stage that bounds
the step is the one the ranks' own busy times say is slowest."""

from __future__ import annotations

import csv
import io
import json

import pytest
import yaml

from helpers.submit import cli
from mimo_jobs.report import build, render
from mimo_jobs.report.modules import BUSY, WAIT
from mimo_jobs.store import connection as store

STUDY = {
    "name": "pp2",
    "scaling": "strong",
    "cluster": {"executor": "local", "accelerator": "cpu", "gpus_per_node": 3, "time_limit": "00:10:00",
                "exclusive": False, "requeue": False, "max_retries": 0, "env": {"OMP_NUM_THREADS": 1}},
    "trainer": {"model": "tiny", "seq_length": 32, "train_iters": 6, "log_interval": 1, "timeout_s": 120},
    "matrix": {"defaults": {"nodes": 1, "gbs": 4, "mbs": 1},
               "points": [{"encoder": {"tp": 1, "dp": 1}, "llm": {"tp": 1, "pp": 2, "dp": 1}}]},
}  # fmt: skip


def _per_iteration(facts: list[dict], phases: tuple[str, ...]) -> float:
    n = sum(f["timed_iterations"] for f in facts)
    return sum(f["phases_s"].get(p, 0.0) for f in facts for p in phases) * 1e3 / n


@pytest.mark.slow
def test_each_llm_stage_is_a_module_of_its_own_ranks(tmp_path):
    study = tmp_path / "pp2.yaml"
    study.write_text(yaml.safe_dump(STUDY))
    db, runs = tmp_path / "s.duckdb", tmp_path / "runs"
    env = {"MIMO_JOBS_LOCAL_SLOTS_DIR": str(tmp_path / "slots"), "TORCHDYNAMO_DISABLE": "1"}
    p = cli("demo", "--study", study, "--db", db, "--runs-dir", runs, env=env, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    (run_dir,) = runs.glob("pp2/*")
    facts = [json.loads(f.read_text()) for f in sorted((run_dir / "memory").glob("rank-*.json"))]
    assert [(f["role"], f["pp_rank"]) for f in facts] == [("encoder", 0), ("llm", 0), ("llm", 1)]
    con = store.connect(db, read_only=True)
    try:
        rep = build(con, "pp2")
    finally:
        con.close()

    # one row per module, by the study's names: the encoder module (vision), then each LLM stage, each from
    # exactly its own ranks' facts
    own = {"vision": [f for f in facts if f["role"] == "encoder"]}
    own.update(
        {f"llm stage {k}": [f for f in facts if f["role"] == "llm" and f["pp_rank"] == k] for k in (0, 1)}
    )
    mods = {m.module: m for m in rep.modules}
    assert list(mods) == ["vision", "llm stage 0", "llm stage 1"]
    assert [mods[k].stage for k in mods] == [None, 0, 1]
    for key, m in mods.items():
        fs = own[key]
        assert m.ranks == len(fs) and m.iterations == sum(f["timed_iterations"] for f in fs)
        elapsed = sum(f["elapsed_s"] for f in fs)
        assert m.busy_ms == pytest.approx(_per_iteration(fs, BUSY))
        assert m.wait_ms == pytest.approx(_per_iteration(fs, WAIT))
        assert m.busy_share == pytest.approx(
            sum(f["phases_s"].get(p, 0.0) for f in fs for p in BUSY) / elapsed
        )
        for share in (m.busy_share, m.wait_share, m.rest_share):
            assert 0.0 <= share <= 1.0, (key, share)
        assert m.busy_share + m.wait_share + m.rest_share == pytest.approx(1.0)
        assert 0.0 < m.idle < 1.0
    # the stages hand activations and gradients to each other: both wait on the pipeline
    for k in (0, 1):
        assert mods[f"llm stage {k}"].phase_ms.get("pipeline_wait", 0.0) > 0.0
        assert mods[f"llm stage {k}"].phase_ms.get("llm_fwd", 0.0) > 0.0

    # the bound: the module with the most busy time per iteration, by the ranks' own timers
    busy = {key: _per_iteration(fs, BUSY) for key, fs in own.items()}
    (b,) = rep.bounds
    assert b.bound == max(busy, key=busy.get)
    assert b.bound_side == ("encoder" if b.bound == "vision" else "llm")
    assert b.llm_busy_ms == pytest.approx(max(busy["llm stage 0"], busy["llm stage 1"]))
    assert b.encoder_busy_ms == pytest.approx(busy["vision"])
    llm = own["llm stage 0"] + own["llm stage 1"]
    wait = _per_iteration(llm, WAIT)
    assert b.llm_idle == pytest.approx(wait / (_per_iteration(llm, BUSY) + wait))

    # what the user reads: the printed report and the CSV name each stage
    section = p.stdout[p.stdout.index("Module phases") : p.stdout.index("Which side bounds the step")]
    assert all(key in section for key in own), section
    for form in ("md", "html"):
        assert all(key in render(rep, form) for key in own), form
    (row,) = csv.DictReader(io.StringIO(render(rep, "csv")))
    assert row["bounds_the_step"] == b.bound
    for k in (0, 1):
        assert float(row[f"llm_stage_{k}_busy_share"]) == pytest.approx(mods[f"llm stage {k}"].busy_share)

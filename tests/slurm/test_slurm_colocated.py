"""A heterogeneous run and its colocated baseline, end to end on the local SLURM cluster
(tests/slurm/cluster.sh): one study, both layouts at 2 nodes and GBS 12, the real trainer, followed to
COMPLETED, then the report's heterogeneous-vs-colocated figures checked against the store (the steady-state
medians and the loss curves, recomputed here with plain SQL)."""

from __future__ import annotations

import json
import statistics

import pytest
import yaml

from helpers import REPO
from helpers.submit import all_ended, cli, query, wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def _median_ms(db, name: str, skip: int) -> float:
    rows = query(
        db,
        """SELECT i.elapsed_ms FROM iterations i JOIN runs r USING (run_id)
           WHERE r.name = ? AND NOT i.superseded AND i.iteration > ? ORDER BY i.iteration""",
        [name, skip],
    )
    return statistics.median(r[0] for r in rows)


def _losses(db, name: str) -> dict[int, float]:
    rows = query(
        db,
        "SELECT i.consumed_samples, i.loss FROM iterations i JOIN runs r USING (run_id) WHERE r.name = ?",
        [name],
    )
    return dict(rows)


def test_heterogeneous_and_colocated_on_slurm(slurm_cluster, tmp_path):
    doc = yaml.safe_load((REPO / "studies/slurm_ci.yaml").read_text())
    doc["name"] = "slurm_colo"
    doc["matrix"] = {
        "defaults": {"gbs": 12, "mbs": 1, "nodes": 2},
        "points": [{"encoder": {"dp": 2}, "llm": {"dp": 2}}, {"colocated": True}],
    }
    study = tmp_path / "colo.yaml"
    study.write_text(yaml.safe_dump(doc))
    db, runs = tmp_path / "store.duckdb", tmp_path / "runs"
    out = cli("submit", study, "--db", db, "--runs-dir", runs, check=True).stdout
    assert out.count("as slurm job") == 2
    rows = wait_until(db, "slurm_colo", all_ended, 420, every=2)
    assert sorted((r["run"], r["state"]) for r in rows) == [
        ("2n-colo-l1x1x4-g12", "COMPLETED"),
        ("2n-e1x2-l1x1x2-g12", "COMPLETED"),
    ]
    rep = json.loads(cli("report", "slurm_colo", "--db", db, "-f", "json", check=True).stdout)
    (pair,) = rep["pairs"]
    het, colo = "2n-e1x2-l1x1x2-g12", "2n-colo-l1x1x4-g12"
    assert (pair["hetero_run"], pair["colocated_run"], pair["nodes"], pair["gbs"]) == (het, colo, 2, 12)
    iters = doc["trainer"]["train_iters"]
    skip = max(1, int(iters * 0.10))  # the report's steady state: after the first max(1, 10%) iterations
    t_het, t_colo = _median_ms(db, het, skip), _median_ms(db, colo, skip)
    assert pair["hetero_ms"] == pytest.approx(t_het, rel=1e-9)
    assert pair["time_ratio"] == pytest.approx(t_colo / t_het, rel=1e-9)
    # the tokens ratio is that of the two runs' headline (carried) tokens/s/GPU
    by_name = {r["name"]: r for r in rep["runs"]}
    ratio = by_name[het]["tokens_per_s_per_gpu"] / by_name[colo]["tokens_per_s_per_gpu"]
    assert pair["tokens_ratio"] == pytest.approx(ratio, rel=1e-9)
    # the same model on the same global batches: the same loss at every consumed-sample count
    lh, lc = _losses(db, het), _losses(db, colo)
    assert sorted(lh) == sorted(lc) and len(lh) == iters
    assert max(abs(lh[s] - lc[s]) / abs(lc[s]) for s in lh) < 1e-5
    assert pair["loss_max_rel_diff"] < 1e-5 and "loss equal within" in pair["verdict"]
    assert rep["unpaired"] == []

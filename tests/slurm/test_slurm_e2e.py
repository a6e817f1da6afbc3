"""End to end on the real local SLURM cluster (tests/slurm/cluster.sh: 4 emulated nodes, 2 fake GPUs each,
slurmdbd so that sacct works): the real trainer over 2, 3 and 4 nodes, followed to COMPLETED through sacct,
rank placement checked from the per-node logs; then failure, time limit, cancel and crash recovery with a
FAKE workload (tests/submit/fake_templates/launch.sh.j2, started by the real packaged sbatch.sh)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from helpers import REPO
from helpers.submit import FAKE_TEMPLATES, all_ended, cli, job_rows, query, wait_until, write_study

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def sh(*cmd: str) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=60).stdout


def sacct_state(job_id: str) -> str:
    """What the accounting database says, independently of mimo-jobs (first word: 'CANCELLED by 0')."""
    out = sh("sacct", "-X", "-n", "-P", "-o", "State", "-j", job_id).strip().splitlines()
    return out[-1].split()[0] if out else ""


def hosts(node_list: str) -> list[str]:
    return sh("scontrol", "show", "hostnames", node_list).split()


def test_cluster_script_is_idempotent(slurm_cluster):
    pids = {p.name: p.read_text() for p in Path("/run/slurm-ci").glob("*.pid")}
    assert {"slurmctld.pid", "slurmdbd.pid", "mariadbd.pid"} <= set(pids)
    assert {f"slurmd-node{i}.pid" for i in range(1, 5)} <= set(pids)
    subprocess.run(
        ["bash", str(REPO / "tests/slurm/cluster.sh"), "start"], check=True, capture_output=True, timeout=120
    )
    assert {p.name: p.read_text() for p in Path("/run/slurm-ci").glob("*.pid")} == pids  # nothing restarted
    nodes = sh("sinfo", "-h", "-N", "-o", "%N %G").split("\n")
    assert sorted(n.split()[0] for n in nodes if n) == ["node1", "node2", "node3", "node4"]
    assert all("gpu:2" in n for n in nodes if n)


def test_real_trainer_study_2_3_4_nodes(slurm_cluster, tmp_path):
    db, runs = tmp_path / "store.duckdb", tmp_path / "runs"
    study = tmp_path / "slurm_ci.yaml"
    shutil.copy(REPO / "studies/slurm_ci.yaml", study)
    spec = yaml.safe_load(study.read_text())
    gpn, iters = spec["cluster"]["gpus_per_node"], spec["trainer"]["train_iters"]

    out = cli("submit", study, "--db", db, "--runs-dir", runs, check=True).stdout
    assert out.count("as slurm job") == 3
    seen: dict = {}
    rows = wait_until(db, "slurm_ci", all_ended, 420, every=2, seen=seen)
    assert sorted(r["run"] for r in rows) == [
        "2n-e1x2-l1x1x2-g12",
        "3n-e1x2-l1x1x4-g12",
        "4n-e1x2-l1x1x6-g12",
    ]
    for r in rows:
        assert (r["state"], r["exit_code"], r["action"]) == ("COMPLETED", 0, "done"), r
        assert sacct_state(r["job_id"]) == "COMPLETED"
        # Followed while it ran, not only found finished.
        assert {"PENDING", "RUNNING", "SUBMITTED"} & set(seen[(r["run"], r["job_id"])][:-1]), seen
        n = int(r["run"].split("n-")[0])
        alloc = hosts(r["node_list"])
        assert len(alloc) == n

        # Rank placement. launch.sh names node rank k's host; SLURM numbers nodes in allocation order.
        log = Path(r["log_path"]).read_text()
        placed = dict(re.findall(rf"attempt 0 node (\d+)/{n} on (\S+),", log))
        assert {int(k): v for k, v in placed.items()} == dict(enumerate(alloc))
        # The trainer's layout line: encoder ranks [0, 2) = the 2 ranks of node rank 0 = the first host.
        jl = Path(r["run_dir"]) / "logs" / f"job-{r['job_id']}"
        layout = "".join(p.read_text() for p in jl.rglob("*.log"))
        m = re.search(
            r"world (\d+) = (\d+) nodes x (\d+) \| encoder ranks \[0,(\d+)\).*llm ranks \[(\d+),(\d+)\)",
            layout,
        )
        assert m, "trainer layout line missing"
        world, enc_end = int(m[1]), int(m[4])
        assert (world, int(m[2]), int(m[3]), enc_end, int(m[6])) == (n * gpn, n, gpn, 2, n * gpn)
        # torchrun's per-rank dirs: node-k holds local ranks 0..gpn-1 (global rank k*gpn + local).
        for k in range(n):
            local = sorted(int(p.name) for p in jl.glob(f"node-{k}/*/attempt_0/*") if p.name.isdigit())
            assert local == list(range(gpn)), (k, local)
        enc_nodes = sorted({g // gpn for g in range(enc_end)})
        assert [alloc[k] for k in enc_nodes] == alloc[:1]  # encoder on the first node only
        # The last LLM rank (world-1: last node, last local rank) is the one that logs iterations.
        last = jl.glob(f"node-{n - 1}/*/attempt_0/{gpn - 1}/stdout.log")
        assert any(f" iteration {iters:8d}/{iters:8d}" in p.read_text() for p in last)

    # status ingested the finished runs: every iteration is in the store, and the table shows the last one.
    counts = dict(
        query(db, "SELECT r.name, count(*) FROM iterations i JOIN runs r USING (run_id) GROUP BY 1")
    )
    assert counts == {r["run"]: iters for r in rows}
    st = cli("status", "slurm_ci", "--db", db, check=True).stdout
    assert st.count(f"{iters}/{iters}") == 3 and st.count("COMPLETED") == 3

    again = cli("submit", study, "--db", db, "--runs-dir", runs, check=True).stdout
    assert "nothing to submit" in again
    assert len(job_rows(db, "slurm_ci")) == 3


def test_failure_timeout_cancel_and_crash_recovery(slurm_cluster, tmp_path):
    db, runs = tmp_path / "store.duckdb", tmp_path / "runs"

    def study(name, **kw):
        return write_study(tmp_path / f"{name}.yaml", name, [{"nodes": 1}], executor="slurm", **kw)

    def submit(path):
        return cli("submit", path, "--db", db, "--runs-dir", runs, "--templates", FAKE_TEMPLATES, check=True)

    # The time limit is the slowest case (SLURM checks limits every ~30 s): submit it first.
    submit(study("sl_timeout", time_limit="00:01:00", signal="USR2@10", env={"FAKE_SLEEP": 600}))
    submit(
        study(
            "sl_broken", max_retries=2, env={"FAKE_EXIT": 3, "FAKE_MESSAGE": "ValueError: broken on purpose"}
        )
    )
    submit(study("sl_cancel", env={"FAKE_SLEEP": 600}))

    running = wait_until(db, "sl_cancel", lambda rs: rs[0]["state"] == "RUNNING", 60)[0]
    # One script, one truth: the batch script SLURM holds for the job is the rendered sbatch.sh, byte for byte.
    held = subprocess.run(
        ["scontrol", "write", "batch_script", running["job_id"], "-"], check=True, capture_output=True
    ).stdout
    assert held == (Path(running["run_dir"]) / "sbatch.sh").read_bytes()
    out = cli("cancel", "sl_cancel", "--run", "1n-e1x1-l1x1x1-g6", "--db", db, check=True).stdout
    assert f"slurm job {running['job_id']}" in out
    rows = wait_until(db, "sl_cancel", all_ended, 60)
    assert (rows[0]["state"], rows[0]["action"]) == ("CANCELLED", "final")
    assert sacct_state(rows[0]["job_id"]) == "CANCELLED"

    rows = wait_until(db, "sl_broken", all_ended, 60)
    assert len(rows) == 1, "a deterministic failure is not retried"
    r = rows[0]
    assert (r["state"], r["exit_code"], r["action"]) == ("FAILED", 3, "final")
    assert sacct_state(r["job_id"]) == "FAILED"
    assert "exit 3" in r["reason"] and r["first_error"] == "ValueError: broken on purpose"

    # Crash window: sbatch went through, the process died before recording it. status adopts the job by
    # its work dir (sacct/squeue WorkDir = the run dir).
    orphan = study("sl_orphan", env={"FAKE_SLEEP": 1})
    from mimo_jobs.store import catalog
    from mimo_jobs.store import connection as store
    from mimo_jobs.study.expand import runs_of
    from mimo_jobs.study.load import load_study
    from mimo_jobs.submit import service

    s = load_study(orphan)
    spec = runs_of(s)[0]
    con = store.connect(db)
    p = service.prepare([spec], runs, "slurm", FAKE_TEMPLATES)[0]
    catalog.record_study(con, catalog.StudyRecord(**s.catalog_fields()), str(orphan))
    catalog.record_run(con, catalog.RunRecord(**spec.catalog_fields()), str(p.rd.root), p.sha256)
    con.close()
    service._write_intent(p.rd, "slurm", 0, None)
    job_id = service.executor("slurm").submit(p.rd, 0, 300, "USR2@60")
    rows = wait_until(db, "sl_orphan", all_ended, 60)
    assert [(r["job_id"], r["state"]) for r in rows] == [(job_id, "COMPLETED")]
    assert "nothing to submit" in submit(orphan).stdout

    rows = wait_until(db, "sl_timeout", all_ended, 600, every=3)  # a hang guard: the job's limit ends it
    r = rows[0]
    assert (r["state"], r["action"]) == ("TIMEOUT", "final"), r
    assert sacct_state(r["job_id"]) == "TIMEOUT"
    assert "time limit" in r["reason"]

"""submit / status / cancel with the local executor, through the real CLI, real run dirs rendered by the
packaged sbatch template, real detached runner processes and a real DuckDB file.

The workload is a FAKE launch.sh (tests/submit/fake_templates, swapped in with --templates) that sleeps, prints
or fails on demand, so these tests check the job machinery in seconds; the real trainer runs under the local
executor in test_demo.py and under SLURM in tests/slurm.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from helpers.submit import (
    FAKE_TEMPLATES,
    all_ended,
    cli,
    job_rows,
    query,
    submit_fake,
    wait_until,
    write_study,
)

NCCL_MSG = (
    "[rank1]:[E ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective operation timeout: "
    "WorkNCCL(SeqNum=9, OpType=ALLREDUCE) ran for 600042 milliseconds before timing out."
)


@pytest.fixture
def ws(tmp_path):
    """A workspace: store, runs root, and a private set of local slots (4: tests may run jobs side by side)."""
    env = {"MIMO_JOBS_LOCAL_SLOTS_DIR": str(tmp_path / "slots"), "MIMO_JOBS_LOCAL_SLOTS": "4"}
    return {"dir": tmp_path, "db": tmp_path / "store.duckdb", "runs": tmp_path / "runs", "env": env}


submit = submit_fake


@pytest.mark.slow  # multi-process or real jobs: CI runs it, the fast local default does not
def test_submit_complete_resubmit_is_noop_force_and_changed_spec(ws):
    study = write_study(
        ws["dir"] / "s.yaml",
        "loc_ok",
        [{"nodes": 1, "gbs": 6}, {"nodes": 1, "gbs": 12}],
        env={"FAKE_SLEEP": 1},
    )
    out = submit(ws, study).stdout
    assert out.count("submitted ") == 2
    rows = wait_until(ws["db"], "loc_ok", all_ended, 60, ws["env"])
    assert [(r["state"], r["exit_code"], r["attempt"], r["action"]) for r in rows] == [
        ("COMPLETED", 0, 0, "done")
    ] * 2
    for r in rows:
        assert r["submit_time"] <= r["start_time"] <= r["end_time"]
        assert (r["end_time"] - r["start_time"]).total_seconds() >= 1  # it slept 1 s
        log = Path(r["log_path"]).read_text()
        assert f"fake-launch run={r['run']} node=0/1" in log and f"job={r['job_id']}" in log
    # Provenance: the runs rows carry the rendered script's hash (local: launch.sh) and the package version.
    for _name, sha, ver, rd in query(ws["db"], "SELECT name, script_sha256, pkg_version, run_dir FROM runs"):
        import hashlib

        assert sha == hashlib.sha256((Path(rd) / "launch.sh").read_bytes()).hexdigest()
        assert ver

    again = submit(ws, study).stdout
    assert "nothing to submit" in again and "submitted" not in again
    assert len(job_rows(ws["db"], "loc_ok")) == 2

    # a completed run is never run again (it would replace what it measured): --force says what to do
    forced = submit(ws, study, "--force", "--only", "1n-e1x1-l1x1x1-g6", check=False)
    assert forced.returncode == 2 and "is not run again" in forced.stderr, forced.stdout + forced.stderr
    assert job_rows(ws["db"], "loc_ok") == rows

    # A changed spec (another env value) is a new run id: submitted although the old one completed.
    write_study(study, "loc_ok", [{"nodes": 1, "gbs": 6}, {"nodes": 1, "gbs": 12}], env={"FAKE_SLEEP": 0})
    out = submit(ws, study).stdout
    assert out.count("submitted ") == 2
    assert query(ws["db"], "SELECT count(*) FROM runs WHERE study = 'loc_ok'")[0][0] == 4


def test_failure_is_recorded_with_reason_and_not_retried(ws):
    study = write_study(
        ws["dir"] / "f.yaml",
        "loc_fail",
        [{"nodes": 1}],
        max_retries=2,
        env={"FAKE_EXIT": 3, "FAKE_MESSAGE": "ValueError: broken on purpose"},
    )
    submit(ws, study)
    rows = wait_until(ws["db"], "loc_fail", all_ended, 60, ws["env"])
    assert len(rows) == 1, "a deterministic failure must not be retried"
    r = rows[0]
    assert (r["state"], r["exit_code"], r["action"]) == ("FAILED", 3, "final")
    assert "exit 3" in r["reason"] and "deterministic" in r["reason"]
    assert r["first_error"] == "ValueError: broken on purpose"
    st = cli("status", "loc_fail", "--db", ws["db"], env=ws["env"], check=True).stdout
    assert "FAILED" in st and "broken on purpose" in st


def test_flaky_failure_is_retried_up_to_max_retries(ws):
    study = write_study(
        ws["dir"] / "k.yaml",
        "loc_flaky",
        [{"nodes": 1}],
        max_retries=1,
        env={"FAKE_EXIT": 1, "FAKE_MESSAGE": NCCL_MSG},
    )
    submit(ws, study)
    rows = wait_until(ws["db"], "loc_flaky", lambda rs: len(rs) == 2 and all_ended(rs), 60, ws["env"])
    first, second = rows
    assert (first["attempt"], first["action"], first["next_job_id"]) == (0, "retry", second["job_id"])
    assert "nccl_timeout" in first["reason"]
    assert (second["attempt"], second["state"], second["action"]) == (1, "FAILED", "final")
    assert "after 1 retries" in second["reason"]


def test_timeout_without_checkpoint_is_final(ws):
    study = write_study(
        ws["dir"] / "t.yaml",
        "loc_timeout",
        [{"nodes": 1}],
        time_limit="00:00:02",
        signal="USR2@0",
        env={"FAKE_SLEEP": 3600},
    )
    submit(ws, study)
    # the job would sleep an hour: only the runner stopping it at its 2 s limit ends it (a hang guard)
    rows = wait_until(ws["db"], "loc_timeout", all_ended, 600, ws["env"], every=0.5)
    r = rows[0]
    assert (r["state"], r["action"]) == ("TIMEOUT", "final")
    assert "no checkpoint" in r["reason"]
    assert "DUE TO TIME LIMIT" in Path(r["log_path"]).read_text()


def test_timeout_with_checkpoint_is_requeued_and_resumes(ws):
    study = write_study(
        ws["dir"] / "c.yaml",
        "loc_requeue",
        [{"nodes": 1}],
        time_limit="00:00:02",
        signal="USR2@0",
        env={"FAKE_SLEEP": 60, "FAKE_CKPT": 1},
    )
    submit(ws, study)
    rows = wait_until(
        ws["db"], "loc_requeue", lambda rs: len(rs) == 2 and all_ended(rs), 90, ws["env"], every=0.5
    )
    assert [(r["attempt"], r["state"], r["action"]) for r in rows] == [
        (0, "TIMEOUT", "requeue"),
        (1, "COMPLETED", "done"),
    ]
    assert "resumed from checkpoint" in Path(rows[1]["log_path"]).read_text()  # saw MIMO_JOBS_ATTEMPT=1


def test_cancel_stops_the_whole_process_group(ws):
    study = write_study(ws["dir"] / "x.yaml", "loc_cancel", [{"nodes": 1}], env={"FAKE_SLEEP": 120})
    submit(ws, study)
    rows = wait_until(
        ws["db"], "loc_cancel", lambda rs: rs[0]["state"] == "RUNNING", 30, ws["env"], every=0.3
    )
    state_file = Path(rows[0]["run_dir"]) / "logs" / f"local-{rows[0]['job_id']}.json"
    child = json.loads(state_file.read_text())["child_pid"]
    # --force never starts a second job beside a running one (both would write one run directory)
    forced = submit(ws, study, "--force").stdout
    assert "not resubmitted 1n-e1x1-l1x1x1-g6: job" in forced and "is RUNNING" in forced, forced
    assert (
        "submitted " not in forced.replace("not resubmitted", "")
        and len(job_rows(ws["db"], "loc_cancel")) == 1
    )
    out = cli("cancel", "loc_cancel", "--db", ws["db"], env=ws["env"], check=True).stdout
    assert f"cancelled 1n-e1x1-l1x1x1-g6: local job {rows[0]['job_id']}" in out
    rows = wait_until(ws["db"], "loc_cancel", all_ended, 30, ws["env"], every=0.3)
    assert (rows[0]["state"], rows[0]["action"]) == ("CANCELLED", "final")
    # launch.sh's process group (bash + sleep) is gone, not orphaned.
    deadline = time.monotonic() + 120  # a hang guard
    while time.monotonic() < deadline:
        try:
            stat = Path(f"/proc/{child}/stat").read_text()
        except OSError:
            break
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"launch.sh (pid {child}) still runs after cancel")
    again = cli("cancel", "loc_cancel", "--db", ws["db"], env=ws["env"], check=True).stdout
    assert "no pending or running job" in again


def test_dry_run_prints_the_rendered_script_and_writes_nothing(ws):
    study = write_study(ws["dir"] / "d.yaml", "loc_dry", [{"nodes": 2, "gbs": 6}], executor="slurm")
    before = sorted(p.name for p in ws["dir"].iterdir())
    p = cli("submit", study, "--dry-run", "--db", ws["db"], "--runs-dir", ws["runs"], check=True)
    assert "nothing submitted" in p.stdout
    assert not ws["db"].exists() and not ws["runs"].exists()  # no store, no run directory
    assert sorted(p.name for p in ws["dir"].iterdir()) == before
    # what it printed is exactly the file a render writes (and SLURM would run)
    cli("render", study, "-o", ws["runs"], check=True)
    (sbatch,) = (ws["runs"] / "loc_dry").glob("2n-e1x1-l1x1x3-g6-*/sbatch.sh")
    assert sbatch.read_text().strip() in p.stdout
    assert f"$ sbatch --parsable --chdir={sbatch.parent.resolve()} {sbatch.resolve()}" in p.stdout


def test_bad_input_is_refused_before_anything_is_written(ws):
    study = write_study(ws["dir"] / "b.yaml", "loc_bad", [{"nodes": 1}, {"nodes": 2, "gbs": 6}])
    p = submit(ws, study, "--only", "nosuch", check=False)
    assert p.returncode == 2 and "no run named 'nosuch'" in p.stderr and "1n-e1x1-l1x1x1-g6" in p.stderr
    p = submit(ws, study, check=False)  # the 2-node run cannot run on the local executor
    assert p.returncode == 2 and "2n-e1x1-l1x1x3-g6 (2 nodes)" in p.stderr
    p = submit(ws, study, "--executor", "pbs", check=False)
    assert p.returncode == 2 and "use one of slurm, local, kubernetes" in p.stderr
    assert not ws["db"].exists() and not ws["runs"].exists()
    p = cli("status", "--db", ws["db"])
    assert p.returncode == 2 and "no store" in p.stderr
    broken = ws["dir"] / "broken.yaml"
    broken.write_text("name: x\nmatrix: [\n")
    p = submit(ws, broken, check=False)
    assert p.returncode == 2 and "invalid YAML" in p.stderr


def test_store_write_failure_cancels_the_job(ws, monkeypatch):
    """No scheduler job without a row: when recording fails right after submission, the job is cancelled."""
    from mimo_jobs.store import connection as store
    from mimo_jobs.study.expand import runs_of
    from mimo_jobs.study.load import load_study
    from mimo_jobs.submit import jobs_table, service

    for k, v in ws["env"].items():
        monkeypatch.setenv(k, v)
    study = write_study(ws["dir"] / "w.yaml", "loc_crash", [{"nodes": 1}], env={"FAKE_SLEEP": 60})
    spec = runs_of(load_study(study))[0]
    con = store.connect(ws["db"])
    prepared = service.prepare([spec], ws["runs"], "local", FAKE_TEMPLATES)[0]

    def broken_insert(*a, **k):
        raise RuntimeError("disk full (injected)")

    monkeypatch.setattr(jobs_table, "insert_job", broken_insert)
    with pytest.raises(RuntimeError, match="injected"):
        service.submit_prepared(con, service.executor("local"), prepared, 0)
    assert con.execute("SELECT count(*) FROM jobs").fetchone()[0] == 0
    state_files = list(prepared.rd.logs.glob("local-*.json"))
    assert len(state_files) == 1
    deadline = time.monotonic() + 120  # a hang guard
    while json.loads(state_files[0].read_text())["state"] != "CANCELLED":
        assert time.monotonic() < deadline, state_files[0].read_text()
        time.sleep(0.1)
    assert not prepared.rd.submit_intent.exists()
    con.close()


def test_crash_between_submission_and_store_write_is_recovered(ws, monkeypatch):
    """The process dies after the scheduler took the job but before the row was written: the intent file
    lets the next `status` find the job and record it (no lost job, no duplicate on resubmit)."""
    from mimo_jobs.store import catalog
    from mimo_jobs.store import connection as store
    from mimo_jobs.study.expand import runs_of
    from mimo_jobs.study.load import load_study
    from mimo_jobs.submit import service

    for k, v in ws["env"].items():
        monkeypatch.setenv(k, v)
    study_path = write_study(ws["dir"] / "r.yaml", "loc_orphan", [{"nodes": 1}], env={"FAKE_SLEEP": 1})
    study = load_study(study_path)
    spec = runs_of(study)[0]
    con = store.connect(ws["db"])
    p = service.prepare([spec], ws["runs"], "local", FAKE_TEMPLATES)[0]
    catalog.record_study(con, catalog.StudyRecord(**study.catalog_fields()), str(study_path))
    catalog.record_run(con, catalog.RunRecord(**spec.catalog_fields()), str(p.rd.root), p.sha256)
    ex = service.executor("local")
    job_id = ex.new_job_id()
    service._write_intent(p.rd, "local", 0, job_id)  # what submit_prepared does first ...
    ex.submit(p.rd, 0, 60, "USR2@0", job_id=job_id)  # ... then the process "dies" here
    con.close()

    rows = wait_until(ws["db"], "loc_orphan", all_ended, 60, ws["env"])
    assert [(r["job_id"], r["state"]) for r in rows] == [(job_id, "COMPLETED")]
    assert not p.rd.submit_intent.exists()
    out = submit(ws, study_path).stdout
    assert "nothing to submit" in out


def test_status_of_unknown_study_names_the_known_ones(ws):
    study = write_study(ws["dir"] / "u.yaml", "loc_known", [{"nodes": 1}])
    submit(ws, study)
    p = cli("status", "nosuch", "--db", ws["db"], env=ws["env"])
    assert p.returncode == 2 and "loc_known" in p.stderr
    wait_until(ws["db"], "loc_known", all_ended, 60, ws["env"])


@pytest.mark.parametrize(
    "text, says",
    [("[1, 2]", "not a JSON object"), ('{"executor": "local"}', "field 'attempt'"), ("{", "unreadable")],
)
def test_a_damaged_submit_intent_is_its_runs_problem_not_every_studys(ws, text, says):
    """A `.submit-intent.json` someone damaged (or wrote by hand) shows in its own run's row; `status` of
    every study still answers, and the other study's runs are unaffected."""
    from mimo_jobs.contract.rundir import SUBMIT_INTENT

    a = write_study(ws["dir"] / "a.yaml", "loc_intent_a", [{"nodes": 1}], env={"FAKE_SLEEP": 0})
    b = write_study(ws["dir"] / "b.yaml", "loc_intent_b", [{"nodes": 1}], env={"FAKE_SLEEP": 0})
    submit(ws, a)
    submit(ws, b)
    wait_until(ws["db"], "loc_intent_a", all_ended, 60, ws["env"])
    wait_until(ws["db"], "loc_intent_b", all_ended, 60, ws["env"])
    (run_a,) = [d for d in (ws["runs"] / "loc_intent_a").iterdir() if d.is_dir()]
    (run_a / SUBMIT_INTENT).write_text(text)
    p = cli("status", "--db", ws["db"], env=ws["env"])
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr + p.stdout
    lines = [ln for ln in p.stdout.splitlines() if "1n-e1x1" in ln]
    assert len(lines) == 2 and all("COMPLETED" in ln for ln in lines), p.stdout
    (first_a,) = [
        i for i, ln in enumerate(p.stdout.splitlines()) if "1n-e1x1" in ln and "loc_intent_b" not in ln
    ]
    (first_b,) = [i for i, ln in enumerate(p.stdout.splitlines()) if "loc_intent_b/1n-e1x1" in ln]
    row_a = "".join(
        ln.split("│")[-2].strip() for ln in p.stdout.splitlines()[first_a:first_b] if ln.count("│") > 5
    )  # the reason column, folded over the row's lines
    assert says in row_a and SUBMIT_INTENT in row_a, p.stdout
    row_b = "".join(ln.split("│")[-2].strip() for ln in p.stdout.splitlines()[first_b:] if ln.count("│") > 5)
    assert row_b == "", p.stdout
    assert (run_a / SUBMIT_INTENT).exists()  # kept for its owner to look at, not deleted

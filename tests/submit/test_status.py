"""What `status` shows for a run whose latest job is a retry: that job's own progress, never the iterations
an earlier attempt logged (from metrics.jsonl while it runs, or from the store once ingested)."""

from __future__ import annotations

import os

from helpers.ingest_runs import make_runs, record, write_jsonl
from mimo_jobs.ingest import pipeline
from mimo_jobs.store import connection as store
from mimo_jobs.submit import jobs_table, status
from mimo_jobs.submit.jobs_table import JobFacts


def test_progress_is_the_latest_jobs_own(tmp_path):
    ((run, rd),) = make_runs(tmp_path / "runs", nodes=(1,), train_iters=20)
    con = store.connect(tmp_path / "store.duckdb")
    try:
        # attempt 0 (job 100) logged iterations 1..12 and failed; they are ingested into the store
        write_jsonl(rd.metrics, [record(run, "100", 0, i, 400.0, 5.0 - 0.1 * i) for i in range(1, 13)])
        pipeline.ingest_paths(con, [rd.root])
        jobs_table.insert_job(con, run.run_id, "100", "slurm", 0, None, None)
        jobs_table.update_facts(con, run.run_id, JobFacts("100", "FAILED", 1))
        jobs_table.set_outcome(con, run.run_id, "100", "retry", "flaky", None, "101")

        def shown():
            (s,) = status.run_statuses(con, run.study)
            return s.job.job_id, s.iteration, s.loss, s.iter_source

        assert shown() == ("100", 12, 5.0 - 1.2, "store")

        # the retry (job 101) is queued: it has logged nothing yet, so it shows no iteration
        jobs_table.insert_job(con, run.run_id, "101", "slurm", 1, None, None, state="PENDING")
        assert shown() == ("101", None, None, None)

        # it runs and logs iteration 3 (resumed from a checkpoint): its own progress, from metrics.jsonl
        write_jsonl(rd.metrics, [record(run, "101", 1, 3, 400.0, 4.5)])
        assert shown() == ("101", 3, 4.5, "metrics.jsonl")

        # once ingested the store answers, still for job 101 only
        pipeline.ingest_paths(con, [rd.root])
        assert shown() == ("101", 3, 4.5, "store")
    finally:
        con.close()


def test_last_iteration_from_metrics_of_one_job(tmp_path):
    m = tmp_path / "metrics.jsonl"
    m.write_text(
        '{"kind": "iteration", "job_id": "7", "iteration": 9, "loss": 2.0}\n'
        '{"kind": "iteration", "job_id": 8, "iteration": 2, "loss": 3.0}\n'
        '{"kind": "iteration", "job_id": "8", "iteration": "garbage", "loss": 3.0}\n'
    )
    assert status.last_iteration_from_metrics(m) == (2, 3.0)  # any job: the newest parseable record
    assert status.last_iteration_from_metrics(m, "7") == (9, 2.0)
    assert status.last_iteration_from_metrics(m, "8") == (2, 3.0)  # a numeric job id in JSON is the same id
    assert status.last_iteration_from_metrics(m, "9") is None


def test_status_names_the_tensorboard_command_of_studies_with_event_files(tmp_path) -> None:
    from mimo_jobs.submit.status import RunStatus, tensorboard_commands

    study_dir = tmp_path / "runs with space" / "s"
    (study_dir / "a" / "tensorboard").mkdir(parents=True)
    (study_dir / "b").mkdir()
    sts = [RunStatus("s", name, f"id-{name}", 1, str(study_dir / name), 3, None) for name in ("a", "b")]
    assert tensorboard_commands(sts) == [f"tensorboard --logdir '{study_dir}'"]
    assert tensorboard_commands(sts[1:]) == []  # no event files yet: no command


def test_a_completed_attempt_with_nothing_left_to_train_shows_where_the_run_ended(tmp_path):
    """A cancel that raced the last iteration: attempt 0 logged all 20 iterations (and saved the last
    checkpoint) and was recorded CANCELLED; the resubmitted attempt resumed from that checkpoint, had no
    iteration left to run and COMPLETED. status shows the run's last iteration and loss, not '-'."""
    ((run, rd),) = make_runs(tmp_path / "runs", nodes=(1,), train_iters=20)
    con = store.connect(tmp_path / "store.duckdb")
    try:
        write_jsonl(rd.metrics, [record(run, "100", 0, i, 400.0, 5.0 - 0.1 * i) for i in range(1, 21)])
        pipeline.ingest_paths(con, [rd.root])
        jobs_table.insert_job(con, run.run_id, "100", "local", 0, None, None)
        jobs_table.update_facts(con, run.run_id, JobFacts("100", "CANCELLED", 0))
        jobs_table.insert_job(con, run.run_id, "101", "local", 1, None, None)
        jobs_table.update_facts(con, run.run_id, JobFacts("101", "COMPLETED", 0))
        (s,) = status.run_statuses(con, run.study)
        assert (s.job.job_id, s.iteration, s.loss, s.iter_source) == ("101", 20, 5.0 - 2.0, "store")
    finally:
        con.close()


def test_the_status_table_shows_a_pending_jobs_reason_until_it_runs(tmp_path):
    """SLURM's reason for a pending job (squeue/sacct `Reason`) is in its row while it waits; once the job
    runs the reason no longer holds and is gone from the jobs table and the row."""
    from rich.console import Console

    from mimo_jobs.cli.jobs import status_table

    ((run, rd),) = make_runs(tmp_path / "runs", nodes=(1,), train_iters=20)
    con = store.connect(tmp_path / "store.duckdb")
    try:
        write_jsonl(
            rd.metrics, [record(run, "100", 0, 1, 400.0, 5.0)]
        )  # an earlier job: the run is in the store
        pipeline.ingest_paths(con, [rd.root])
        jobs_table.insert_job(con, run.run_id, "200", "slurm", 0, None, None, state="PENDING")

        def row() -> str:
            console = Console(width=250, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
            console.print(status_table(status.run_statuses(con, run.study), "t"))
            (line,) = [ln for ln in console.export_text().splitlines() if " 200 " in ln]
            return line

        jobs_table.update_facts(con, run.run_id, JobFacts("200", "PENDING", reason="QOSMaxJobsPerUserLimit"))
        assert "PENDING" in row() and "QOSMaxJobsPerUserLimit" in row()
        jobs_table.update_facts(con, run.run_id, JobFacts("200", "RUNNING", node_list="node-[1-4]"))
        assert "RUNNING" in row() and "QOSMaxJobsPerUserLimit" not in row()
        assert jobs_table.jobs_of_run(con, run.run_id)[0].reason is None
    finally:
        con.close()

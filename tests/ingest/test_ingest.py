"""Ingest on real files: upstream Megatron output, our trainer's metrics.jsonl, SLURM output with a traceback
on one rank and watchdog timeouts on the others, truncated and undecodable files; idempotence, appends,
two ingest processes at once."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest

from helpers import REPO
from helpers.ingest_runs import FIXTURES, make_runs, record, require_ext, write_jsonl  # noqa: E402
from mimo_jobs.ingest import pipeline as ingest
from mimo_jobs.ingest import readers
from mimo_jobs.report import build
from mimo_jobs.store import connection as store


@pytest.fixture
def con(tmp_path):
    c = store.connect(tmp_path / "store.duckdb")
    yield c
    c.close()


@pytest.fixture(params=readers.SCANNERS)
def scan(request) -> readers.ScanOptions:
    """Run a test through both log scanners: the compiled one and the pure-Python scan."""
    if request.param == "c":
        require_ext()
    return readers.ScanOptions(scanner=request.param)


def counts(con) -> tuple:
    return tuple(
        con.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
        for t in ("runs", "iterations", "events", "ingested_files")
    )


def test_upstream_megatron_log(con):
    st = ingest.ingest_paths(
        con,
        [FIXTURES / "megatron_upstream.log"],
        log_run=ingest.LogRunInfo(
            study="upstream", name="gpt-moe", nodes=2, gpus_per_node=8, seq_length=4096
        ),
    )
    assert (st.files, st.lines, st.iterations, st.bad_lines, st.undecodable) == (1, 9, 5, 0, 0)
    rows = con.execute("""SELECT iteration, time, elapsed_ms, loss, lr, consumed_samples, gbs, grad_norm,
                                 tflops_per_gpu, moe_aux_loss, source, train_iters FROM iterations ORDER BY iteration""").fetchall()
    assert [r[0] for r in rows] == [1, 70, 71, 72, 73]
    assert rows[2] == (
        71,
        datetime(2024, 4, 6, 3, 2, 12),
        5361.6,
        1.818812,
        1.42e-05,
        9088,
        128,
        1.3,
        243.6,
        1.013377,
        "megatron-log",
        100,
    )
    assert rows[3][1] == datetime(2024, 4, 6, 3, 2, 17, 483921) and rows[3][4] is None  # lr absent there
    extras = json.loads(con.execute("SELECT extras FROM iterations WHERE iteration = 72").fetchone()[0])
    assert extras["losses"]["mtp_1 loss"] == 2.101
    ev = con.execute("SELECT kind, line_no, time FROM events").fetchall()
    assert ev == [("checkpoint_saved", 8, datetime(2024, 4, 6, 3, 2, 17, 483921))]
    r = con.execute("SELECT study, name, nodes, world, gbs, seq_length FROM runs").fetchone()
    assert r == ("upstream", "gpt-moe", 2, 16, 128, 4096)


def _failed_run(tmp_path):
    ((run, rd),) = make_runs(tmp_path / "runs", nodes=(2,))
    shutil.copy(FIXTURES / "slurm-4242.out", rd.logs / "slurm-4242.out")
    return run, rd


def test_traceback_on_one_rank_watchdog_on_the_others(tmp_path, con, scan):
    run, rd = _failed_run(tmp_path)
    st = ingest.ingest_paths(con, [rd.root], options=scan)
    assert st.iterations == 3 and st.problems == []
    ev = con.execute(
        "SELECT rank, kind, message FROM events WHERE kind IN ('traceback', 'nccl_timeout') "
        "ORDER BY line_no, kind"
    ).fetchall()
    # ranks from "node: [defaultK]:" (2 GPUs per node) and torch's "[rankK]:"
    assert ev[0][:2] == (0, "nccl_timeout")
    assert ev[1] == (
        2,
        "traceback",
        "RuntimeError: shape mismatch: 63 image-token positions but 64 embeddings",
    )
    assert {(r, k) for r, k, _ in ev} >= {(1, "nccl_timeout"), (3, "nccl_timeout"), (3, "traceback")}
    t = con.execute("SELECT time FROM events WHERE rank = 1 AND kind = 'nccl_timeout'").fetchone()[0]
    assert t == datetime(2026, 3, 2, 10, 10, 6, 311822)
    rep = build(con, run.study)
    (tri,) = rep.triage
    assert (tri.state, tri.rank, tri.job_id) == ("FAILED", 2, "4242")
    assert "RuntimeError: shape mismatch" in tri.reason and "3 other rank(s) then timed out" in tri.reason
    assert tri.evidence.endswith("slurm-4242.out:9")


def test_per_rank_torchrun_files(tmp_path, con, scan):
    ((run, rd),) = make_runs(tmp_path / "runs", nodes=(2,))
    base = rd.logs / "job-77" / "node-1" / "77_rdzv" / "attempt_0"
    for local, text in (
        (
            0,
            "[rank2]:[E0302 10:10:06.1 ProcessGroupNCCL.cpp:632] [Rank 2] Watchdog caught "
            "collective operation timeout: WorkNCCL(SeqNum=9)\n",
        ),
        (
            1,
            'Traceback (most recent call last):\n  File "m.py", line 1\n'
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n",
        ),
    ):
        (base / str(local)).mkdir(parents=True)
        (base / str(local) / "stderr.log").write_text(text)
    ingest.ingest_paths(con, [rd.root], options=scan)
    got = con.execute("SELECT rank, node, kind, job_id FROM events ORDER BY rank, kind").fetchall()
    assert got == [(2, 1, "nccl_timeout", "77"), (3, 1, "oom", "77"), (3, 1, "traceback", "77")]
    (tri,) = build(con, run.study).triage
    assert tri.rank == 3 and "CUDA out of memory" in tri.reason


def test_attempts_stitch_into_one_curve(tmp_path, con):
    ((run, rd),) = make_runs(tmp_path / "runs", nodes=(1,), train_iters=12)
    # job 100: attempt 0 runs 1..6, is preempted; attempt 1 (same job, requeued) resumes from the
    # checkpoint at 4 and re-runs 5..8; then job 200 (a retry) resumes at 8 and runs 9..12.
    recs = [record(run, "100", 0, i, 100.0, 10.0 - i) for i in range(1, 7)]
    recs += [
        record(run, "100", 1, i, 100.0, 20.0 - i, time=f"2026-01-01T01:00:{i:02d}Z") for i in range(5, 9)
    ]
    recs += [
        record(run, "200", 2, i, 100.0, 30.0 - i, time=f"2026-01-01T02:00:{i:02d}Z") for i in range(8, 13)
    ]
    write_jsonl(rd.metrics, recs)
    st = ingest.ingest_paths(con, [rd.root])
    assert st.iterations == 15  # records read
    # stored: job 100 keeps one row per iteration 1..8 (5, 6 from attempt 1), job 200 has 8..12
    assert con.execute("SELECT count(*) FROM iterations").fetchone()[0] == 13
    rows = con.execute(
        "SELECT iteration, loss, job_id FROM iterations WHERE NOT superseded ORDER BY iteration"
    ).fetchall()
    assert [r[0] for r in rows] == list(range(1, 13))
    want = (
        {i: 10.0 - i for i in range(1, 5)}
        | {i: 20.0 - i for i in range(5, 8)}
        | {i: 30.0 - i for i in range(8, 13)}
    )
    assert {r[0]: r[1] for r in rows} == want
    assert (
        con.execute("SELECT count(*) FROM iterations WHERE superseded").fetchone()[0] == 1
    )  # job 100's it 8
    rep = build(con, run.study)
    (r,) = rep.runs
    assert (r.state, r.iterations, r.jobs, r.final_loss) == ("COMPLETED", 12, 2, 18.0)


def test_reingest_is_idempotent_and_appends_resume(tmp_path, con):
    run, rd = _failed_run(tmp_path)
    write_jsonl(rd.metrics, [record(run, "4242", 0, i, 100.0, 5.0) for i in range(1, 4)])
    ingest.ingest_paths(con, [rd.root])
    before = counts(con)
    st = ingest.ingest_paths(con, [rd.root])
    assert counts(con) == before and st.skipped_unchanged == 2 and st.files == 0
    # an append (the trainer kept writing) is read from the stored offset only
    write_jsonl(rd.metrics, [record(run, "4242", 0, 4, 100.0, 5.0)])
    st = ingest.ingest_paths(con, [rd.root])
    assert (st.files, st.lines, st.iterations, st.skipped_unchanged) == (1, 1, 1, 1)
    assert counts(con)[1] == before[1] + 1
    # --force re-reads everything and still changes nothing
    ingest.ingest_paths(con, [rd.root], force=True)
    assert counts(con)[1:3] == (before[1] + 1, before[2])


def test_truncated_last_line_is_counted_and_completed_later(tmp_path, con, scan):
    ((run, rd),) = make_runs(tmp_path / "runs", nodes=(1,))
    lines = (FIXTURES / "megatron_upstream.log").read_bytes().splitlines(keepends=True)
    log = rd.logs / "slurm-9.out"
    cut = lines[-1][:120]  # the last iteration line, cut mid-field (job killed mid-write)
    log.write_bytes(b"".join(lines[:-1]) + cut)
    st = ingest.ingest_paths(con, [rd.root], options=scan)
    assert (st.truncated_files, st.bad_lines, st.iterations) == (1, 1, 4)
    with open(log, "ab") as f:
        f.write(lines[-1][120:])
    st = ingest.ingest_paths(con, [rd.root], options=scan)
    assert (st.iterations, st.truncated_files, st.lines) == (1, 0, 1)
    assert con.execute("SELECT max(iteration), count(*) FROM iterations").fetchone() == (73, 5)


def test_invalid_utf8_and_binary_garbage(tmp_path, con, scan):
    ((run, rd),) = make_runs(tmp_path / "runs", nodes=(1,))
    good = (FIXTURES / "megatron_upstream.log").read_bytes().splitlines(keepends=True)
    junk = [
        b"\xff\xfe\xfa broken \xc3\x28 bytes\n",
        b"\x00\x00\x00\x00\x01\x02 core dump page\n",
        b"caf\xe9 latin-1 text\n",
    ]
    log = rd.logs / "slurm-10.out"
    log.write_bytes(good[2] + junk[0] + good[3] + junk[1] + good[4] + junk[2] + good[5])
    st = ingest.ingest_paths(con, [rd.root], options=scan)
    assert (st.lines, st.undecodable, st.bad_lines, st.iterations) == (7, 2, 1, 4)
    assert con.execute("SELECT list(iteration ORDER BY iteration) FROM iterations").fetchone()[0] == [
        1,
        70,
        71,
        72,
    ]
    row = con.execute("SELECT undecodable_lines, bad_lines FROM ingested_files").fetchone()
    assert row == (2, 1)


def test_interleaved_garbled_iteration_line_is_counted(tmp_path, con, scan):
    ((run, rd),) = make_runs(tmp_path / "runs", nodes=(1,))
    # two ranks wrote into one line without a newline between them: the iteration line lost its fields
    (rd.logs / "slurm-11.out").write_text(
        "1: [default1]: [2026-03-02 10:00:05] iteration        1/      20 | consumed samples:     0: [default0]:"
        "warming up\n1: [default1]: [2026-03-02 10:00:06] iteration        2/      20 | elapsed time per iteration "
        "(ms): 400.0 | lm loss: 4.0 |\n"
    )
    st = ingest.ingest_paths(con, [rd.root], options=scan)
    assert (st.bad_lines, st.iterations) == (1, 1)


def test_bad_input_writes_nothing(tmp_path, con):
    ((run, rd),) = make_runs(tmp_path / "runs", nodes=(1,))
    with pytest.raises(ingest.IngestError, match="no such file or directory: .*missing"):
        ingest.ingest_paths(con, [rd.root, tmp_path / "missing"])
    (rd2 := tmp_path / "broken").mkdir()
    (rd2 / "run.yaml").write_text("run: {study: x}\n")
    (rd2 / "metrics.jsonl").write_text("{}\n")
    with pytest.raises(ingest.IngestError, match=r"broken/run.yaml: cannot read run description"):
        ingest.ingest_paths(con, [rd.root, rd2])
    assert counts(con) == (0, 0, 0, 0)


def test_sacct_records_give_the_job_state(tmp_path, con):
    ((run, rd),) = make_runs(tmp_path / "runs", nodes=(1,))
    write_jsonl(rd.metrics, [record(run, "4242", 0, i, 100.0, 5.0) for i in range(1, 6)])
    (rd.logs / "sacct-4242.txt").write_text(
        "JobID|JobName|State|ExitCode|Start|End|NodeList|Restarts\n"
        "4242|mimo|TIMEOUT|0:0|2026-03-02T10:00:00|2026-03-02T11:00:05|node1|0\n"
        "4242.batch|batch|CANCELLED|0:15|2026-03-02T10:00:00|2026-03-02T11:00:05|node1|0\n"
    )
    ingest.ingest_paths(con, [rd.root])
    assert con.execute("SELECT job_id, state, end_time FROM jobs").fetchall() == [
        ("4242", "TIMEOUT", datetime(2026, 3, 2, 11, 0, 5))
    ]
    (r,) = build(con, run.study).runs
    assert (r.state, r.state_source) == ("TIMEOUT", "jobs")


def test_two_ingest_processes_at_once(tmp_path):
    runs = make_runs(tmp_path / "runs", nodes=(1, 2, 4))
    for run, rd in runs:
        write_jsonl(rd.metrics, [record(run, "1", 0, i, 100.0, 5.0) for i in range(1, 501)])
        shutil.copy(FIXTURES / "slurm-4242.out", rd.logs / "slurm-4242.out")
    db = tmp_path / "store.duckdb"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    cmd = [sys.executable, "-m", "mimo_jobs.cli", "ingest", str(tmp_path / "runs"), "--db", str(db)]
    procs = [
        subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    c = store.connect(db, read_only=True)
    try:
        # 3 runs x (500 jsonl iterations) ; log iterations are not stored when metrics.jsonl exists
        assert c.execute(
            "SELECT count(*), count(DISTINCT (run_id, iteration)) FROM iterations"
        ).fetchone() == (1500, 1500)
        n_ev = c.execute("SELECT count(*) FROM events").fetchone()[0]
        assert n_ev == 3 * 8
        assert c.execute("SELECT count(*) FROM ingested_files").fetchone()[0] == 6
        assert c.execute("SELECT count(*) FROM runs").fetchone()[0] == 3
    finally:
        c.close()
    # one of the two did the work, the other found every file unchanged
    skipped = sorted("6 unchanged" in o for o, _ in outs)
    assert skipped == [False, True], outs


def test_scanners_store_the_same_rows(tmp_path):
    """The compiled scanner and the pure-Python scan must store exactly the same rows."""
    require_ext()

    def ingest_all(db, options):
        c = store.connect(db)
        ingest.ingest_paths(c, [rd.root, FIXTURES / "megatron_upstream.log"], options=options)
        cur = c.execute("SELECT * EXCLUDE (source_file) FROM iterations ORDER BY ALL")
        x = [d[0] for d in cur.description].index("extras")
        # extras keep the log's number text on the C path (4.852030E+00), Python writes repr (4.85203)
        it = [r[:x] + (json.loads(r[x]),) + r[x + 1 :] for r in cur.fetchall()]
        ev = c.execute("SELECT * EXCLUDE (source_file) FROM events ORDER BY ALL").fetchall()
        c.close()
        return it, ev

    ((run, rd),) = make_runs(tmp_path / "runs", nodes=(2,))
    shutil.copy(FIXTURES / "slurm-4242.out", rd.logs / "slurm-4242.out")
    got = {}
    for mode in ("c", "python"):
        got[mode] = ingest_all(tmp_path / f"{mode}.duckdb", readers.ScanOptions(scanner=mode))
    assert got["c"] == got["python"]
    assert len(got["c"][0]) == 8 and len(got["c"][1]) == 9


def test_cli_ingest(tmp_path):
    from typer.testing import CliRunner

    from mimo_jobs.cli.app import app

    ((run, rd),) = make_runs(tmp_path / "runs", nodes=(2,))
    shutil.copy(FIXTURES / "slurm-4242.out", rd.logs / "slurm-4242.out")
    db = str(tmp_path / "s.duckdb")
    res = CliRunner().invoke(app, ["ingest", str(tmp_path / "runs"), str(tmp_path / "nope"), "--db", db])
    assert res.exit_code == 2 and "no such file or directory" in res.output
    assert not Path(db).exists(), "a refused ingest must not leave a store behind"
    res = CliRunner().invoke(app, ["ingest", str(tmp_path / "runs"), "--db", db])
    assert res.exit_code == 0, res.output
    assert (
        "ingested 1 file(s) (0 unchanged, skipped): 21 lines, 3 iterations, 8 events, 1 new run(s)"
        in res.output
    )
    res = CliRunner().invoke(app, ["ingest", str(tmp_path / "runs"), "--db", db])
    assert "ingested 0 file(s) (1 unchanged, skipped)" in res.output


@pytest.mark.parametrize("value", ["fast", "grep"])  # grep: a scanner of older versions
def test_an_unusable_scanner_setting_is_refused_before_writing(tmp_path, monkeypatch, value):
    from typer.testing import CliRunner

    from mimo_jobs.cli.app import app

    ((_, rd),) = make_runs(tmp_path / "runs", nodes=(1,))
    shutil.copy(FIXTURES / "slurm-4242.out", rd.logs / "slurm-4242.out")
    db = tmp_path / "s.duckdb"
    con = store.connect(db)
    ingest.ingest_paths(con, [rd.root])
    before = (counts(con), con.execute("SELECT * FROM ingested_files ORDER BY path").fetchall())
    con.close()
    monkeypatch.setenv("MIMO_JOBS_SCANNER", value)
    (rd.logs / "slurm-4243.out").write_text("one more line\n")
    res = CliRunner().invoke(app, ["ingest", str(rd.root), "--db", str(db)])
    assert res.exit_code == 2 and f"MIMO_JOBS_SCANNER='{value}': use c or python" in res.output
    con = store.connect(db, read_only=True)
    after = (counts(con), con.execute("SELECT * FROM ingested_files ORDER BY path").fetchall())
    con.close()
    assert after == before  # nothing recorded, nothing lost
    res = CliRunner().invoke(app, ["ingest", str(rd.root), "--db", str(tmp_path / "new.duckdb")])
    assert res.exit_code == 2 and not (tmp_path / "new.duckdb").exists()  # no empty store left behind


def test_scan_options_refuse_an_unknown_scanner(monkeypatch, con):
    with pytest.raises(readers.ScanError, match="'grep': use c or python"):
        readers.ScanOptions(scanner="grep")
    monkeypatch.setenv("MIMO_JOBS_SCANNER", "grep")
    with pytest.raises(ingest.IngestError, match="MIMO_JOBS_SCANNER='grep': use c or python"):
        ingest.ingest_paths(con, [FIXTURES / "megatron_upstream.log"])
    assert counts(con) == (0, 0, 0, 0)
    monkeypatch.setenv("MIMO_JOBS_SCANNER", "python")
    assert readers.scan_options() == readers.ScanOptions(scanner="python")

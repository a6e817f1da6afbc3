"""`status --watch` into a pipe (a CI log, a file): the table once, then a whole progress line, so whatever
is printed next starts on its own line."""

from __future__ import annotations

from helpers.submit import cli, submit_fake, write_study


def test_watch_into_a_pipe_prints_one_table_and_ends_its_line(tmp_path):
    env = {"MIMO_JOBS_LOCAL_SLOTS_DIR": str(tmp_path / "slots"), "MIMO_JOBS_LOCAL_SLOTS": "2"}
    ws = {"dir": tmp_path, "db": tmp_path / "store.duckdb", "runs": tmp_path / "runs", "env": env}
    study = write_study(tmp_path / "w.yaml", "watch_pipe", [{"nodes": 1}], env={"FAKE_SLEEP": 1})
    submit_fake(ws, study)
    out = cli("status", "watch_pipe", "--watch", "--interval", "0.2", "--db", ws["db"], env=env, check=True)
    lines = out.stdout.splitlines()
    assert sum(1 for x in lines if "run" in x and "state" in x and "attempt" in x) == 1, out.stdout
    assert out.stdout.endswith("watch_pipe: runs ended 1/1\n"), out.stdout

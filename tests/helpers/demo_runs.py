"""The packaged CPU study run once per test session by `mimo-jobs demo` (the real trainer under the local
executor, ~45 s): its store and run directories, shared by the slow tests that read real trainer output."""

from __future__ import annotations

from pathlib import Path

from helpers.submit import cli


def demo_store(tmp_path_factory) -> tuple[Path, Path]:
    """(store, runs root) of a completed demo; run on the first call of the session, reused after."""
    root = tmp_path_factory.getbasetemp() / "demo-once"
    db, runs = root / "demo.duckdb", root / "runs"
    if not (root / "done").exists():
        root.mkdir(exist_ok=True)
        env = {"MIMO_JOBS_LOCAL_SLOTS_DIR": str(root / "slots")}
        p = cli("demo", "--db", db, "--runs-dir", runs, env=env, timeout=900)
        assert p.returncode == 0, p.stdout + p.stderr
        (root / "done").write_text(p.stdout)
    return db, runs


def demo_output(tmp_path_factory) -> str:
    """What the session's `mimo-jobs demo` printed (running it on the first call)."""
    demo_store(tmp_path_factory)
    return (tmp_path_factory.getbasetemp() / "demo-once" / "done").read_text()

"""The packaged CPU study run once per pytest run by `mimo-jobs demo` (the real trainer under the local
executor, ~45 s): its store and run directories, shared by the slow tests that read real trainer output, on
whichever worker they run."""

from __future__ import annotations

from pathlib import Path

from helpers.runs import exclusive, shared_root
from helpers.submit import cli


def demo_store(tmp_path_factory) -> tuple[Path, Path]:
    """(store, runs root) of a completed demo; run on the first call of the pytest run, reused after."""
    root = shared_root(tmp_path_factory) / "demo-once"
    db, runs = root / "demo.duckdb", root / "runs"
    with exclusive(root.with_suffix(".lock")):
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
    return (shared_root(tmp_path_factory) / "demo-once" / "done").read_text()

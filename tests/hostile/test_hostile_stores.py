"""Hostile stores: --db naming a text file, an empty file, a directory, another application's DuckDB file,
a store cut short, a store from a newer mimo-jobs, a store locked by another process, a read-only
filesystem. Every command that opens the store must say which of these it met, in one line, at once (only a
real lock is waited for, visibly and within a bound), and must leave the file as it was. A store from an
older mimo-jobs is read as it is (never called damaged, never written by a reader), and measured times
that are zero, negative or not finite are no measurement. One line per case (see tests/helpers/hostile.py)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from helpers import TESTS
from helpers.hostile import Case, read_only_mount, run_case

FIXTURES = TESTS / "ingest" / "fixtures"
STUDY = str(TESTS.parent / "studies" / "cpu_local.yaml")
DB = "{tmp}/s.duckdb"
LOG = str(FIXTURES / "slurm-4242.out")

# every command that opens a store, with what it must do to one
COMMANDS = {
    "status": ["status", "--db", DB],
    "report": ["report", "--db", DB],
    "ingest": ["ingest", LOG, "--db", DB],
    "cancel": ["cancel", "x", "--db", DB],
}


_MADE: dict[str, Path] = {}  # the one store this process made, copied for each test


def real_store(tmp: Path) -> Path:
    """A store holding one ingested log, made by the real CLI (once per test process; each test gets its own
    copy at tmp/real.duckdb)."""
    if "store" not in _MADE:
        made = Path(tempfile.mkdtemp(prefix="mimo-real-store-")) / "real.duckdb"
        subprocess.run(
            [sys.executable, "-m", "mimo_jobs.cli", "ingest", LOG, "--db", str(made)],
            check=True,
            capture_output=True,
        )
        _MADE["store"] = made
    db = tmp / "real.duckdb"
    shutil.copy(_MADE["store"], db)
    return db


def cut_store(fraction: float):
    def setup(tmp: Path) -> None:
        data = real_store(tmp).read_bytes()
        (tmp / "s.duckdb").write_bytes(data[: int(len(data) * fraction)])

    return setup


def newer_store(tmp: Path) -> None:
    import duckdb

    shutil.copy(real_store(tmp), tmp / "s.duckdb")
    con = duckdb.connect(str(tmp / "s.duckdb"))
    con.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    con.execute("INSERT OR REPLACE INTO meta VALUES ('written_by', '9.9.0')")
    con.close()


def unnumbered_store(tmp: Path) -> None:
    import duckdb

    shutil.copy(real_store(tmp), tmp / "s.duckdb")
    con = duckdb.connect(str(tmp / "s.duckdb"))
    con.execute("UPDATE meta SET value = 'five' WHERE key = 'schema_version'")
    con.close()


def digest(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def unchanged(setup):
    """setup + check: the store file is byte-identical after the command."""
    seen: dict[str, str] = {}

    def prepare(tmp: Path) -> None:
        setup(tmp)
        seen[str(tmp)] = digest(tmp / "s.duckdb")

    def check(tmp: Path, out: str) -> None:
        assert digest(tmp / "s.duckdb") == seen[str(tmp)], "the command changed the store file"

    return prepare, check


def foreign_db(tmp: Path) -> None:
    """Another application's DuckDB database."""
    import duckdb

    con = duckdb.connect(str(tmp / "s.duckdb"))
    con.execute("CREATE TABLE invoices (id INTEGER, total DOUBLE)")
    con.execute("INSERT INTO invoices VALUES (1, 9.5)")
    con.close()


# What each schema version lacks of the next (store/schema.py): 5 added rank_memory and
# iterations.pipeline_wait_ms, 4 runs.colocated and meta.written_by, 3 the jobs policy columns.
LATER = {
    4: ["DROP TABLE rank_memory", "ALTER TABLE iterations DROP COLUMN pipeline_wait_ms"],
    3: ["ALTER TABLE runs DROP COLUMN colocated", "DELETE FROM meta WHERE key = 'written_by'"],
    1: [f"ALTER TABLE jobs DROP COLUMN {c}" for c in ("action", "next_job_id", "first_error", "log_path")],
}


def older_store(version: int, study: str | None = None):
    """A real store taken back to an older schema: what an earlier mimo-jobs wrote (its run filed under
    `study` when given)."""

    def setup(tmp: Path) -> None:
        import duckdb

        shutil.copy(real_store(tmp), tmp / "s.duckdb")
        con = duckdb.connect(str(tmp / "s.duckdb"))
        if study:
            con.execute("UPDATE runs SET study = ?", [study])
            con.execute("UPDATE studies SET name = ?", [study])
        for v, stmts in LATER.items():
            if v >= version:
                for stmt in stmts:
                    con.execute(stmt)
        con.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", [str(version)])
        con.close()

    return setup


def measured(value: str):
    """A real store whose every iteration time (and phase) is `value`."""

    def setup(tmp: Path) -> None:
        import duckdb

        shutil.copy(real_store(tmp), tmp / "s.duckdb")
        con = duckdb.connect(str(tmp / "s.duckdb"))
        con.execute(
            "UPDATE iterations SET elapsed_ms = CAST(? AS DOUBLE), enc_fwd_ms = CAST(? AS DOUBLE)",
            [value, value],
        )
        con.close()

    return setup


def no_time_figures(tmp: Path, out: str) -> None:
    assert "NaN" not in out and "Infinity" not in out and "inf" not in out.lower().replace("info", "")
    if out.lstrip().startswith("{"):
        (run,) = json.loads(out)["runs"]
        assert run["t_median_ms"] is None and run["samples_per_s"] is None, run


def text_file(tmp: Path) -> None:
    (tmp / "s.duckdb").write_text("name,nodes\nrun,8\n")


def empty_file(tmp: Path) -> None:
    (tmp / "s.duckdb").write_bytes(b"")


def a_directory(tmp: Path) -> None:
    (tmp / "s.duckdb").mkdir()


def cases() -> list[Case]:
    out = []
    for cmd, argv in COMMANDS.items():
        for what, setup, code, says in [
            ("text-file", text_file, 2, "not a mimo-jobs store"),
            ("empty-file", empty_file, 2, "not a mimo-jobs store"),
            ("cut-to-a-tenth", cut_store(0.1), 1, "the store file is damaged"),
            ("cut-in-half", cut_store(0.5), 1, "the store file is damaged"),
            ("newer-schema", newer_store, 2, "written by mimo-jobs 9.9.0"),
            ("schema-version-not-a-number", unnumbered_store, 1, "schema_version is 'five', not a number"),
            ("another-applications-duckdb", foreign_db, 2, "not a mimo-jobs store"),
        ]:
            prepare, check = unchanged(setup)
            out.append(Case(f"{cmd}-{what}", argv, code, (says,), setup=prepare, check=check, timeout_s=30))
        out.append(Case(f"{cmd}-directory", argv, 2, ("a directory, not a store file",), setup=a_directory))
    return out


def older_cases() -> list[Case]:
    """report and predict --db read a store of every older schema and leave it as it is."""
    out = []
    for version in (1, 3, 4):
        for fmt in ("table", "json"):
            prepare, check = unchanged(older_store(version))
            argv = ["report", "--db", DB, "-f", fmt]
            out.append(
                Case(f"report-{fmt}-schema-{version}", argv, 0, ("slurm-4242",), setup=prepare, check=check)
            )
        prepare, check = unchanged(older_store(version, study="cpu_local"))
        argv = ["predict", STUDY, "--db", DB]
        says = ("no run of the study has a measured iteration time",)
        out.append(Case(f"predict-db-schema-{version}", argv, 2, says, setup=prepare, check=check))
    return out


def time_cases() -> list[Case]:
    """Zero, negative and non-finite iteration times: every format says "-" (null), none crashes."""
    out = []
    for value in ("0", "-5", "nan", "inf", "-inf"):
        for fmt in ("table", "md", "json", "csv", "html"):
            argv = ["report", "--db", DB, "-f", fmt] + (["--out", "{tmp}/html"] if fmt == "html" else [])
            out.append(
                Case(f"report-{fmt}-time-{value}", argv, 0, (), setup=measured(value), check=no_time_figures)
            )
    return out


CASES = cases()
READ_CASES = older_cases() + time_cases()


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_store(case: Case, tmp_path: Path) -> None:
    out = run_case(case, tmp_path)
    assert out.count("error:") == 1, f"one line per error:\n{out}"
    assert "locked" not in out, "a store that is not locked must not be called locked"


@pytest.mark.parametrize("case", READ_CASES, ids=[c.id for c in READ_CASES])
def test_hostile_read(case: Case, tmp_path: Path) -> None:
    out = run_case(case, tmp_path)
    assert "damaged" not in out, out


@contextlib.contextmanager
def lock_held(db: Path):
    """Another process holding the store's write lock until the block ends."""
    p = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import duckdb, sys, time; c = duckdb.connect(sys.argv[1]); print('held', flush=True); time.sleep(120)",
            str(db),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert p.stdout.readline().strip() == "held"
        yield p.pid
    finally:
        p.kill()
        p.wait()


@pytest.mark.parametrize("argv", list(COMMANDS.values()), ids=list(COMMANDS))
def test_a_held_lock_is_waited_for_visibly_and_within_the_bound(argv: list[str], tmp_path: Path) -> None:
    shutil.copy(real_store(tmp_path), tmp_path / "s.duckdb")
    with lock_held(tmp_path / "s.duckdb") as pid:
        case = Case(
            "locked",
            argv,
            1,
            (f"locked by PID {pid}", "stayed locked for 2 s"),
            env={"MIMO_JOBS_LOCK_WAIT_S": "2"},
        )
        out = run_case(case, tmp_path)
    # within the bound: the lock is still held, so only giving up after the 2 s bound ends the command
    assert f"waiting for the store {tmp_path / 's.duckdb'}: PID {pid} holds its lock (up to 2 s)" in out


def test_a_lock_released_while_waiting_lets_the_command_run(tmp_path: Path) -> None:
    shutil.copy(real_store(tmp_path), tmp_path / "s.duckdb")
    with lock_held(tmp_path / "s.duckdb"):
        p = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "mimo_jobs.cli",
                "ingest",
                LOG,
                "--force",
                "--db",
                str(tmp_path / "s.duckdb"),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        # release the lock once the command says it waits for it (read as it prints; a hang guard only)
        seen: list[str] = []
        reader = threading.Thread(target=lambda: seen.extend(iter(lambda: p.stdout.read(1), "")), daemon=True)
        reader.start()
        deadline = time.monotonic() + 300
        while (
            "waiting for the store" not in "".join(seen) and p.poll() is None and time.monotonic() < deadline
        ):
            time.sleep(0.1)
    p.wait(timeout=300)
    reader.join(timeout=60)
    out = "".join(seen)
    assert p.returncode == 0, out
    assert "waiting for the store" in out and "ingested 1 file(s)" in out


def test_a_bad_lock_wait_setting_is_refused(tmp_path: Path) -> None:
    case = Case(
        "bad-wait",
        ["ingest", LOG, "--db", DB],
        2,
        ("MIMO_JOBS_LOCK_WAIT_S='soon'",),
        env={"MIMO_JOBS_LOCK_WAIT_S": "soon"},
    )
    run_case(case, tmp_path)


@pytest.mark.parametrize("argv", [COMMANDS["status"], COMMANDS["ingest"]], ids=["status", "ingest"])
def test_a_store_on_a_read_only_filesystem_is_named_so(argv: list[str], tmp_path: Path) -> None:
    with read_only_mount(tmp_path, real_store(tmp_path)) as mnt:
        case = Case(
            "ro", [a.replace(DB, str(mnt / "real.duckdb")) for a in argv], 1, ("read-only filesystem",)
        )
        run_case(case, tmp_path)


def test_an_older_store_on_a_read_only_filesystem_is_reported(tmp_path: Path) -> None:
    older_store(3)(tmp_path)
    with read_only_mount(tmp_path, tmp_path / "s.duckdb") as mnt:
        run_case(Case("ro-old", ["report", "--db", str(mnt / "s.duckdb")], 0, ("slurm-4242",)), tmp_path)


def test_a_new_store_in_a_read_only_directory_is_named_so(tmp_path: Path) -> None:
    with read_only_mount(tmp_path, None) as mnt:
        case = Case(
            "ro-new", ["ingest", LOG, "--db", str(mnt / "sub" / "s.duckdb")], 1, ("read-only filesystem",)
        )
        run_case(case, tmp_path)


def test_a_store_records_the_version_that_wrote_it(tmp_path: Path) -> None:
    import duckdb

    from mimo_jobs import __version__

    con = duckdb.connect(str(real_store(tmp_path)), read_only=True)
    meta = dict(con.execute("SELECT key, value FROM meta").fetchall())
    assert meta["written_by"] == __version__


def test_a_full_disk_under_the_store_is_named_so_and_keeps_the_store(tmp_path: Path) -> None:
    # a small tmpfs holding a real store, then filled: ingesting a larger log cannot grow the store
    import duckdb

    mnt = tmp_path / "full"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(mnt)]).returncode != 0:
        pytest.skip("needs mount(8) (root with CAP_SYS_ADMIN) to make a small filesystem")
    try:
        db = mnt / "s.duckdb"
        shutil.copy(real_store(tmp_path), db)
        con = duckdb.connect(str(db), read_only=True)
        before = (
            con.execute("SELECT count(*) FROM runs").fetchone()[0],
            con.execute("SELECT count(*) FROM iterations").fetchone()[0],
        )
        con.close()
        with open(mnt / "filler", "wb") as f:  # every byte left
            with contextlib.suppress(OSError):
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()
        big = tmp_path / "big.log"
        line = (FIXTURES / "slurm-4242.out").read_text()
        big.write_text(line * 200)
        p = subprocess.run(
            [sys.executable, "-m", "mimo_jobs.cli", "ingest", str(big), "--db", str(db)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        out = p.stdout + p.stderr
        assert p.returncode == 1 and out.count("error:") == 1, out
        assert "no space left where the store is" in out and "damaged" not in out, out
        (mnt / "filler").unlink()
        con = duckdb.connect(str(db), read_only=True)  # still a readable store, holding what it held
        after = (
            con.execute("SELECT count(*) FROM runs").fetchone()[0],
            con.execute("SELECT count(*) FROM iterations").fetchone()[0],
        )
        con.close()
        assert after == before
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def _iteration_log(path: Path, n: int) -> Path:
    """A Megatron-format log of n iteration lines (the fixture's line format)."""
    with open(path, "w") as f:
        for i in range(1, n + 1):
            f.write(
                f" [2026-03-02 10:00:05.120000] iteration {i:8d}/ {n:8d} | consumed samples: {8 * i:12d} | "
                f"elapsed time per iteration (ms): {400 + i % 97}.0 | learning rate: 1.000000E-04 | global "
                f"batch size:     8 | lm loss: {4.8 - i * 1e-6:.6E} | loss scale: 1.0 | grad norm: 3.0{i % 10} |\n"
            )
    return path


@pytest.mark.parametrize("scanner", ["c", "python"])
def test_the_file_size_limit_under_the_store_is_named_so_and_keeps_the_store(
    scanner: str, tmp_path: Path
) -> None:
    """RLIMIT_FSIZE (SIGXFSZ ignored, so a write past it fails with EFBIG as on a filesystem's own limit)
    just above the store's size: ingesting a larger log cannot grow the store (the compiled scanner writes
    its rows into the store as it reads; the Python one stages them in a temporary file first, which meets
    the limit). The command says which limit, names the file's place, exits 1, and the store keeps what it
    held: no run without its rows."""
    import duckdb

    db = real_store(tmp_path)
    staging = tmp_path / "staging"
    staging.mkdir()
    where = str(db) if scanner == "c" else str(staging)

    def counts() -> tuple:
        con = duckdb.connect(str(db), read_only=True)
        try:
            return tuple(
                con.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
                for t in ("runs", "studies", "iterations", "ingested_files")
            )
        finally:
            con.close()

    before = counts()
    big = _iteration_log(tmp_path / "big.log", 40_000)
    limit = db.stat().st_size + 64 * 1024

    def limited() -> None:
        import resource
        import signal

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    p = subprocess.run(
        [sys.executable, "-m", "mimo_jobs.cli", "ingest", str(big), "--db", str(db)],
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=limited,
        env={**os.environ, "MIMO_JOBS_SCANNER": scanner, "TMPDIR": str(staging)},
    )
    out = " ".join((p.stdout + p.stderr).split())
    assert p.returncode == 1 and out.count("error:") == 1, out
    assert f"{where}: file size limit" in out and "File too large" in out and "damaged" not in out, out
    assert counts() == before

"""Every rank's own phase timers in its memory-facts record: validated by the contract, stored by ingest in
rank_memory's timing columns, migrated into older stores (read-only readers see them empty), and, from the
real trainer (the demo study's 2-encoder/2-LLM heterogeneous run), the module figures of the report."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import duckdb
import pytest

from helpers.pair_store import HET, build_report
from mimo_jobs.contract.iteration import PHASES
from mimo_jobs.contract.memory import TIMING_COLUMNS, MemoryFacts, ModuleMemory, facts_path
from mimo_jobs.ingest import pipeline as ingest
from mimo_jobs.ingest.memory import rows_of
from mimo_jobs.report import build
from mimo_jobs.report.modules import BUSY, WAIT
from mimo_jobs.store import connection as store
from mimo_jobs.store.schema import SCHEMA_VERSION

TIMED = {
    "role": "llm",
    "timed_iterations": 9,
    "elapsed_s": 1.5,
    "phases_s": {"llm_fwd": 0.5, "bridge_wait": 0.25},
}
FACTS = {
    "rank": 1,
    "modules": {"language": {"params": 10, "param_bytes": 40, "grad_buffer_bytes": 40}},
    "saved_activation_peak_bytes": 100,
    **TIMED,
}


def test_the_timers_round_trip_and_reach_their_columns():
    rec = MemoryFacts.from_json(FACTS)
    assert MemoryFacts.from_json(rec.to_json()) == rec and rec.to_json()["phases_s"] == TIMED["phases_s"]
    (row,) = rows_of(rec, "r", "f.json", 1.0)
    stored = dict(zip(TIMING_COLUMNS, row[-len(TIMING_COLUMNS) :]))
    assert stored["role"] == "llm" and stored["timed_iterations"] == 9 and stored["elapsed_s"] == 1.5
    # a phase the rank did not run is 0 s, not unknown
    assert {p: stored[f"{p}_s"] for p in PHASES} == {p: TIMED["phases_s"].get(p, 0.0) for p in PHASES}


def test_a_record_without_timers_keeps_them_unknown():
    old = {k: v for k, v in FACTS.items() if k not in TIMED}
    assert "role" not in MemoryFacts.from_json(old).to_json()
    (row,) = rows_of(MemoryFacts.from_json(old), "r", "f.json", 1.0)
    assert row[-len(TIMING_COLUMNS) :] == (None,) * len(TIMING_COLUMNS)


@pytest.mark.parametrize(
    "change, says",
    [
        ({"role": "decoder"}, "role: expected one of encoder, llm, colocated, got 'decoder'"),
        ({"elapsed_s": -1.0}, "elapsed_s: expected a number of seconds >= 0, got -1.0"),
        ({"elapsed_s": True}, "elapsed_s: expected a number of seconds >= 0"),
        ({"phases_s": {"llm_fwd": float("inf")}}, "phases_s.llm_fwd: expected a number of seconds >= 0"),
        ({"phases_s": [1.0]}, "phases_s: expected an object of phase -> seconds, got list"),
        ({"timed_iterations": 1.5}, "timed_iterations: expected a whole number >= 0"),
    ],
)
def test_a_bad_timer_field_is_named(change, says):
    with pytest.raises(ValueError, match=says.replace("(", r"\(").replace(")", r"\)")):
        MemoryFacts.from_json({**FACTS, **change})


def _timed_store(tmp: Path) -> Path:
    """A real store (helpers/pair_store.py) whose heterogeneous run's two ranks wrote timed facts."""

    def prepare(con, runs):
        run = runs[HET]
        root = Path(con.execute("SELECT run_dir FROM runs WHERE run_id = ?", [run.run_id]).fetchone()[0])
        for rank, role, mod, ph in ((0, "encoder", "encoder", {"enc_fwd": 0.4, "bridge_wait": 0.4}),
                                    (1, "llm", "language", {"llm_fwd": 0.7, "bridge_wait": 0.1})):  # fmt: skip
            f = MemoryFacts(rank, {mod: ModuleMemory(1, 4, 4)}, 8, role=role, timed_iterations=10,
                            elapsed_s=1.0, phases_s=ph)  # fmt: skip
            p = facts_path(root, rank)
            p.parent.mkdir(exist_ok=True)
            p.write_text(json.dumps(f.to_json()))
        ingest.ingest_paths(con, [root.parent.parent])

    build_report(tmp, {HET: 100.0, "1n-colo-l2x1x1-g8": 90.0, "1n-colo-l1x1x2-g8": 95.0}, prepare=prepare)
    return tmp / "s.duckdb"


def _to_schema_6(db: Path) -> None:
    con = duckdb.connect(str(db))
    for c in TIMING_COLUMNS:
        con.execute(f"ALTER TABLE rank_memory DROP COLUMN {c}")
    con.execute("UPDATE meta SET value = '6' WHERE key = 'schema_version'")
    con.close()


def test_an_older_store_is_read_and_migrated(tmp_path):
    db = _timed_store(tmp_path)
    con = store.connect(db, read_only=True)
    try:
        assert {m.module for m in build(con, "pairs").modules} == {"vision", "llm"}
    finally:
        con.close()
    _to_schema_6(db)
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    con = store.connect(db, read_only=True)  # a reader sees schema 6 as the current one, timers unknown
    try:
        rep = build(con, "pairs")
    finally:
        con.close()
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before
    assert rep.modules == [] and rep.bounds == [] and len(rep.memory) == 2  # memory facts still read
    con = store.connect(db)  # a writer migrates: the columns come back, empty, until the next ingest
    try:
        assert con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0] == str(
            SCHEMA_VERSION
        )
        assert con.execute("SELECT count(*), count(role) FROM rank_memory").fetchone() == (2, 0)
        ingest.ingest_paths(con, [tmp_path / "runs"])  # the files are read again: they hold the timers
        assert con.execute("SELECT count(role) FROM rank_memory").fetchone() == (2,)
        (b,) = [x for x in build(con, "pairs").bounds if x.name == HET]
    finally:
        con.close()
    assert b.bound == "llm" and b.encoder_idle == pytest.approx(0.5)


# -- the real trainer


def _demo_facts(runs: Path, name: str) -> list[dict]:
    (run_dir,) = runs.glob(f"cpu_local/{name}-*")
    return [json.loads(p.read_text()) for p in sorted((run_dir / "memory").glob("rank-*.json"))]


@pytest.mark.slow
def test_the_real_trainer_times_both_modules(tmp_path_factory):
    from helpers.demo_runs import demo_store

    db, runs = demo_store(tmp_path_factory)
    name = "1n-e1x2-l1x1x2-g6"  # 2 encoder replicas (ranks 0, 1), 2 LLM lanes (ranks 2, 3)
    facts = _demo_facts(runs, name)
    assert [(f["rank"], f["role"]) for f in facts] == [(0, "encoder"), (1, "encoder"), (2, "llm"), (3, "llm")]
    for f in facts:
        ph = f["phases_s"]
        assert f["timed_iterations"] == 19  # 20 iterations, the first is the warm-up
        assert sum(ph.values()) <= f["elapsed_s"]  # the phases are spans inside the step
        own, other = ("enc_fwd", "llm_fwd") if f["role"] == "encoder" else ("llm_fwd", "enc_fwd")
        assert ph[own] > 0 and ph.get(other, 0.0) == 0.0 and ph["bridge_wait"] > 0
    # the last LLM rank's timers are those metrics.jsonl logs per iteration
    (run_dir,) = runs.glob(f"cpu_local/{name}-*")
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    logged = [r for r in recs if r["kind"] == "iteration" and r["iteration"] > 1]
    for p in ("llm_fwd", "llm_bwd", "bridge_wait"):
        assert facts[3]["phases_s"][p] * 1e3 == pytest.approx(
            sum(r["phases_ms"][p] for r in logged), rel=1e-6
        )
    con = store.connect(db, read_only=True)
    try:
        rep = build(con, "cpu_local")
    finally:
        con.close()
    mods = {m.module: m for m in rep.modules if m.name == name}
    assert sorted(mods) == ["llm", "vision"] and mods["vision"].ranks == mods["llm"].ranks == 2
    for m, fs in ((mods["vision"], facts[:2]), (mods["llm"], facts[2:])):
        elapsed = sum(f["elapsed_s"] for f in fs)
        busy = sum(f["phases_s"].get(p, 0.0) for f in fs for p in BUSY)
        wait = sum(f["phases_s"].get(p, 0.0) for f in fs for p in WAIT)
        assert m.busy_share == pytest.approx(busy / elapsed) and m.wait_share == pytest.approx(wait / elapsed)
        assert 0 < m.busy_share < 1 and 0 < m.wait_share < 1 and 0 <= m.rest_share < 1
        assert m.busy_share + m.wait_share + m.rest_share == pytest.approx(1.0)
        assert m.idle == pytest.approx(wait / (busy + wait))
    (b,) = [x for x in rep.bounds if x.name == name]
    slower = "vision" if mods["vision"].busy_ms > mods["llm"].busy_ms else "llm"
    assert b.bound == slower and b.predicted_bottleneck in ("vision", "llm")
    (colo,) = {m.module for m in rep.modules if m.name == "1n-colo-l2x1x2-g6"}
    assert colo == "colocated"

"""A vision + audio study reported per module, under the names the study gives them: the two-encoder study's
runs (test_encoder_phases.py: each module on ranks of its own, and colocated) ingested from their run
directories, where every rank wrote its memory facts as the trainer's writer writes them (keyed by the
trainer's slot names `encoder`, `encoder.audio`, `language`; each module's own activation peak; each
encoder module's forward and backward timed under its name). The store, the measured and predicted memory,
the module phase table and the bounds read `vision`, `audio`, `llm` in text, JSON and HTML alike; an older
store that kept the trainer's names reads the same, read-only or migrated."""

from __future__ import annotations

import hashlib
import json
import re

import duckdb
import pytest
from test_encoder_phases import _report

from mimo_jobs.contract.rundir import RunDir
from mimo_jobs.ingest import pipeline as ingest
from mimo_jobs.report import build, render
from mimo_jobs.store import connection as store
from mimo_jobs.store.schema import SCHEMA_VERSION
from mimo_jobs.trainer.observe.memory import write_facts

ITERS = 10  # the timed iterations each rank's facts sum over
# per role of the split run: (ranks, trainer slot, params, param, grad, optimizer bytes, the module's own
# activation peak, the rank's, its phases in seconds summed over ITERS): vision 0-3, audio 4-7, LLM 8-15
SPLIT = {
    "vision": (range(0, 4), "encoder", 25, 100, 200, 400, 40, 50,
               {"vision_fwd": 0.02, "vision_bwd": 0.04, "data": 0.01, "bridge_wait": 0.8, "optimizer": 0.03}),
    "audio": (range(4, 8), "encoder.audio", 250, 1000, 2000, 4000, 850, 900,
              {"audio_fwd": 0.3, "audio_bwd": 0.6, "data": 0.01, "bridge_wait": 0.05, "optimizer": 0.03}),
    "llm": (range(8, 16), "language", 75, 300, 600, 1200, 650, 700,
            {"llm_fwd": 0.05, "llm_bwd": 0.1, "bridge_wait": 0.7, "optimizer": 0.03}),
}  # fmt: skip
COLOCATED_PHASES = {"vision_fwd": 0.02, "audio_fwd": 0.3, "llm_fwd": 0.05, "llm_bwd": 0.7, "optimizer": 0.03}
TRAINER_NAMES = ("encoder", "encoder.audio", "language")


def _facts(rank: int, role: str, modules: dict, rank_peak: int, phases: dict) -> dict:
    return {
        "rank": rank,
        "iteration": 12,
        "tp_rank": 0,
        "pp_rank": 0,
        "dp_rank": rank,
        "modules": modules,
        "saved_activation_peak_bytes": rank_peak,
        "inflight_peak": 1,
        "role": role,
        "timed_iterations": ITERS,
        "elapsed_s": 1.2,
        "phases_s": phases,
    }


def _module(params, p, g, o, own) -> dict:
    return {"params": params, "param_bytes": p, "grad_buffer_bytes": g, "optimizer_state_bytes": o,
            "saved_activation_peak_bytes": own}  # fmt: skip


def _write_facts(tmp, runs) -> None:
    for run in runs:
        root = RunDir.of(tmp / "runs", run.study, run.name, run.run_id).root
        if run.layout.colocated:
            mods = {slot: _module(*f[2:7]) for f in SPLIT.values() for slot in [f[1]]}
            for rank in range(16):
                write_facts(root, _facts(rank, "colocated", mods, 1600, COLOCATED_PHASES))
            continue
        for name, (ranks, slot, *figures, rank_peak, phases) in SPLIT.items():
            role = "llm" if name == "llm" else "encoder"
            for rank in ranks:
                write_facts(root, _facts(rank, role, {slot: _module(*figures)}, rank_peak, phases))


@pytest.fixture(scope="module")
def av(tmp_path_factory):
    """The two-encoder study's store with every rank's facts ingested from its run directory."""
    tmp = tmp_path_factory.mktemp("av")
    _rep, runs = _report(tmp)
    _write_facts(tmp, runs)
    con = store.connect(tmp / "s.duckdb")
    try:
        ingest.ingest_paths(con, [tmp / "runs"])
    finally:
        con.close()
    return tmp, {("colo" if r.layout.colocated else "split"): r for r in runs}


def _build(db, read_only=True):
    con = store.connect(db, read_only=read_only)
    try:
        return build(con, "av", gpu="h100")
    finally:
        con.close()


def test_the_store_keeps_each_module_by_its_study_name_with_its_activation_peak(av):
    tmp, runs = av
    con = store.connect(tmp / "s.duckdb", read_only=True)
    try:
        rows = con.execute(
            """SELECT module, count(*), max(module_saved_activation_peak_bytes), max(enc_fwd_s), max(enc_bwd_s)
               FROM rank_memory WHERE run_id = ? GROUP BY 1 ORDER BY 1""",
            [runs["split"].run_id],
        ).fetchall()
    finally:
        con.close()
    # each encoder module's own forward and backward count to its rank's encoder phases
    assert rows == [("audio", 4, 850, 0.3, 0.6), ("llm", 8, 650, 0.0, 0.0), ("vision", 4, 40, 0.02, 0.04)]


def test_measured_and_predicted_memory_per_module(av):
    tmp, runs = av
    rep = _build(tmp / "s.duckdb")
    split, colo = runs["split"].run_id, runs["colo"].run_id
    mem = {m.module: m for m in rep.memory if m.run_id == split}
    assert set(mem) == {"vision", "audio", "llm"}
    assert [(mem[n].ranks, mem[n].module_activation_peak_bytes, mem[n].saved_activation_peak_bytes)
            for n in ("vision", "audio", "llm")] == [(4, 40, 50), (4, 850, 900), (8, 650, 700)]  # fmt: skip
    assert {m.module: m.module_activation_peak_bytes for m in rep.memory if m.run_id == colo} == {
        "vision": 40,
        "audio": 850,
        "llm": 650,
    }
    pred = {m.rank_class: m for m in rep.predicted_memory if m.run_id == split}
    assert set(pred) == {"vision", "audio", "llm"}
    for name, (ranks, _slot, _n, p, g, o, _own, rank_peak, _ph) in SPLIT.items():
        assert (pred[name].measured_ranks, pred[name].measured_bytes) == (len(ranks), p + g + o + rank_peak)
        assert pred[name].measured_activation_bytes == rank_peak and pred[name].predicted_activation_bytes > 0
    (whole,) = [m for m in rep.predicted_memory if m.run_id == colo]
    every = sum(p + g + o for (_r, _s, _n, p, g, o, *_rest) in SPLIT.values())
    assert (whole.rank_class, whole.measured_ranks, whole.measured_bytes) == (
        "vision+audio+llm",
        16,
        every + 1600,
    )


def test_the_phase_table_and_bounds_per_module(av):
    tmp, runs = av
    rep = _build(tmp / "s.duckdb")
    split, colo = runs["split"].run_id, runs["colo"].run_id
    mods = [m for m in rep.modules if m.run_id == split]
    assert [(m.module, m.ranks) for m in mods] == [("vision", 4), ("audio", 4), ("llm", 8)]
    busy = {m.module: m.busy_ms for m in mods}
    per = 1e3 / ITERS  # ms per iteration of a second summed over ITERS
    assert busy["vision"] == pytest.approx((0.02 + 0.04 + 0.01) * per)
    assert busy["audio"] == pytest.approx((0.3 + 0.6 + 0.01) * per)
    assert busy["llm"] == pytest.approx((0.05 + 0.1) * per)
    assert set(mods[1].phase_ms) >= {"audio_fwd", "audio_bwd"}
    (colocated,) = [m for m in rep.modules if m.run_id == colo]
    assert colocated.module == "colocated" and colocated.busy_ms == pytest.approx(1.07 * per)
    (b,) = [x for x in rep.bounds if x.run_id == split]
    assert (b.bound, b.bound_side, b.encoder_busy_ms) == ("audio", "encoder", pytest.approx(busy["audio"]))
    # the planner prices whisper-small's full clips as the slowest module too
    assert (b.predicted_bottleneck, b.agrees) == ("audio", True)
    assert b.other_idle == pytest.approx(0.7 / (0.7 + 0.15))  # the LLM waits


def _cells(rep) -> set[str]:
    """Every module name the report's tables show."""
    return (
        {m.module for m in rep.memory}
        | {m.rank_class for m in rep.predicted_memory}
        | {m.module for m in rep.modules}
        | {e.module for e in rep.encoder_phases}
        | {b.bound for b in rep.bounds if b.bound}
        | {p.bottleneck for p in rep.predicted}
        | {r["module"] for r in rep.rank_memory}
    )


# a cell that holds the trainer's name of a module: alone between a table's separators, or in JSON under a
# key that names a module (a rank's role and the bounding side are `encoder` by right)
_SLOT_CELL = re.compile(r"(^|[│┃|,>])\s*encoder\s*([│┃|,<]|$)", re.M)
_SLOT_KEY = re.compile(r'"(module|rank_class|bound|bottleneck|predicted_bottleneck)": "(encoder|language)')


@pytest.mark.parametrize("form", ["table", "md", "json", "html", "csv"])
def test_no_table_names_a_module_as_the_trainer_does(av, form):
    tmp, _ = av
    rep = _build(tmp / "s.duckdb")
    assert _cells(rep) == {"vision", "audio", "llm", "vision+audio+llm", "colocated"}
    out = render(rep, form)
    for slot in ("encoder.audio", "language", "encoder+llm"):
        assert slot not in out, (form, slot)
    assert not _SLOT_CELL.search(out) and not _SLOT_KEY.search(out), form
    if form == "csv":  # a run per line, each module's figures in columns under its name
        head = out.splitlines()[0].split(",")
        assert {"vision_busy_share", "audio_busy_share", "llm_busy_share"} <= set(head)
    else:
        assert "vision+audio+llm" in out
    if form == "json":
        doc = json.loads(out)
        assert {m["module"] for m in doc["memory"]} == {"vision", "audio", "llm"}
        assert {r["module"] for r in doc["rank_memory"]} == {"vision", "audio", "llm"}
        assert {m["module_activation_peak_bytes"] for m in doc["memory"]} == {40, 850, 650}


def _to_schema_8(db) -> None:
    """The store as schema 8 kept it: the trainer's slot names, no per-module activation peak."""
    con = duckdb.connect(str(db))
    con.execute("ALTER TABLE rank_memory DROP COLUMN module_saved_activation_peak_bytes")
    for slot, name in zip(TRAINER_NAMES, ("vision", "audio", "llm")):
        con.execute("UPDATE rank_memory SET module = ? WHERE module = ?", [slot, name])
    con.execute("UPDATE meta SET value = '8' WHERE key = 'schema_version'")
    con.close()


def test_an_older_store_reads_by_the_study_names_and_is_migrated(av, tmp_path):
    tmp, runs = av
    db = tmp_path / "old.duckdb"
    db.write_bytes((tmp / "s.duckdb").read_bytes())
    _to_schema_8(db)
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    rep = _build(db)  # read-only: shown in the current schema, nothing written
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before
    assert _cells(rep) == {"vision", "audio", "llm", "vision+audio+llm", "colocated"}
    assert {m.module_activation_peak_bytes for m in rep.memory} == {None}  # not kept before schema 9
    con = store.connect(db)  # a writer migrates: the names now, the peaks at the next ingest
    try:
        assert con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == (
            str(SCHEMA_VERSION),
        )
        names = {r[0] for r in con.execute("SELECT DISTINCT module FROM rank_memory").fetchall()}
        assert names == {"vision", "audio", "llm"}
        ingest.ingest_paths(con, [tmp / "runs"])
        peaks = con.execute(
            "SELECT module, max(module_saved_activation_peak_bytes) FROM rank_memory GROUP BY 1 ORDER BY 1"
        ).fetchall()
    finally:
        con.close()
    assert peaks == [("audio", 850), ("llm", 650), ("vision", 40)]

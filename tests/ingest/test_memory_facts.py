"""The memory-facts record (contract.memory): the trainer's writer and ingest's reader share it."""

from __future__ import annotations

import json

import pytest

from mimo_jobs.contract.memory import MemoryFacts, ModuleMemory, facts_path
from mimo_jobs.ingest.memory import store_memory
from mimo_jobs.store import connection as store
from mimo_jobs.trainer.observe.memory import write_facts

FACTS = {
    "rank": 3,
    "iteration": 20,
    "tp_rank": 1,
    "pp_rank": 0,
    "dp_rank": 1,
    "modules": {"language": {"params": 10, "param_bytes": 40, "grad_buffer_bytes": 40, "optimizer_state_bytes": 80}},
    "saved_activation_peak_bytes": 1000,
    "inflight_peak": 2,
}  # fmt: skip


def test_written_by_the_trainer_stored_by_ingest(tmp_path):
    path = write_facts(tmp_path, FACTS)
    assert path == facts_path(tmp_path, 3) and json.loads(path.read_text()) == FACTS
    con = store.connect(tmp_path / "s.duckdb")
    try:
        n, problems = store_memory(con, tmp_path, "r1")
        row = con.execute(
            "SELECT rank, module, params, optimizer_state_bytes, inflight_peak, cuda_max_allocated_bytes, "
            "module_saved_activation_peak_bytes FROM rank_memory"
        ).fetchall()
    finally:
        con.close()
    assert (n, problems) == (1, [])
    # the trainer's slot `language` is stored as the study names it; no per-module peak in this record
    assert row == [(3, "llm", 10, 80, 2, None, None)]


def test_the_record_round_trips():
    rec = MemoryFacts.from_json(FACTS)
    assert rec.modules["language"] == ModuleMemory(10, 40, 40, 80)
    assert MemoryFacts.from_json(rec.to_json()) == rec


def test_a_module_activation_peak_round_trips_and_a_record_without_one_reads():
    per_module = FACTS | {
        "modules": {"language": FACTS["modules"]["language"] | {"saved_activation_peak_bytes": 700}}
    }
    rec = MemoryFacts.from_json(per_module)
    assert rec.modules["language"].saved_activation_peak_bytes == 700
    assert rec.to_json() == per_module and MemoryFacts.from_json(rec.to_json()) == rec
    old = MemoryFacts.from_json(FACTS)  # written before the trainer measured it per module
    assert old.modules["language"].saved_activation_peak_bytes is None and old.to_json() == FACTS


@pytest.mark.parametrize(
    "change, says",
    [
        ({"rank": None}, "rank: missing"),
        ({"rank": "3"}, "rank: expected a whole number"),
        ({"saved_activation_peak_bytes": float("nan")}, "saved_activation_peak_bytes: expected a whole number"),
        ({"inflight_peak": True}, "inflight_peak: expected a whole number"),
        ({"modules": {"language": {"params": 1}}}, "modules.language.param_bytes: missing"),
        ({"modules": []}, "expected an object with 'rank' and 'modules'"),
    ],
)  # fmt: skip
def test_a_bad_field_is_named(change, says):
    with pytest.raises(ValueError, match=says.replace("(", r"\(").replace(")", r"\)")):
        MemoryFacts.from_json({**FACTS, **change})


def test_a_bad_file_is_a_problem_of_the_ingest(tmp_path):
    p = facts_path(tmp_path, 0)
    p.parent.mkdir()
    p.write_text(json.dumps({**FACTS, "rank": -1}))
    con = store.connect(tmp_path / "s.duckdb")
    try:
        n, problems = store_memory(con, tmp_path, "r1")
    finally:
        con.close()
    assert n == 0 and len(problems) == 1 and "rank: expected a whole number >= 0, got -1" in problems[0]

"""Predicted-vs-measured memory of a vision + audio run on ranks of their own: each measured rank is put in
the class of the module whose ranks hold it (study/topology.py module_ranges), not by the module name the
trainer's memory facts store (`encoder`, `encoder.audio`, `language`). A real store: the two-encoder study's
runs ingested from their run records, each rank's memory facts as the trainer's writer stores them."""

from __future__ import annotations

from test_encoder_phases import _report

from mimo_jobs.report import build
from mimo_jobs.store import connection as store

# (rank, stored module, param, grad, optimizer, saved activations): vision ranks 0-3, audio 4-7, LLM 8-15
FACTS = [(r, "encoder", 100, 200, 400, 50) for r in range(4)]
FACTS += [(r, "encoder.audio", 1000, 2000, 4000, 900) for r in range(4, 8)]
FACTS += [(r, "language", 300, 600, 1200, 700) for r in range(8, 16)]


def test_each_rank_is_measured_in_its_own_modules_class(tmp_path):
    _rep, runs = _report(tmp_path)
    het = next(r for r in runs if not r.layout.colocated)
    con = store.connect(tmp_path / "s.duckdb")
    try:
        for rank, module, p, g, o, a in FACTS:
            con.execute(
                """INSERT INTO rank_memory (run_id, rank, module, tp_rank, pp_rank, dp_rank, iteration,
                       params, param_bytes, grad_buffer_bytes, optimizer_state_bytes,
                       saved_activation_peak_bytes, inflight_peak) VALUES (?, ?, ?, 0, 0, ?, 12, ?, ?, ?, ?,
                       ?, 1)""",
                [het.run_id, rank, module, rank, p // 4, p, g, o, a],
            )
        rep = build(con, "av", gpu="h100")
    finally:
        con.close()
    rows = {m.rank_class: m for m in rep.predicted_memory if m.run_id == het.run_id}
    assert set(rows) == {"vision", "audio", "llm"}
    assert (rows["vision"].measured_ranks, rows["vision"].measured_bytes) == (4, 100 + 200 + 400 + 50)
    assert (rows["audio"].measured_ranks, rows["audio"].measured_bytes) == (4, 1000 + 2000 + 4000 + 900)
    assert (rows["llm"].measured_ranks, rows["llm"].measured_bytes) == (8, 300 + 600 + 1200 + 700)

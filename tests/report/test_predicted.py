"""The report's predicted-vs-measured sections: the planner's figures for each run (mimo_jobs.predict on the
run's stored spec) against the steady-state time and the trainer's per-rank memory facts."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import replace

import pytest

from helpers.scaling_store import build_store
from mimo_jobs.predict.estimate import predict_run
from mimo_jobs.predict.hardware import TIME_MODEL_DEFAULT, get_gpu
from mimo_jobs.report import build, render

MEASURED_S = {1: 0.405, 2: 0.200, 4: 0.090}  # the store's steady-state medians (tests/helpers)
# (rank, module as the store names it, param, grad, optimizer, saved activations) of the 2-node run: vision
# ranks 0-1, LLM 2-3
FACTS = [
    (0, "vision", 1000, 2000, 4000, 500),
    (1, "vision", 1000, 2000, 4000, 900),
    (2, "llm", 3000, 6000, 12000, 7000),
    (3, "llm", 3000, 6000, 12000, 6000),
]


@pytest.fixture(scope="module")
def store_(tmp_path_factory):
    con, runs = build_store(tmp_path_factory.mktemp("pred"))
    rid = next(r.run_id for r, _ in runs if r.layout.nodes == 2)
    for rank, module, p, g, o, a in FACTS:
        con.execute(
            """INSERT INTO rank_memory (run_id, rank, module, tp_rank, pp_rank, dp_rank, iteration, params,
                   param_bytes, grad_buffer_bytes, optimizer_state_bytes, saved_activation_peak_bytes,
                   inflight_peak) VALUES (?, ?, ?, 0, 0, ?, 20, ?, ?, ?, ?, ?, 1)""",
            [rid, rank, module, rank % 2, p // 4, p, g, o, a],
        )
    yield con, runs
    con.close()


def test_time_figures_are_the_planners_against_the_measured(store_):
    con, runs = store_
    rep = build(con, "scal", gpu="H100")
    got = {p.run_id: p for p in rep.predicted}
    assert len(got) == 3
    for run, _ in runs:
        # the study states no cluster.hardware: its runs are priced by the spec's default time model
        want, row = predict_run(run, replace(get_gpu("H100"), time_model=TIME_MODEL_DEFAULT)), got[run.run_id]
        measured = MEASURED_S[run.layout.nodes]
        assert row.gpu == "H100" and row.predicted_s == want.time.iteration_s
        assert row.measured_s == pytest.approx(measured)
        assert row.error == pytest.approx((want.time.iteration_s - measured) / measured)
        assert row.predicted_tokens_per_s_per_gpu == want.tokens_per_s_per_gpu
        tok = 8 * 64 / measured / (2 * run.layout.nodes)  # gbs 8, seq 64, all GPUs of the job
        assert row.measured_tokens_per_s_per_gpu == pytest.approx(tok)
        assert row.tokens_error == pytest.approx((want.tokens_per_s_per_gpu - tok) / tok)
        assert row.memory == want.memory.verdict()
        # the planner's one image encoder (its module `encoder`) by the study's name
        assert row.bottleneck == {"encoder": "vision"}.get(want.time.bottleneck, want.time.bottleneck)


def test_memory_classes_against_the_largest_measured_rank(store_):
    con, runs = store_
    rep = build(con, "scal", gpu="H100")
    run = next(r for r, _ in runs if r.layout.nodes == 2)
    rows = {m.rank_class: m for m in rep.predicted_memory}
    assert set(rows) == {"vision", "llm"} and {m.run_id for m in rep.predicted_memory} == {run.run_id}
    plan = predict_run(run, get_gpu("H100")).memory
    for cls, m in zip(plan.classes, (rows["vision"], rows["llm"])):
        pred = sum(
            x.weight_bytes + x.grad_bytes + x.optimizer_bytes + x.activation_bytes for x in cls.modules
        )
        assert m.predicted_bytes == pred and m.ranks == f"{cls.ranks[0]}-{cls.ranks[1]}"
        assert m.predicted_activation_bytes == sum(x.activation_bytes for x in cls.modules)
    assert (rows["vision"].measured_activation_bytes, rows["llm"].measured_activation_bytes) == (900, 7000)
    assert rows["vision"].measured_bytes == 1000 + 2000 + 4000 + 900  # rank 1, the fuller one
    assert rows["llm"].measured_bytes == 3000 + 6000 + 12000 + 7000  # rank 2
    assert rows["llm"].measured_ranks == 2
    m = rows["llm"]
    assert m.error == pytest.approx((m.predicted_bytes - m.measured_bytes) / m.measured_bytes)


def test_no_accelerator_no_prediction(store_):
    con, _ = store_
    rep = build(con, "scal")  # GPU runs, no --gpu, no GPU named in the logs: nothing to price them on
    assert rep.predicted == [] and rep.predicted_memory == []
    assert "Predicted vs measured" not in render(rep, "table")


def test_every_format_carries_the_predictions(store_):
    con, runs = store_
    rep = build(con, "scal", gpu="h100")
    r1 = next(p for p in rep.predicted if p.measured_s == pytest.approx(0.405))
    assert "Predicted vs measured time" in render(rep, "table")
    assert "Predicted vs measured memory per rank class" in render(rep, "table")
    assert "## Predicted vs measured time" in render(rep, "md")
    assert "Predicted vs measured memory per rank class" in render(rep, "html")
    doc = json.loads(render(rep, "json"))
    assert {p["run_id"]: p["error"] for p in doc["predicted"]}[r1.run_id] == pytest.approx(r1.error)
    assert len(doc["predicted_memory"]) == 2
    rows = {r["run_id"]: r for r in csv.DictReader(io.StringIO(render(rep, "csv")))}
    assert float(rows[r1.run_id]["predicted_error"]) == pytest.approx(r1.error)
    assert float(rows[r1.run_id]["predicted_s_per_iter"]) == pytest.approx(r1.predicted_s)
    assert "cpu: times priced from FLOPs alone" not in render(rep, "md")  # GPU-priced: no CPU caveat


def test_cpu_priced_times_carry_their_caveat(store_):
    from dataclasses import replace

    from mimo_jobs.report import sections

    con, _ = store_
    rep = build(con, "scal", gpu="h100")
    assert sections.CPU_TIME_NOTE not in sections.predicted(rep).lines
    # as for an uncalibrated CPU run
    rep.predicted[0] = replace(rep.predicted[0], gpu="cpu", calibrated=False)
    assert sections.predicted(rep).lines[-1] == sections.CPU_TIME_NOTE

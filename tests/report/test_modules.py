"""Both modules' phases from every rank's own timers (report/modules.py): the math against a hand computation,
and a real store (helpers/pair_store.py) whose ranks' facts files go through ingest, where the bounding side
must follow which side the timers say is slow, in every format."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from helpers.pair_store import DP2, HET, TP2, build_report
from mimo_jobs.contract.iteration import PHASES
from mimo_jobs.contract.memory import MemoryFacts, ModuleMemory, facts_path
from mimo_jobs.ingest import pipeline as ingest
from mimo_jobs.report import render
from mimo_jobs.report.model import PredictedRow, RunRow
from mimo_jobs.report.modules import BUSY, OPTIMIZER, WAIT, bound_rows, module_rows

# seconds summed over 10 timed iterations; untimed 0.05 s on each rank
SLOW_LLM = {
    "encoder": {"enc_fwd": 0.2, "enc_bwd": 0.3, "data": 0.05, "bridge_wait": 0.3, "optimizer": 0.1},
    "llm": {"llm_fwd": 0.25, "llm_bwd": 0.35, "data": 0.05, "bridge_wait": 0.2, "optimizer": 0.1},
}
SLOW_ENCODER = {
    "encoder": {"enc_fwd": 0.3, "enc_bwd": 0.4, "data": 0.05, "bridge_wait": 0.1, "optimizer": 0.1},
    "llm": {"llm_fwd": 0.15, "llm_bwd": 0.2, "data": 0.05, "bridge_wait": 0.45, "optimizer": 0.1},
}
COLOCATED = {"enc_fwd": 0.2, "llm_fwd": 0.3, "llm_bwd": 0.35, "data": 0.05, "optimizer": 0.05}


def _rank(run_id: str, rank: int, role: str, phases: dict, pp: int = 0, elapsed: float = 1.0) -> dict:
    """A rank_memory row's timing fields, as ingest stores them."""
    return {"run_id": run_id, "rank": rank, "module": "vision" if role == "encoder" else "llm",
            "pp_rank": pp, "role": role, "timed_iterations": 10, "elapsed_s": elapsed,
            **{f"{p}_s": phases.get(p, 0.0) for p in PHASES}}  # fmt: skip


def _run(run_id: str, colocated: bool = False) -> RunRow:
    return RunRow("s", run_id, run_id, 1, 4, 8, 32, "tiny", "-", "COMPLETED", "jobs", 12, 12, 1, 2,
                  colocated=colocated)  # fmt: skip


def test_every_phase_is_busy_waiting_or_the_optimizer():
    assert sorted((*BUSY, *WAIT, OPTIMIZER)) == sorted(PHASES)


def test_module_figures_by_hand():
    # two encoder ranks, two LLM stages of one rank each; the second stage also waits on the pipeline
    enc2 = {**SLOW_LLM["encoder"], "bridge_wait": 0.4}
    stage1 = {"llm_fwd": 0.3, "llm_bwd": 0.4, "data": 0.05, "pipeline_wait": 0.1, "optimizer": 0.1}
    ranks = [
        _rank("h", 0, "encoder", SLOW_LLM["encoder"]),
        _rank("h", 1, "encoder", enc2, elapsed=1.1),
        _rank("h", 2, "llm", SLOW_LLM["llm"], pp=0),
        _rank("h", 3, "llm", stage1, pp=1),
    ]
    mods = module_rows(ranks, [_run("h")])
    assert [(m.module, m.ranks) for m in mods] == [("vision", 2), ("llm stage 0", 1), ("llm stage 1", 1)]
    enc, s0, s1 = mods
    # encoder: 20 iterations, 2.1 s; busy 2 x 0.55 s, wait 0.3 + 0.4 s, optimizer 0.2 s
    assert enc.step_ms == pytest.approx(2100 / 20)
    assert enc.busy_ms == pytest.approx(1100 / 20) and enc.wait_ms == pytest.approx(700 / 20)
    assert enc.optimizer_ms == pytest.approx(200 / 20)
    assert enc.untimed_ms == pytest.approx((2.1 - 1.1 - 0.7 - 0.2) * 1000 / 20)
    assert enc.busy_share == pytest.approx(1.1 / 2.1) and enc.wait_share == pytest.approx(0.7 / 2.1)
    assert enc.rest_share == pytest.approx(0.3 / 2.1)
    assert enc.idle == pytest.approx(0.7 / 1.8)
    assert s1.busy_ms == pytest.approx(75.0) and s1.wait_ms == pytest.approx(10.0)  # pipeline waits count
    assert s0.idle == pytest.approx(0.2 / 0.85)
    pred = PredictedRow("s", "h", "h", "cpu", 1.0, 1.0, 0.0, 1.0, 1.0, 0.0, "vision", "fits",
                        idle_fraction=0.25)  # fmt: skip
    (b,) = bound_rows(mods, [_run("h")], [pred])
    # the busiest stage (75 ms) outworks the encoder (55 ms): the LLM bounds, the encoder waits
    assert (b.bound, b.bound_side) == ("llm stage 1", "llm")
    assert b.encoder_busy_ms == pytest.approx(55.0) and b.llm_busy_ms == pytest.approx(75.0)
    assert b.other_idle == b.encoder_idle == pytest.approx(0.7 / 1.8)
    assert b.llm_idle == pytest.approx((0.2 + 0.1) / (0.65 + 0.2 + 0.75 + 0.1))  # over every LLM rank
    assert (b.predicted_bottleneck, b.predicted_idle, b.agrees) == ("vision", 0.25, False)


def test_colocated_ranks_are_one_module_without_sides():
    ranks = [_rank("c", r, "colocated", COLOCATED) for r in (0, 1)]
    ranks += [{**x, "module": "vision"} for x in ranks]  # a colocated rank has a row per module
    (m,) = module_rows(ranks, [_run("c", colocated=True)])
    assert (m.module, m.ranks, m.iterations) == ("colocated", 2, 20)
    assert m.busy_share == pytest.approx(0.9) and m.wait_share == 0.0 and m.idle == 0.0
    (b,) = bound_rows([m], [_run("c", colocated=True)], [])
    assert b.bound is None and b.colocated and b.agrees is None


def test_ranks_without_timers_give_no_module_rows():
    old = {"run_id": "o", "rank": 0, "module": "llm", "pp_rank": 0, "role": None}
    assert module_rows([old], [_run("o")]) == []


def _facts(phases: dict, rank: int, role: str, modules: tuple[str, ...]) -> dict:
    mem = ModuleMemory(10, 40, 40, 80)
    return MemoryFacts(rank, {m: mem for m in modules}, 1000, 1, 12, 0, 0, 0, role=role, timed_iterations=10,
                       elapsed_s=1.0, phases_s=phases).to_json()  # fmt: skip


def _write_facts(timings: dict):
    """A `prepare` for build_report: every rank's facts file in its run dir, then ingest again."""

    def prepare(con, runs):
        for name, run in runs.items():
            root = Path(con.execute("SELECT run_dir FROM runs WHERE run_id = ?", [run.run_id]).fetchone()[0])
            if name == HET:
                files = [_facts(timings["encoder"], 0, "encoder", ("encoder",)),
                         _facts(timings["llm"], 1, "llm", ("language",))]  # fmt: skip
            else:
                files = [_facts(COLOCATED, r, "colocated", ("encoder", "language")) for r in (0, 1)]
            for f in files:
                p = facts_path(root, f["rank"])
                p.parent.mkdir(exist_ok=True)
                p.write_text(json.dumps(f))
        ingest.ingest_paths(con, [root.parent.parent])  # <runs>/<study>/<run dir>

    return prepare


@pytest.mark.parametrize(
    "timings, bound, other_idle",
    [(SLOW_LLM, "llm", 0.3 / 0.85), (SLOW_ENCODER, "vision", 0.45 / 0.85)],
)
def test_a_real_store_names_the_slow_side(tmp_path, timings, bound, other_idle):
    times = {HET: 100.0, TP2: 120.0, DP2: 110.0}
    r = build_report(tmp_path, times, prepare=_write_facts(timings), gpu="H100")
    het = [m for m in r.modules if m.name == HET]
    assert [(m.module, m.ranks) for m in het] == [("vision", 1), ("llm", 1)]
    assert {m.name for m in r.modules if m.module == "colocated"} == {TP2, DP2}
    (b,) = [x for x in r.bounds if x.name == HET]
    assert b.bound == bound and b.other_idle == pytest.approx(other_idle)
    assert b.predicted_bottleneck in ("vision", "llm") and 0.0 <= b.predicted_idle < 1.0
    assert b.agrees == (b.predicted_bottleneck == bound)
    # every format shows it
    for form in ("table", "md", "html"):
        text = render(r, form)
        assert "Module phases" in text and "Which side bounds the step" in text, form
    assert 'id="chart-modules"' in render(r, "html")
    doc = json.loads(render(r, "json"))
    (jb,) = [x for x in doc["bounds"] if x["name"] == HET]
    assert jb["bound"] == bound and len(doc["modules"]) == len(r.modules)
    rows = {x["name"]: x for x in csv.DictReader(io.StringIO(render(r, "csv")))}
    assert rows[HET]["bounds_the_step"] == bound
    assert float(rows[HET]["encoder_idle"]) == pytest.approx(b.encoder_idle)
    assert float(rows[HET]["llm_busy_share"]) == pytest.approx(het[1].busy_share)
    assert rows[HET]["predicted_bottleneck"] == b.predicted_bottleneck
    assert rows[TP2]["bounds_the_step"] == "" and float(rows[TP2]["colocated_busy_share"]) == pytest.approx(
        0.9
    )


def test_the_csv_carries_the_group_verdict(tmp_path):
    times = {HET: 100.0, TP2: 120.0, DP2: 110.0}
    r = build_report(tmp_path, times)
    rows = list(csv.DictReader(io.StringIO(render(r, "csv"))))
    (verdict,) = [p.verdict for p in r.pairs if p.best_colocated and p.best_hetero]
    assert f"heterogeneous {HET} is 1.10x faster than colocated {DP2}" in verdict
    assert {x["group_verdict"] for x in rows} == {verdict}  # every run of the group, colocated ones too
    assert {x["name"]: x["fastest_of_its_kind"] for x in rows} == {HET: "True", DP2: "True", TP2: "False"}
    assert all(x["repeat_group"] == "" for x in rows)  # no run of this study is repeated


REPEATED = {
    "name": "reps",
    "cluster": {"executor": "slurm", "accelerator": "gpu", "gpus_per_node": 2},
    "trainer": {"model": "tiny", "train_iters": 12, "seq_length": 32},
    "matrix": {
        "defaults": {"nodes": 1, "gbs": 8, "repeats": 2},
        "points": [{"encoder": {"dp": 1}, "llm": {"dp": 1}}, {"colocated": True, "llm": {"tp": 2}}],
    },
}


def test_the_csv_carries_each_runs_repeats(tmp_path):
    colo = "1n-colo-l2x1x1-g8"
    times = {f"{HET}-r0": 100.0, f"{HET}-r1": 104.0, f"{colo}-r0": 200.0, f"{colo}-r1": 190.0}
    r = build_report(tmp_path, times, REPEATED)
    rows = {x["name"]: x for x in csv.DictReader(io.StringIO(render(r, "csv")))}
    by = {x.name: x for x in r.repeats}
    for name, base in ((f"{HET}-r1", HET), (f"{colo}-r0", colo)):
        x = rows[name]
        assert x["repeat_group"] == base and x["repeat_runs"] == "2"
        assert float(x["repeat_t_mean_ms"]) == pytest.approx(by[base].t_mean_ms)
        assert float(x["repeat_t_ci95_ms"]) == pytest.approx(by[base].t_ci95_ms)
        assert float(x["repeat_t_spread_ms"]) == pytest.approx(4.0 if base == HET else 10.0)
        assert float(x["repeat_perf_mean"]) == pytest.approx(by[base].perf_mean)
        assert x["repeat_metric"] == by[base].metric
    assert float(rows[f"{HET}-r0"]["repeat_t_mean_ms"]) == pytest.approx(102.0)

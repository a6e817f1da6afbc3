"""Runs of one size compared as layouts, and heterogeneous runs against their colocated baseline: a real
store (run dirs written by the study code, metrics ingested) whose figures the tests recompute from the
records they wrote."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from helpers.ingest_runs import record, write_jsonl
from mimo_jobs.contract.rundir import RunDir
from mimo_jobs.ingest import pipeline as ingest
from mimo_jobs.report import build, render
from mimo_jobs.store import connection as store
from mimo_jobs.study.expand import runs_of
from mimo_jobs.study.load import parse_study
from mimo_jobs.study.runspec import run_yaml_doc

SEQ = 64
# run name -> (steady iteration time ms, loss offset, phases as shares of t)
PLAN = {
    "2n-e1x1-l1x1x3-g6": (100.0, 0.0, {"enc_fwd": 0.2, "llm_fwd": 0.5, "bridge_wait": 0.05}),
    "2n-e1x2-l1x1x2-g6": (150.0, 0.5, {"enc_fwd": 0.2, "llm_fwd": 0.3, "bridge_wait": 0.4}),
    "2n-colo-l2x1x2-g6": (200.0, 0.0, {"enc_fwd": 0.3, "llm_fwd": 0.6}),
    "2n-e1x1-l1x1x3-g12": (180.0, 0.0, {"enc_fwd": 0.3, "llm_fwd": 0.6}),
}


def build_store(tmp: Path):
    doc = {
        "name": "lay",
        "cluster": {"executor": "slurm", "accelerator": "gpu", "gpus_per_node": 2},
        "trainer": {"model": "tiny", "train_iters": 20, "seq_length": SEQ},
        "matrix": {
            "defaults": {"nodes": 2},
            "points": [
                {"encoder": {"dp": 1}, "llm": {"dp": 3}, "gbs": 6},
                {"encoder": {"dp": 2}, "llm": {"dp": 2}, "gbs": 6},
                {"colocated": True, "llm": {"tp": 2}, "gbs": 6},
                {"encoder": {"dp": 1}, "llm": {"dp": 3}, "gbs": 12},
            ],
        },
    }
    runs = runs_of(parse_study(doc, env={}))
    plan = PLAN
    assert sorted(r.name for r in runs) == sorted(plan)
    for run in runs:
        rd = RunDir.of(tmp / "runs", run.study, run.name, run.run_id)
        rd.logs.mkdir(parents=True)
        rd.run_yaml.write_text(yaml.safe_dump(run_yaml_doc(run, rd.root, {"version": "test"})))
        t, off, shares = plan[run.name]
        recs = []
        for i in range(1, 21):
            ms = 1000.0 if i == 1 else t
            recs.append(
                record(run, "7", 0, i, ms, 5.0 - 0.1 * i + off, {p: ms * f for p, f in shares.items()})
            )
        write_jsonl(rd.metrics, recs)
    con = store.connect(tmp / "s.duckdb")
    ingest.ingest_paths(con, [tmp / "runs"])
    return con, {r.name: r for r in runs}, plan


@pytest.fixture(scope="module")
def rep(tmp_path_factory):
    con, runs, plan = build_store(tmp_path_factory.mktemp("cmp"))
    try:
        yield build(con, "lay"), runs, plan
    finally:
        con.close()


def tokens_per_gpu(run, t_ms: float) -> float:
    return run.layout.gbs * SEQ / (t_ms / 1e3) / run.layout.world


def test_one_size_is_compared_as_layouts_not_scaled(rep):
    r, runs, plan = rep
    (info,) = r.studies
    assert info.sizes == 1
    assert all(x.efficiency is None and x.speedup is None for x in r.runs)
    perf = {n: tokens_per_gpu(runs[n], plan[n][0]) for n in plan}
    best = max(perf.values())
    for x in r.runs:
        assert x.relative_throughput == pytest.approx(perf[x.name] / best, rel=1e-9)
    top = max(r.runs, key=lambda x: x.relative_throughput)
    assert top.layout_note == "best layout of this size"
    slow = next(x for x in r.runs if x.name == "2n-e1x2-l1x1x2-g6")
    # the phase whose share exceeds the best layout's the most: bridge wait (0.4 of its phase time)
    assert "bridge wait" in slow.layout_note and top.name in slow.layout_note


def test_pairs_hold_the_ratios_the_records_imply(rep):
    r, runs, plan = rep
    pairs = {p.hetero_run: p for p in r.pairs}
    assert sorted(pairs) == ["2n-e1x1-l1x1x3-g6", "2n-e1x2-l1x1x2-g6"]  # the GBS-12 run has no baseline
    colo = "2n-colo-l2x1x2-g6"
    for name, p in pairs.items():
        assert p.colocated_run == colo
        assert p.time_ratio == pytest.approx(plan[colo][0] / plan[name][0], rel=1e-9)
        want = tokens_per_gpu(runs[name], plan[name][0]) / tokens_per_gpu(runs[colo], plan[colo][0])
        assert p.tokens_ratio == pytest.approx(want, rel=1e-9)
    fast, off = pairs["2n-e1x1-l1x1x3-g6"], pairs["2n-e1x2-l1x1x2-g6"]
    assert fast.loss_max_rel_diff == pytest.approx(0.0, abs=1e-12)
    assert "2.00x faster than colocated" in fast.verdict and "loss equal within 5%" in fast.verdict
    # loss +0.5 on 5.0 - 0.1 i: the largest relative gap is at the last point (loss 3.0 vs 3.5)
    assert off.loss_max_rel_diff > 0.05 and "loss differs by up to" in off.verdict
    assert r.unpaired == ["lay/2n-e1x1-l1x1x3-g12: no colocated run at 2 nodes, GBS 12"]


def test_every_format_carries_the_comparison(rep):
    r, _, _ = rep
    table = render(r, "table")
    assert "Heterogeneous vs colocated" in table and "Layouts of one size" in table
    assert "unpaired: lay/2n-e1x1-l1x1x3-g12" in table
    md = render(r, "md")
    assert "## Heterogeneous vs colocated" in md and "2.00x faster" in md
    doc = json.loads(render(r, "json"))
    assert {p["hetero_run"] for p in doc["pairs"]} == {"2n-e1x1-l1x1x3-g6", "2n-e1x2-l1x1x2-g6"}
    csv_text = render(r, "csv")
    header = csv_text.splitlines()[0].split(",")
    assert "pair_time_ratio" in header and "relative_throughput" in header
    html = render(r, "html")
    assert 'id="chart-pair-time"' in html and "Iteration time per layout" in html

"""build() on a real DuckDB store filled by ingest, checked against figures computed by hand."""

from __future__ import annotations

import csv
import io
import json
import math

import pytest
from typer.testing import CliRunner

from helpers.scaling_store import build_store  # noqa: E402
from mimo_jobs.cli.app import app  # noqa: E402
from mimo_jobs.model.presets import PRESETS  # noqa: E402
from mimo_jobs.predict.flops import flops_per_sample  # noqa: E402
from mimo_jobs.report import (
    ReportError,
    build,  # noqa: E402
    render,
)


@pytest.fixture(scope="module")
def store_(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("rep")
    con, runs = build_store(tmp)
    yield con, runs, tmp
    con.close()


def by_nodes(rep):
    return {r.nodes: r for r in rep.runs}


def test_per_run_figures(store_):
    con, _, _ = store_
    rep = build(con, "scal")
    r1, r2, r4 = (by_nodes(rep)[n] for n in (1, 2, 4))
    # window = iterations 3..20 (skip ceil(10% of 20) = 2): nine 400s and nine 410s
    assert (r1.window_from, r1.window_n) == (3, 18)
    assert r1.t_median_ms == 405.0 and r1.t_mean_ms == 405.0
    assert r1.t_std_ms == pytest.approx(5 * math.sqrt(18 / 17))
    assert r1.samples_per_s == pytest.approx(8 / 0.405)
    assert r1.slots_per_s == pytest.approx(8 / 0.405 * 64)
    assert r1.slots_per_s_per_gpu == pytest.approx(8 / 0.405 * 64 / 2)  # 1 node = 2 GPUs (enc + llm)
    assert r1.gpus == 2 and r2.gpus == 4 and r4.gpus == 8
    assert r1.phase_share == pytest.approx({"enc_fwd": 0.25, "llm_fwd": 0.5, "optimizer": 0.25})
    assert r1.final_loss == pytest.approx(3.0) and r1.final_samples == 160
    assert (r1.state, r1.iterations, r1.train_iters) == ("COMPLETED", 20, 20)


def test_scaling_efficiency_and_flags(store_):
    con, _, _ = store_
    rep = build(con, "scal")
    r1, r2, r4 = (by_nodes(rep)[n] for n in (1, 2, 4))
    (info,) = rep.studies
    assert (info.baseline_nodes, info.metric, info.scaling) == (
        1,
        "slots/s/GPU",
        "strong",
    )  # no counted tokens
    # E(N) = P(N)/P(1), P = slots/s/GPU: (8/0.2*64/4) / (8/0.405*64/2) = 0.81/0.8
    assert r1.efficiency == 1.0
    assert r2.efficiency == pytest.approx(0.81 / 0.8)
    assert r4.efficiency == pytest.approx(0.81 / 0.72)
    assert r2.speedup == pytest.approx(405 / 200)
    assert not any("speed-up" in f for f in r2.flags)
    assert any(f.startswith("unexpected speed-up") for f in r4.flags)
    # parity at 46, 84, 122, 160 samples: the 4-node loss is 0.5 above; largest relative gap at 160 (3.0)
    par = {p.nodes: p for p in rep.parity}
    assert par[4].samples == [46.0, 84.0, 122.0, 160.0]
    assert par[4].max_abs_diff == pytest.approx(0.5) and par[4].max_rel_diff == pytest.approx(0.5 / 3.0)
    assert par[2].max_abs_diff == pytest.approx(0.0)
    assert any("loss differs from 1 nodes by 16.7%" in f for f in r4.flags)
    # another baseline
    rep2 = build(con, "scal", baseline_nodes=2)
    assert by_nodes(rep2)[1].efficiency == pytest.approx(0.8 / 0.81)


def test_mfu_needs_a_known_gpu(store_):
    con, runs, _ = store_
    r1 = by_nodes(build(con, "scal"))[1]
    assert r1.mfu is None and "GPU peak unknown" in r1.mfu_note
    r1 = by_nodes(build(con, "scal", gpu="H100"))[1]
    # the mock mix of the planner's FLOPs: images of 4, 9, 16 patches, a quarter of samples text only
    mean, per_image = 0.75 * (4 + 9 + 16) / 3, (4**2 + 9**2 + 16**2) / (4 + 9 + 16)
    fps = flops_per_sample(PRESETS["tiny"], 64, mean, per_image).total
    assert r1.mfu == pytest.approx(fps * (8 / 0.405) / (2 * 989e12))
    assert "mock data mix" in r1.mfu_note


def test_mfu_is_priced_on_the_studys_hardware(tmp_path):
    con, _ = build_store(tmp_path)
    for run_id, doc in con.execute("SELECT run_id, spec_json FROM runs").fetchall():
        spec = json.loads(doc)
        spec["cluster"]["hardware"] = {"gpu": "H200", "peak_tflops": 500.0}
        con.execute("UPDATE runs SET spec_json = ? WHERE run_id = ?", [json.dumps(spec), run_id])
    named = by_nodes(build(con, "scal", gpu="H100"))[1]  # the GPU named, with the cluster's figures
    own = by_nodes(build(con, "scal"))[1]  # no GPU named: the study's
    con.close()
    mean, per_image = 0.75 * (4 + 9 + 16) / 3, (4**2 + 9**2 + 16**2) / (4 + 9 + 16)
    fps = flops_per_sample(PRESETS["tiny"], 64, mean, per_image).total
    assert named.mfu == pytest.approx(fps * (8 / 0.405) / (2 * 500e12))
    assert own.mfu == named.mfu


def test_unknown_study_and_baseline(store_):
    con, _, _ = store_
    with pytest.raises(ReportError, match="no study 'nope'.*known: scal"):
        build(con, "nope")
    with pytest.raises(ReportError, match="no run with data at 3 nodes; node counts with data: 1, 2, 4"):
        build(con, "scal", baseline_nodes=3)


def test_hung_run_is_triaged(tmp_path):
    con, runs = build_store(tmp_path)
    run, rd = runs[1]
    # wipe the 2-node run's tail: it stopped at iteration 10 without a word
    con.execute("DELETE FROM iterations WHERE run_id = ? AND iteration > 10", [run.run_id])
    rep = build(con, "scal")
    r2 = by_nodes(rep)[2]
    assert r2.state == "INCOMPLETE"
    (t,) = rep.triage
    assert t.run_id == run.run_id and t.kind == "silent" and "after iteration 10" in t.reason
    con.close()


def test_renderings(store_, tmp_path):
    con, _, _ = store_
    rep = build(con, "scal")
    md = render(rep, "md")
    assert "| scal | 1n-e1x1-l1x1x1-g8 | 1 | 2 | COMPLETED | 20/20 | 405.0 |" in md
    assert "ALL GPUs" in md
    rows = list(csv.DictReader(io.StringIO(render(rep, "csv"))))
    assert [int(r["nodes"]) for r in rows] == [1, 2, 4]
    assert float(rows[1]["efficiency"]) == pytest.approx(0.81 / 0.8)
    assert float(rows[0]["share_llm_fwd"]) == pytest.approx(0.5)
    doc = json.loads(render(rep, "json"))
    assert doc["runs"][2]["t_median_ms"] == 90.0 and len(doc["curves"]) == 3
    text = render(rep, "table")
    assert "unexpected speed-up" in text and "tokens/s/GPU*" in text
    p = render(rep, "html", tmp_path / "out")
    assert p == tmp_path / "out" / "report.html"
    html = p.read_text()
    assert html.count("<svg") == 4 and 'id="chart-loss"' in html and "ideal (strong)" in html


def test_cli(tmp_path):
    con, _ = build_store(tmp_path)
    con.close()  # the CLI opens the store read-only: no other connection in this process may hold it
    db = str(tmp_path / "store.duckdb")
    res = CliRunner().invoke(app, ["report", "scal", "--db", db, "--format", "csv"])
    assert res.exit_code == 0, res.output
    assert res.output.splitlines()[0].startswith("study,run_id,name,nodes")
    res = CliRunner().invoke(app, ["report", "scal", "--db", db, "--baseline-nodes", "3"])
    assert res.exit_code == 2 and "no run with data at 3 nodes" in res.output
    res = CliRunner().invoke(app, ["report", "--db", db, "--format", "pdf"])
    assert res.exit_code == 2 and "choose one of table, md, html, json, csv" in res.output
    res = CliRunner().invoke(app, ["report", "--db", str(tmp_path / "none.duckdb")])
    assert res.exit_code == 2 and "no store at" in res.output
    res = CliRunner().invoke(
        app, ["report", "scal", "--db", db, "--format", "html", "--out", str(tmp_path / "h")]
    )
    assert res.exit_code == 0 and (tmp_path / "h" / "report.html").is_file()

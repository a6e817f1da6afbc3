"""The report prices each run on the layers it ran with: the trainer's start record (its first line,
`| layers local |` or `| layers te |`, as the trainer's own layout_line and Kernels.describe write it),
ingested into a real store, else the study's cluster.hardware.layers."""

from __future__ import annotations

import pytest
import yaml

from helpers.ingest_runs import record, study_doc, write_jsonl
from mimo_jobs.contract.iteration import IterationRecord
from mimo_jobs.contract.rundir import RunDir
from mimo_jobs.ingest import pipeline as ingest
from mimo_jobs.predict.estimate import predict_run
from mimo_jobs.predict.hardware import study_gpu
from mimo_jobs.report import build, render
from mimo_jobs.report.predicted import as_ran, recorded_attention, recorded_layers
from mimo_jobs.store import connection as store
from mimo_jobs.study.expand import runs_of
from mimo_jobs.study.load import parse_study
from mimo_jobs.study.runspec import run_yaml_doc

# nodes -> the layers its trainer's first line names (None: no start record, as from an older trainer)
RAN_WITH = {1: "local", 2: "te", 4: None}


def _start(run, te: bool) -> dict:
    from mimo_jobs.trainer.model.kernels import Installed, kernels_for
    from mimo_jobs.trainer.observe.iterlog import layout_line

    line = layout_line(
        run, run.rank_layout(), "hetero", "nccl", kernels_for(True, Installed(te=te)).describe()
    )
    rec = IterationRecord(
        kind="start",
        run_id=run.run_id,
        job_id="10",
        attempt=0,
        time="2026-01-01T00:00:00Z",
        iteration=0,
        train_iters=run.trainer.train_iters,
        consumed_samples=0,
        elapsed_ms=0.0,
        lr=0.0,
        gbs=run.layout.gbs,
        loss=0.0,
        grad_norm=None,
        extras={"layout": line, "mode": "hetero", "backend": "nccl", "gpu": "NVIDIA H200"},
    )
    return rec.to_json()


@pytest.fixture(scope="module")
def store_(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("layers")
    doc = study_doc(model="dense-1b", seq_length=2048)  # compute-bound: the layers matter
    doc["cluster"]["hardware"] = {"gpu": "H200"}
    spec = parse_study(doc, env={})
    runs = []
    for run in runs_of(spec):
        rd = RunDir.of(tmp / "runs", run.study, run.name, run.run_id)
        rd.root.mkdir(parents=True)
        rd.logs.mkdir()
        rd.run_yaml.write_text(yaml.safe_dump(run_yaml_doc(run, rd.root, {"version": "test"})))
        ran = RAN_WITH[run.layout.nodes]
        recs = [_start(run, ran == "te")] if ran else []
        recs += [record(run, "10", 0, i, 300.0, 5.0 - 0.1 * i) for i in range(1, 11)]
        write_jsonl(rd.metrics, recs)
        runs.append(run)
    con = store.connect(tmp / "store.duckdb")
    ingest.ingest_paths(con, [tmp / "runs"])
    yield con, spec, runs
    con.close()


def test_each_run_is_priced_on_the_layers_its_log_names(store_):
    con, spec, runs = store_
    rep = build(con, "scal")
    got = {p.run_id: p for p in rep.predicted}
    assert len(got) == 3
    for run in runs:
        ran = RAN_WITH[run.layout.nodes] or "te"  # no record: the study's hardware.layers (te by default)
        row = got[run.run_id]
        want = predict_run(run, study_gpu(spec.cluster, layers=ran))
        assert row.layers == ran and row.gpu == "H200"
        assert row.predicted_s == want.time.iteration_s
    local = next(r for r in runs if r.layout.nodes == 1)
    te_price = predict_run(local, study_gpu(spec.cluster)).time.iteration_s
    assert got[local.run_id].predicted_s > 2 * te_price  # not the Transformer Engine price
    text = render(rep, "table")
    assert "H200 (local layers)" in text and "scal on H200 (local layers): uncalibrated" in text


def test_the_layers_are_read_from_a_start_record_cut_short():
    msg = '{"extras": {"layout": "mimo-jobs trainer: run r | backend nccl | layers local | fused none | world'
    assert recorded_layers([msg]) == "local"
    assert recorded_layers(['{"extras": {"layout": "| layers bogus | fused none"}}']) is None
    assert recorded_layers([]) is None


def test_the_local_attention_is_read_from_the_first_line_and_priced_as_it_ran(store_):
    from mimo_jobs.predict.hardware import with_layers
    from mimo_jobs.trainer.model.kernels import Installed, kernels_for

    def line(kernels) -> str:
        return (
            f'{{"extras": {{"layout": "mimo-jobs trainer: run r | backend nccl | {kernels.describe()} | world'
        )

    assert recorded_attention([line(kernels_for(True, Installed()))]) == "sdpa"
    assert recorded_attention([line(kernels_for(True, Installed(), "unfused"))]) == "unfused"
    # a trainer older than trainer.attention wrote no attention field: its local layers ran unfused
    old = '{"extras": {"layout": "mimo-jobs trainer: run r | backend nccl | layers local | fused none | world'
    assert recorded_attention([old]) == "unfused"
    assert recorded_attention([line(kernels_for(True, Installed(te=True)))]) is None  # TE runs its own
    assert recorded_attention([]) is None
    _, spec, runs = store_
    local = next(r for r in runs if r.layout.nodes == 1)
    assert as_ran(local, None) is local and as_ran(local, "sdpa") is local
    gpu = with_layers(study_gpu(spec.cluster), "local")

    def held(run) -> int:
        return max(sum(m.activation_bytes for m in c.modules) for c in predict_run(run, gpu).memory.classes)

    # the unfused core keeps every score matrix: dense-1b at seq 2048 holds several times the activations
    assert held(as_ran(local, "unfused")) > 2 * held(local)
    assert as_ran(local, "unfused").trainer.attention == "unfused" and local.trainer.attention == "sdpa"

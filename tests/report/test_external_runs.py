"""Runs of other programs in the report: a Megatron-LM log ingested with `--layout --model` shows mimo-jobs'
MFU beside the log's own TFLOP/s/GPU (and the MFU that figure implies) in every format, with its MoE loss and
other logged numbers; `--model` takes what trainer.model takes; a run of its own command without a model is
never priced (no prediction, no MFU, and the report says why) and is compared with the packaged trainer's run
of the same layout; the predicted-vs-measured section prints errors only once calibrated."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import statistics
from dataclasses import replace

import pytest
import yaml

from helpers import TESTS
from helpers.ingest_runs import record, study_doc, write_jsonl
from helpers.scaling_store import build_store
from helpers.submit import cli
from mimo_jobs.contract.rundir import RunDir
from mimo_jobs.ingest import pipeline as ingest
from mimo_jobs.ingest.discover import IngestError
from mimo_jobs.ingest.told import resolve_model
from mimo_jobs.model.presets import get_preset
from mimo_jobs.model.resolve import arch_of
from mimo_jobs.predict.hardware import get_gpu
from mimo_jobs.predict.run import sample_flops
from mimo_jobs.report import build, render, sections
from mimo_jobs.store.connection import connect
from mimo_jobs.study.expand import runs_of
from mimo_jobs.study.load import parse_study
from mimo_jobs.study.priced import NO_MODEL, unpriced
from mimo_jobs.study.runspec import RunSpec, run_yaml_doc

LOG = TESTS / "ingest" / "fixtures" / "megatron_upstream.log"
# The fixture's steady-state window (iterations 70-73, after the first 10% of its span): their times, the
# TFLOP/s/GPU printed on three of them and the load-balancing loss of all four, as the log prints them.
WINDOW_MS = [5372.3, 5361.6, 5358.9, 5366.0]
WINDOW_TFLOPS = [243.1, 243.6, 243.3]
WINDOW_AUX = [1.013519, 1.013377, 1.012991, 1.012755]
GBS, SEQ, GPUS = 128, 2048, 16  # the run's 2048 tokens: tests/report/test_text_only_log.py


def _mfu_by_hand(arch) -> float:
    """FLOPs of one sample (one full-size image: a log says nothing of its images) x samples/s / peak."""
    samples_per_s = GBS / (statistics.median(WINDOW_MS) / 1000)
    return sample_flops(arch, SEQ, None).total * samples_per_s / (GPUS * get_gpu("H100").peak_flops)


def _ingest_upstream(db, model: str):
    cli("ingest", LOG, "--db", db, "--study", "upstream", "--name", "gpt", "--seq-length", str(SEQ),
        "--layout", "llm tp2 dp8", "--model", model, check=True)  # fmt: skip
    con = connect(db, read_only=True)
    try:
        return build(con, "upstream", gpu="H100")
    finally:
        con.close()


@pytest.fixture(scope="module")
def upstream(tmp_path_factory):
    return _ingest_upstream(tmp_path_factory.mktemp("up") / "s.duckdb", "moe-8x1b")


def test_log_figures_beside_mfu_in_every_format(upstream):
    rep = upstream
    (r,) = rep.runs
    peak = get_gpu("H100").peak_flops
    assert r.program == "log"
    assert r.mfu == pytest.approx(_mfu_by_hand(get_preset("moe-8x1b")))
    assert r.log_tflops_per_gpu == pytest.approx(statistics.median(WINDOW_TFLOPS))
    assert r.log_mfu == pytest.approx(statistics.median(WINDOW_TFLOPS) * 1e12 / peak)
    assert r.moe_aux_loss == pytest.approx(statistics.mean(WINDOW_AUX))
    assert r.log_extras == pytest.approx({"mtp_1 loss": 2.101, "num zeros": 0.0, "params norm": 1270.114})
    # the table: one row holding both MFUs and the log's figure, side by side
    line = next(x for x in render(rep, "table").splitlines() if "gpt" in x and "243.3" in x)
    assert re.search(rf"{r.mfu:.1%}.*243\.3.*{r.log_mfu:.1%}.*1\.013.*params norm 1270", line), line
    assert "TFLOP/s/GPU (log)" in render(rep, "md") and "TFLOP/s/GPU (log)" in render(rep, "html")
    (row,) = csv.DictReader(io.StringIO(render(rep, "csv")))
    assert float(row["mfu"]) == pytest.approx(r.mfu) and float(row["log_mfu"]) == pytest.approx(r.log_mfu)
    assert (
        float(row["log_tflops_per_gpu"]) == pytest.approx(243.3)
        and "params norm=1270.114" in row["log_extras"]
    )
    (doc,) = json.loads(render(rep, "json"))["runs"]
    assert doc["log_tflops_per_gpu"] == pytest.approx(243.3) and doc["mfu"] == pytest.approx(r.mfu)


def test_model_takes_what_trainer_model_takes(tmp_path):
    assert resolve_model("moe-8x1b") == "moe-8x1b"
    inline = resolve_model("{encoder: tiny, llm: {preset: tiny, num_layers: 3}}")
    assert arch_of(inline).llm == replace(get_preset("tiny").llm, num_layers=3, name=arch_of(inline).llm.name)
    (tmp_path / "m.yaml").write_text(
        yaml.safe_dump({"encoder": "tiny", "llm": {"preset": "tiny", "num_layers": 3}})
    )
    assert resolve_model(str(tmp_path / "m.yaml")) == inline  # a file holding the same description
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text('{"architectures": ["Qwen3ForCausalLM"]}')
    for text, why in (
        # a config.json alone is a text-only model's LLM: read as one, its missing fields named
        (str(tmp_path / "hf"), "config.json: num_attention_heads: missing from the HuggingFace config"),
        ("nope", "unknown model preset 'nope'"),
        ("{encoder: tiny}", "llm: missing"),
        (str(tmp_path), "a directory holding a config.json"),
    ):
        with pytest.raises(IngestError, match=re.escape(why)):
            resolve_model(text)


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    """A small Qwen3 config.json written by transformers itself."""
    import transformers

    d = tmp_path_factory.mktemp("hf") / "qwen3-small"
    transformers.Qwen3Config(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, vocab_size=256, max_position_embeddings=4096,
    ).save_pretrained(d)  # fmt: skip
    return d


@pytest.mark.slow  # transformers' import alone takes seconds
def test_a_hf_config_resolves_and_prices_the_log(qwen, tmp_path, monkeypatch):
    cfg = json.loads((qwen / "config.json").read_text())
    model = f"{{encoder: tiny, llm: {{hf_config: {qwen / 'config.json'}}}}}"
    a = arch_of(resolve_model(model))  # self-contained: no path left to read
    assert (a.llm.num_layers, a.llm.hidden_size, a.llm.vocab_size) == (2, 64, 256)
    assert (a.llm.num_attention_heads, a.llm.num_query_groups, a.llm.ffn_hidden_size) == (4, 2, 128)
    assert a.llm.num_layers == cfg["num_hidden_layers"] and a.encoder == get_preset("tiny").encoder
    # a file holding a description, its hf_config relative to the file, read from another directory
    (tmp_path / "m.yaml").write_text(
        yaml.safe_dump(
            {"encoder": "tiny", "llm": {"hf_config": os.path.relpath(qwen / "config.json", tmp_path)}}
        )
    )
    monkeypatch.chdir(qwen)
    assert replace(arch_of(resolve_model(str(tmp_path / "m.yaml"))).llm, source="") == replace(
        a.llm, source=""
    )
    rep = _ingest_upstream(tmp_path / "s.duckdb", model)
    (r,) = rep.runs
    assert r.model == a.name and r.mfu == pytest.approx(_mfu_by_hand(a))


# -- a study holding a packaged-trainer point and a point of its own command, no model written

CMD = "python train.py --tp {{ llm.tp }} --gbs {{ gbs }}"


def _study(model: str | None) -> dict:
    doc = study_doc(name="mixed", nodes=(1,), gbs=8, train_iters=20)
    point = doc["matrix"]["points"][0]
    doc["matrix"]["points"] = [point, {**point, "command": CMD}]
    if model is None:
        del doc["trainer"]["model"]
    else:
        doc["trainer"]["model"] = model
    return doc


def test_a_command_is_priced_only_with_a_given_model():
    packaged, own = runs_of(parse_study(_study(None), env={}))
    assert unpriced(packaged) is None and unpriced(own) == NO_MODEL  # never priced as the default preset
    assert unpriced(RunSpec.from_dict(own.to_dict())) == NO_MODEL  # as run.yaml and the store keep it
    assert own.catalog_fields()["model"] is None and packaged.catalog_fields()["model"] == "tiny"
    given = runs_of(parse_study(_study("tiny"), env={}))[1]
    assert unpriced(given) is None and unpriced(RunSpec.from_dict(given.to_dict())) is None


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mixed")
    times = {}
    for run in runs_of(parse_study(_study(None), env={})):
        rd = RunDir.of(tmp / "runs", run.study, run.name, run.run_id)
        rd.logs.mkdir(parents=True)
        rd.run_yaml.write_text(yaml.safe_dump(run_yaml_doc(run, rd.root, {"version": "test"})))
        t = 250.0 if run.point.command else 200.0  # the own program is slower, same loss
        times[run.name] = t
        write_jsonl(rd.metrics, [record(run, "1", 0, i, t, 5.0 - 0.1 * i) for i in range(1, 21)])
    con = connect(tmp / "s.duckdb")
    ingest.ingest_paths(con, [tmp / "runs"])
    yield con, times
    con.close()


def test_command_without_model_has_no_prediction_and_says_why(mixed):
    con, _ = mixed
    rep = build(con, "mixed", gpu="H100")
    own = next(r for r in rep.runs if r.program == "own command")
    packaged = next(r for r in rep.runs if r.program == "packaged trainer")
    assert [p.name for p in rep.predicted] == [packaged.name]
    assert f"mixed/{own.name}: not priced: {NO_MODEL}" in rep.predicted_notes
    assert own.mfu is None and NO_MODEL in own.mfu_note and packaged.mfu is not None
    assert con.execute("SELECT model FROM runs WHERE name = ?", [own.name]).fetchone() == (None,)
    text = render(rep, "table")
    assert f"not priced: {NO_MODEL}" in text


def test_own_command_against_the_packaged_trainer_at_equal_layout(mixed):
    con, times = mixed
    rep = build(con, "mixed", gpu="H100")
    (p,) = rep.program_pairs
    own = next(r for r in rep.runs if r.program == "own command")
    assert p.command_run == own.name and p.packaged_run != own.name and p.nodes == 1 and p.gbs == 8
    assert p.time_ratio == pytest.approx(times[p.command_run] / times[p.packaged_run])
    assert p.throughput_ratio == pytest.approx(times[p.packaged_run] / times[p.command_run])
    assert p.loss_max_rel_diff == pytest.approx(0.0)
    assert p.verdict.startswith("the packaged trainer is 1.25x faster")
    assert "Own command vs packaged trainer" in render(rep, "table")
    assert json.loads(render(rep, "json"))["program_pairs"][0]["time_ratio"] == pytest.approx(1.25)


# -- the predicted-vs-measured section: calibrated with enough measured runs, else no percentages


def test_predicted_section_calibrated_with_enough_runs(tmp_path):
    from mimo_jobs.predict.measured import Measured, calibrate
    from mimo_jobs.predict.run import shape_of
    from mimo_jobs.report.predicted import CALIBRATION_RUNS

    con, runs = build_store(tmp_path)
    try:
        rep = build(con, "scal", gpu="H100")
        assert len(rep.predicted) == CALIBRATION_RUNS and all(p.calibrated for p in rep.predicted)
        by_id = {r.run_id: r for r, _ in runs}
        cal = calibrate(
            [Measured(p.name, p.run_id, shape_of(by_id[p.run_id].layout, by_id[p.run_id].trainer), p.measured_s)
             for p in rep.predicted],
            get_gpu("H100"),
        )  # fmt: skip
        for p, c in zip(rep.predicted, cal.runs):
            assert p.calibrated_s == pytest.approx(c.calibrated_s) and p.holdout_s == pytest.approx(
                c.holdout_s
            )
            assert p.holdout_error == pytest.approx((c.holdout_s - p.measured_s) / p.measured_s)
        sec = sections.predicted(rep)
        assert "held-out error" in sec.headers
        assert sec.lines[0].startswith("scal on H100: calibrated on 3 measured runs")
        assert f"{cal.error_after:.1%} calibrated" in sec.lines[0]

        con.execute("DELETE FROM runs WHERE nodes = 4")  # two measured runs: not enough
        rep = build(con, "scal", gpu="H100")
        sec = sections.predicted(rep)
        assert not any(p.calibrated for p in rep.predicted) and "error" not in " ".join(sec.headers)
        assert not any("%" in cell for row in sec.rows for cell in row)
        assert sec.lines[0].startswith("scal on H100: uncalibrated") and "2 measured run(s)" in sec.lines[0]
        assert "%" not in render(rep, "md").split("## Predicted vs measured time")[1].split("##")[0]
    finally:
        con.close()

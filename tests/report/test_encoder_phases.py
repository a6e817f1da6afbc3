"""Each encoder module's phases in a report of several encoders (report/encphases.py): a real store of a
two-encoder study (a vision tower and a Whisper-class audio encoder) whose metrics.jsonl records, in the
trainer's iteration record format, time `vision_fwd`, `audio_fwd`, ... per module; ingest, then the report
names the module that bounds the step beside the planner's bottleneck. A record of one encoder (`enc_fwd`)
still means the module `vision`."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from helpers.ingest_runs import record, write_jsonl
from mimo_jobs.contract.rundir import RunDir
from mimo_jobs.ingest import pipeline as ingest
from mimo_jobs.report import build, render
from mimo_jobs.report.encphases import phase_module
from mimo_jobs.store import connection as store
from mimo_jobs.study.expand import runs_of
from mimo_jobs.study.load import parse_study
from mimo_jobs.study.runspec import run_yaml_doc

# openai/whisper-small's published config.json (its encoder's fields)
WHISPER_SMALL = {
    "model_type": "whisper",
    "architectures": ["WhisperForConditionalGeneration"],
    "d_model": 768,
    "encoder_layers": 12,
    "encoder_attention_heads": 12,
    "encoder_ffn_dim": 3072,
    "num_mel_bins": 80,
    "max_source_positions": 1500,
    "activation_function": "gelu",
}


def two_encoder_doc(tmp: Path) -> dict:
    cfg = tmp / "models" / "whisper-small" / "config.json"
    cfg.parent.mkdir(parents=True)
    cfg.write_text(json.dumps(WHISPER_SMALL))
    return {
        "name": "av",
        "cluster": {"executor": "slurm", "accelerator": "gpu", "gpus_per_node": 8},
        "trainer": {
            "model": {
                "encoders": {"vision": {"preset": "tiny"}, "audio": {"hf_config": str(cfg)}},
                "llm": {"preset": "tiny"},
            },
            "train_iters": 12,
            "seq_length": 32,
        },
        "matrix": {
            "points": [
                {
                    "nodes": 2,
                    "encoders": {"vision": {"dp": 4}, "audio": {"dp": 4}},
                    "llm": {"dp": 8},
                    "gbs": 32,
                },
                {"nodes": 2, "colocated": True, "llm": {"dp": 16}, "gbs": 32},
            ]
        },
    }


# ms per iteration of each module's forward and backward: the audio encoder is the slowest module
PHASES = {
    "vision_fwd": 2.0,
    "vision_bwd": 4.0,
    "audio_fwd": 30.0,
    "audio_bwd": 60.0,
    "llm_fwd": 5.0,
    "llm_bwd": 10.0,
    "bridge_wait": 70.0,
    "optimizer": 3.0,
}


def _report(tmp: Path):
    doc = two_encoder_doc(tmp)
    runs = runs_of(parse_study(doc, env={}))
    for run in runs:
        rd = RunDir.of(tmp / "runs", run.study, run.name, run.run_id)
        rd.logs.mkdir(parents=True)
        rd.run_yaml.write_text(yaml.safe_dump(run_yaml_doc(run, rd.root, {"version": "test"})))
        recs = [record(run, "7", 0, i, 120.0, 5.0 - 0.1 * i, PHASES) for i in range(1, 13)]
        write_jsonl(rd.metrics, recs)
    con = store.connect(tmp / "s.duckdb")
    try:
        ingest.ingest_paths(con, [tmp / "runs"])
        return build(con, "av", gpu="h100"), runs
    finally:
        con.close()


def test_the_module_that_bounds_the_step_measured_and_predicted(tmp_path):
    rep, runs = _report(tmp_path)
    rows = rep.encoder_phases
    assert {r.name for r in rows} == {r.name for r in runs}
    for name in {r.name for r in rows}:
        mine = [r for r in rows if r.name == name]
        assert [r.module for r in mine] == ["vision", "audio", "llm"]  # rank order, then the LLM
        audio = mine[1]
        assert (audio.fwd_ms, audio.bwd_ms, audio.busy_ms) == (30.0, 60.0, 90.0)
        assert [r.module for r in mine if r.bounds] == ["audio"]
        # the planner prices the same study: whisper-small's full clips against a tiny vision tower and LLM
        assert audio.predicted_bottleneck == "audio"
    text = render(rep, "md")
    assert "Encoder modules' phases (several encoders)" in text
    data = json.loads(render(rep, "json"))
    assert {e["module"] for e in data["encoder_phases"]} == {"vision", "audio", "llm"}


def test_a_one_encoder_record_means_the_module_vision():
    assert phase_module("enc_fwd", ["vision"]) == ("vision", "fwd")
    assert phase_module("enc_bwd", []) == ("vision", "bwd")
    assert phase_module("enc_fwd", ["audio"]) == ("audio", "fwd")  # the run's one module, whatever its name
    assert phase_module("audio_bwd", ["vision", "audio"]) == ("audio", "bwd")
    assert phase_module("llm_fwd", ["vision", "audio"]) == ("llm", "fwd")
    assert phase_module("bridge_wait", ["vision", "audio"]) is None
    assert phase_module("speech_fwd", ["vision", "audio"]) is None  # not a module of this run

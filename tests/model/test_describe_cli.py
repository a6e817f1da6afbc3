"""The three ways to describe a model, through `validate` and `predict` as a user runs them: a HF
config.json written next to the study (with overrides), inline fields, packaged presets; and each bad
description refused with one line naming its field and exit code 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from mimo_jobs.cli.app import app
from mimo_jobs.model.resolve import arch_of
from mimo_jobs.study.load import load_study
from mimo_jobs.study.runspec import load_run_yaml

runner = CliRunner()

QWEN3_MOE = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "hidden_size": 32,
    "intermediate_size": 64,
    "moe_intermediate_size": 16,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "norm_topk_prob": True,
    "vocab_size": 128,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "use_sliding_window": False,
    "sliding_window": None,
}
SIGLIP = {
    "architectures": ["SiglipVisionModel"],
    "model_type": "siglip_vision_model",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "image_size": 16,
    "patch_size": 4,
    "hidden_act": "gelu_pytorch_tanh",
    "layer_norm_eps": 1e-6,
}


def _study(tmp_path: Path, model, points=None) -> Path:
    (tmp_path / "models").mkdir(exist_ok=True)
    (tmp_path / "models" / "llm.json").write_text(json.dumps(QWEN3_MOE))
    (tmp_path / "models" / "vit.json").write_text(json.dumps(SIGLIP))
    doc = {
        "name": "own",
        "cluster": {"gpus_per_node": 4, "accelerator": "cpu", "executor": "local"},
        "trainer": {"model": model, "train_iters": 5, "seq_length": 32, "data": {"image_sizes": [16]}},
        "matrix": {"points": points or [{"nodes": 1, "encoder": {"dp": 1}, "llm": {"dp": 3}, "gbs": 6}]},
    }
    f = tmp_path / "study.yaml"
    f.write_text(yaml.safe_dump(doc))
    return f


HF_MODEL = {
    "encoder": {"hf_config": "models/vit.json", "downsample": 2},
    "llm": {"hf_config": "models/llm.json", "num_layers": 2},
}


def test_hf_configs_resolve_relative_to_the_study_and_run_yaml_is_self_contained(tmp_path, monkeypatch):
    f = _study(tmp_path, HF_MODEL)
    monkeypatch.chdir("/")  # paths are the study file's, not the working directory's
    r = runner.invoke(app, ["validate", str(f)], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert "llm llm[num_layers=2]:" in r.output
    s = load_study(f, env={})
    assert s.trainer.model["llm"]["num_layers"] == 2 and "hf_config" not in json.dumps(s.trainer.model)
    arch = arch_of(s.trainer.model)
    assert arch.llm.qk_layernorm and arch.llm.gated_linear_unit and arch.encoder.tokens_per_image == 4
    out = tmp_path / "out"
    r = runner.invoke(app, ["render", str(f), "-o", str(out)])
    assert r.exit_code == 0, r.output
    (ry,) = list(out.rglob("run.yaml"))
    (tmp_path / "models" / "llm.json").unlink()  # the run never reads the config again
    run, _ = load_run_yaml(ry)
    assert arch_of(run.trainer.model) == arch


def test_the_architecture_enters_the_run_id(tmp_path):
    ids = []
    for layers in (2, 4):
        f = _study(tmp_path, HF_MODEL | {"llm": {"hf_config": "models/llm.json", "num_layers": layers}})
        r = runner.invoke(app, ["validate", str(f), "--json"])
        assert r.exit_code == 0, r.output
        ids.append(json.loads(r.output)["runs"][0]["run_id"])
    assert ids[0] != ids[1]


def test_predict_json_names_the_model(tmp_path):
    f = _study(tmp_path, {"encoder": "tiny", "llm": {"preset": "tiny-moe", "num_layers": 4}})
    r = runner.invoke(app, ["predict", str(f), "--json"])
    assert r.exit_code == 0, r.output
    m = json.loads(r.output)["model"]
    assert m["llm"]["name"] == "tiny-moe[num_layers=4]"
    assert m["llm"]["params"] > m["llm"]["active_params"] > 0 and m["encoder"]["params"] > 0


@pytest.mark.parametrize(
    "model, points, field",
    [
        ({"encoder": "tiny", "llm": {"hf_config": "models/none.json"}}, None, "llm.hf_config: no such file"),
        (
            {"encoder": "tiny", "llm": {"num_layers": 2, "hidden_size": 32}},
            None,
            "llm.num_attention_heads: missing",
        ),
        ({"encoder": "tiny", "llm": "gpt-17"}, None, "llm: unknown LLM preset 'gpt-17'"),
        (
            {"encoder": "tiny", "llm": {"preset": "tiny", "activation": "relu"}},
            None,
            "llm.activation: 'relu'",
        ),
        ({"encoder": {"hf_config": "models/vit.json", "downsample": 3}}, None, "encoder.downsample: 3"),
        ({"encoder": "tiny", "llm": "tiny", "vision": 1}, None, "vision: unknown key"),
        (
            "tiny-swiglu",
            [{"nodes": 1, "encoder": {"dp": 1}, "llm": {"tp": 3, "dp": 1}, "gbs": 1}],
            "llm.tp=3 does not divide llm.num_attention_heads=4",
        ),
        (
            "tiny-moe",
            [{"nodes": 1, "encoder": {"dp": 1}, "llm": {"ep": 3, "dp": 3}, "gbs": 3}],
            "num_experts=4 is not divisible by llm.ep=3",
        ),
    ],
)
def test_bad_descriptions_fail_with_their_field_and_exit_2(tmp_path, model, points, field):
    if isinstance(model, dict) and "llm" not in model:
        model = model | {"llm": "tiny"}
    f = _study(tmp_path, model, points)
    r = runner.invoke(app, ["validate", str(f)], env={"COLUMNS": "300"})
    assert r.exit_code == 2, r.output
    assert field in r.output, r.output


def test_a_refused_feature_names_the_config_field(tmp_path):
    f = _study(tmp_path, HF_MODEL)
    (tmp_path / "models" / "llm.json").write_text(
        json.dumps(QWEN3_MOE | {"use_sliding_window": True, "sliding_window": 16})
    )
    r = runner.invoke(app, ["validate", str(f)], env={"COLUMNS": "300"})
    assert r.exit_code == 2
    assert (
        "llm.hf_config" in r.output
        and "sliding_window" in r.output
        and "sliding-window attention" in r.output
    )
    (tmp_path / "models" / "llm.json").write_text(json.dumps({"architectures": ["DeepseekV3ForCausalLM"]}))
    r = runner.invoke(app, ["validate", str(f)], env={"COLUMNS": "300"})
    assert r.exit_code == 2 and "multi-head latent attention" in r.output


@pytest.mark.parametrize(
    "change, words",
    [
        (
            {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}},
            ["rope_scaling", "RoPE scaling of type 'yarn'"],
        ),
        (
            {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "attention_bias": True},
            ["attention_bias"],
        ),
        ({"num_experts_per_tok": 1}, ["top-1 softmax routing", "norm_topk_prob false"]),
    ],
)
def test_what_the_trainer_would_refuse_validate_refuses(tmp_path, change, words):
    """A config the trainer cannot build fails validate with its field and exit 2; the same study passes
    once the field is set to what the trainer builds."""
    f = _study(tmp_path, HF_MODEL)
    llm = tmp_path / "models" / "llm.json"
    llm.write_text(json.dumps(QWEN3_MOE | change))
    r = runner.invoke(app, ["validate", str(f)], env={"COLUMNS": "300"})
    assert r.exit_code == 2, r.output
    assert all(w in r.output for w in words), r.output
    fixed = {"rope_scaling": None, "attention_bias": False, "norm_topk_prob": False}
    llm.write_text(
        json.dumps(
            QWEN3_MOE | change | {k: v for k, v in fixed.items() if k in change or k == "norm_topk_prob"}
        )
    )
    r = runner.invoke(app, ["validate", str(f)], env={"COLUMNS": "300"})
    assert r.exit_code == 0, r.output


def test_the_store_names_a_described_model(tmp_path):
    """A run of a model described by HF configs is recorded with its description as JSON, so the report's
    model column shows the description's name (not a dump of its fields)."""
    import duckdb

    from mimo_jobs.report.predicted import model_name
    from mimo_jobs.study.expand import runs_of

    (run,) = runs_of(load_study(_study(tmp_path, HF_MODEL), env={}))
    rec = run.catalog_fields()
    assert json.loads(rec["model"]) == run.trainer.model
    db = duckdb.connect(str(tmp_path / "s.duckdb"))
    db.execute("CREATE TABLE runs (model VARCHAR)")
    db.execute("INSERT INTO runs VALUES (?)", [rec["model"]])
    (text,) = db.execute("SELECT model FROM runs").fetchone()
    assert model_name(text) == run.trainer.model["name"] and "{" not in model_name(text)

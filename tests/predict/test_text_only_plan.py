"""A text-only model (a GPT alone) through `plan`, `validate` and `predict`: the example study that runs
Megatron-LM's pretrain_gpt.py describes the GPT its command trains, plan labels its layouts as the LLM on
every GPU (no encoder to share them with), and its parameters match a hand count of that GPT."""

from __future__ import annotations

import json
import shlex
from dataclasses import replace

from typer.testing import CliRunner

from helpers import REPO
from mimo_jobs.cli.app import app
from mimo_jobs.model.resolve import arch_of
from mimo_jobs.predict.layouts import split_label
from mimo_jobs.study.expand import runs_of
from mimo_jobs.study.load import load_study

GPT = REPO / "studies/megatron_gpt_mock.yaml"
runner = CliRunner()

# Megatron-LM's argument -> the model description's field (megatron/training/arguments.py)
ARGS = {
    "--num-layers": "num_layers",
    "--hidden-size": "hidden_size",
    "--num-attention-heads": "num_attention_heads",
    "--ffn-hidden-size": "ffn_hidden_size",
    "--vocab-size": "vocab_size",
}


def _invoke(*args: str) -> str:
    r = runner.invoke(app, list(args))
    assert r.exit_code == 0, r.output
    return r.output


def test_plan_labels_a_text_only_layout_as_the_llm_alone():
    doc = json.loads(_invoke("plan", "--from", str(GPT), "--nodes", "2,4", "--json"))
    for p in doc["plans"]:
        want = f"LLM on all {p['nodes']} nodes (text-only)"
        assert p["layouts"] and all(c["colocated"] and c["split"] == want for c in p["layouts"])
        assert p["best_heterogeneous"] is None and p["best"]["split"] == want
    assert [s["best_split"] for s in doc["summary"]] == [f"LLM on all {n} nodes (text-only)" for n in (2, 4)]
    text = _invoke("plan", "--from", str(GPT), "--nodes", "2")
    assert "# LLM on all 2 nodes (text-only); " in text and "encoder" not in text.replace("encoder: none", "")
    assert "no split (text-only)" in text and "no split fits" not in text


def test_a_model_with_an_encoder_keeps_the_colocated_label():
    (run, *_) = runs_of(load_study(GPT, env={}))
    one = replace(run.layout, nodes=1)
    assert split_label(run.layout) == "colocated: vision and LLM on all 2 nodes"
    assert split_label(one, text_only=True) == "LLM on all 1 node (text-only)"
    plan = _invoke("plan", "--from", str(REPO / "studies/cpu_local.yaml"), "--nodes", "1", "--json")
    colo = [c for p in json.loads(plan)["plans"] for c in p["layouts"] if c["colocated"]]
    assert colo and {c["split"] for c in colo} == {"colocated: vision and LLM on all 1 node"}


def test_the_megatron_example_describes_the_gpt_its_command_trains():
    runs = runs_of(load_study(GPT, env={}))
    for run in runs:
        model = arch_of(run.trainer.model)
        assert model.text_only and run.layout.colocated
        words = shlex.split(run.trainer.command)
        given = {ARGS[w]: int(words[i + 1]) for i, w in enumerate(words) if w in ARGS}
        assert given == {f: getattr(model.llm, f) for f in ARGS.values()}
        # what the description assumes where Megatron-LM's defaults would differ, the command asks for
        assert ("--position-embedding-type", "rope") in zip(words, words[1:])
        assert "--untie-embeddings-and-output-weights" in words and not model.llm.tie_word_embeddings
        assert "--swiglu" not in words and model.llm.activation == "gelu"
    # a hand count of Megatron-LM's GPT (RoPE, untied, biases, LayerNorm): per layer QKV, projection, MLP
    # and two norms; the input embedding, the output layer and the final norm
    L, h, f, v = 12, 768, 3072, 32000
    layer = (h * 3 * h + 3 * h) + (h * h + h) + (h * f + f) + (f * h + h) + 2 * 2 * h
    params = L * layer + 2 * v * h + 2 * h
    doc = json.loads(_invoke("predict", str(GPT), "--json"))
    assert doc["model"]["encoder"] is None and doc["model"]["llm"]["params"] == params == 134_208_000
    for r in doc["runs"]:
        assert r["fits"] and r["flops_per_iteration"]["encoder"] == 0 and r["mfu"] > 0
        assert [c["module"] for c in r["ranks"]] == ["llm"]
    out = _invoke("validate", str(GPT))
    assert "no model given" not in out and out.count("memory on H100: fits") == len(runs)
    assert "encoder: none (text-only)" in out


def test_validate_shows_no_encoder_for_a_text_only_model():
    """The Megatron GPT example study's model has no encoder: validate's table says so instead of listing
    encoder ranks that do not exist."""
    from typer.testing import CliRunner

    from helpers import REPO
    from mimo_jobs.cli.app import app

    r = CliRunner().invoke(
        app, ["validate", str(REPO / "studies/megatron_gpt_mock.yaml")], env={"COLUMNS": "300"}
    )
    assert r.exit_code == 0, r.output
    rows = [x for x in r.output.splitlines() if "-colo-" in x]
    assert rows and all("none (text-only model)" in x for x in rows), r.output

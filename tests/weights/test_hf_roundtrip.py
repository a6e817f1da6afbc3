"""HF -> a `train_iters: 0` conversion at a TP2, EP2 or PP2 layout -> `mimo-jobs export` -> HF again: every
tensor bit-identical, the config describing the same model, and transformers loads the directories."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("transformers")

import hf_models  # noqa: E402

from mimo_jobs.model import hf  # noqa: E402

CASES = {
    # family, vision kind, layout, processes
    "tp2-colocated": ("llama", "clip", dict(gpn=2, llm={"tp": 2}, colocated=True), 2),
    "ep2-colocated": ("qwen2_moe", "siglip", dict(gpn=2, llm={"ep": 2}, colocated=True), 2),
    "pp2-hetero": ("qwen3", "clip", dict(gpn=3, llm={"pp": 2}), 3),
    # InternViT at encoder TP2: its [1, n, h] tables, class token and layer scales
    "tp2-internvit": ("qwen3", "internvit", dict(gpn=2, llm={"tp": 2}, colocated=True), 2),
}


def _tensors(d):
    from safetensors.torch import load_file

    out = {}
    for f in sorted(d.glob("*.safetensors")):
        out.update(load_file(f))
    return out


def _train_and_export(tmp_path, family, kind, layout, nproc, iters=0, extra=None):
    """(HF LLM dir, HF vision dir, export dir) of a run that starts from both and trains `iters`."""
    from helpers.launch import worker_env
    from helpers.trainer import assert_ok, make_run_yaml, run_torchrun

    llm = hf_models.save_llm(family, tmp_path / "hf-llm")
    enc = hf_models.save_encoder(kind, tmp_path / "hf-enc")
    trainer = {
        "model": {
            "encoder": {"hf_config": str(enc / "config.json")},
            "llm": {"hf_config": str(llm / "config.json")},
        },
        "init": {"llm": str(llm), "encoder": str(enc)},
        "lr": {"schedule": "constant", "max": 1e-3},
        "save_interval": max(iters, 1),
    }
    y = make_run_yaml(tmp_path / "run", gbs=2, iters=iters, trainer=trainer | (extra or {}), **layout)
    p = run_torchrun(y, nproc, tmp_path / "run" / "metrics.jsonl")
    assert_ok(p, f"{iters} iterations at {layout}")
    assert "saved checkpoint" in p.stdout and f"iteration {iters}" in p.stdout

    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "mimo_jobs.cli", "export", str(tmp_path / "run" / "checkpoints"), str(out)]
    e = subprocess.run([*cmd, "--to", "hf"], capture_output=True, text=True, timeout=300, env=worker_env())
    assert e.returncode == 0, e.stderr[-3000:]
    return llm, enc, out


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_hf_to_any_layout_and_back_is_bit_identical(tmp_path, case):
    import torch

    llm, enc, out = _train_and_export(tmp_path, *CASES[case])

    for src, side in ((llm, "llm"), (enc, "encoder")):
        want, got = _tensors(src), _tensors(out / side)
        assert set(got) <= set(want)
        # the SigLIP attention-pooling head is no part of the trainer's ViT, so it is not exported
        assert all(k.startswith("head.") for k in set(want) - set(got)), sorted(set(want) - set(got))
        for k, v in got.items():
            assert v.dtype == want[k].dtype and torch.equal(v, want[k]), k
    a, b = (json.loads((d / "config.json").read_text()) for d in (llm, out / "llm"))
    assert hf.llm_fields(a) == hf.llm_fields(b) and a["architectures"] == b["architectures"]
    a, b = (json.loads((d / "config.json").read_text()) for d in (enc, out / "encoder"))
    assert hf.encoder_fields(a) == hf.encoder_fields(b)

    import transformers

    tokens = torch.arange(12)[None] % 250
    with torch.no_grad():
        ref = transformers.AutoModelForCausalLM.from_pretrained(llm).eval()(input_ids=tokens).logits
        back = transformers.AutoModelForCausalLM.from_pretrained(out / "llm").eval()(input_ids=tokens).logits
    assert torch.equal(ref, back)
    assert type(transformers.AutoModel.from_pretrained(out / "encoder")).__name__.endswith("VisionModel")


@pytest.mark.slow
def test_a_frozen_encoder_loads_and_stays_untrained(tmp_path):
    import torch

    layout = dict(gpn=3, enc={"dp": 1}, llm={"dp": 2})
    llm, enc, out = _train_and_export(
        tmp_path, "llama", "siglip", layout, 3, 2, {"freeze": {"encoder": True}}
    )
    want, got = _tensors(enc), _tensors(out / "encoder")
    assert all(torch.equal(v, want[k]) for k, v in got.items())
    want, got = _tensors(llm), _tensors(out / "llm")
    assert not all(torch.equal(v, want[k]) for k, v in got.items())  # the LLM trained

"""The trainer's modules loaded from HuggingFace safetensors compute what transformers computes from the same
directory: the LLM's logits (fp32, relative difference <= 1e-5) for every family model/hf.py reads, in one
process and at TP2, PP2 and MoE EP2 (torchrun); the ViT's output for CLIP, SigLIP and InternViT. Tiny random models
are written by transformers' own save_pretrained. The worker (hf_worker.py) builds the modules the way the
trainer does (build._build_language / _build_encoder with trainer.init naming the directory)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.launch import worker_env

pytest.importorskip("transformers")

import hf_models  # noqa: E402

HERE = Path(__file__).parent
WORKER = HERE / "hf_worker.py"
TOL = 1e-5


def _results(p: subprocess.CompletedProcess) -> list[dict]:
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-6000:]
    return [json.loads(ln[len("RESULT ") :]) for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]


def _one_process(specs: list[dict], tmp_path: Path) -> list[dict]:
    f = tmp_path / "specs.json"
    f.write_text(json.dumps(specs))
    p = subprocess.run(
        [sys.executable, str(WORKER), str(f)], capture_output=True, text=True, timeout=600, env=worker_env()
    )
    return _results(p)


def _torchrun(spec: dict, nproc: int, tmp_path: Path) -> list[dict]:
    from helpers.launch import torchrun

    f = tmp_path / "spec.json"
    f.write_text(json.dumps(spec))
    cmd = torchrun(nproc, WORKER, f)
    return _results(subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=worker_env()))


def _check(results: list[dict], n: int) -> None:
    assert len(results) == n, results
    for r in results:
        assert r["rel"] <= TOL, r
        assert r["split_disagrees"] == [], r


def _specs(tmp_path: Path, llms: list[str], encoders: list[str]) -> list[dict]:
    specs = [{"side": "llm", "dir": str(hf_models.save_llm(f, tmp_path / f))} for f in llms]
    specs += [{"side": "encoder", "dir": str(hf_models.save_encoder(k, tmp_path / k))} for k in encoders]
    return specs


def test_dense_moe_and_every_vision_family_equal_transformers_in_one_process(tmp_path):
    # Llama with GQA and every bias; Qwen2-MoE with a dense first layer, a gated shared expert and an
    # un-renormalised router: fused QKV per query group, gated MLP halves, experts, vocabulary padding;
    # CLIP, SigLIP and InternViT (class token in a [1, n, h] table, layer scale)
    vision = ["clip", "siglip", "internvit"]
    results = _one_process(_specs(tmp_path, ["llama", "qwen2_moe"], vision), tmp_path)
    _check(results, 5)
    assert results[0]["padded"] > results[0]["shape"][-1]  # 250 rows padded to 256: the padding is ignored


@pytest.mark.slow
def test_every_other_family_equals_transformers_in_one_process(tmp_path):
    # Qwen2 (q/k/v biases only), Qwen3 (QK-norm, head_dim), Qwen3-MoE, Mixtral (w1/w3/w2 experts), tied
    families = ["qwen2", "qwen3", "qwen3_moe", "mixtral", "llama-tied"]
    _check(_one_process(_specs(tmp_path, families, []), tmp_path), len(families))


@pytest.mark.slow
@pytest.mark.parametrize(
    "family,axes",
    [("llama", {"tp": 2}), ("qwen3", {"pp": 2}), ("mixtral", {"ep": 2})],
    ids=["tp2", "pp2", "ep2"],
)
def test_logits_equal_transformers_at_tp2_pp2_and_ep2(tmp_path, family, axes):
    d = hf_models.save_llm(family, tmp_path / family)
    results = _torchrun({"side": "llm", "dir": str(d), **axes}, 2, tmp_path)
    # TP2: both ranks hold the gathered logits; PP2: the last stage; EP2: both DP replicas
    _check(results, 1 if "pp" in axes else 2)

"""The Whisper-class audio encoder (trainer/model/audio_encoder.py) against transformers: its parameter
total (AudioArch's count, transformers' WhisperEncoder on the meta device, the built module), HF weights
of a tiny random WhisperModel (saved by transformers' own save_pretrained) loaded at TP 1 and TP 2 (gloo,
torchrun) with each clip's output equal to transformers' encoder (fp32, relative difference <= 1e-5) and
exactly AudioArch.tokens_for_frames rows, and the export back to HF names bit-identical (Whisper's k_proj
has no bias, and none is written)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.launch import worker_env

pytest.importorskip("transformers")

from mimo_jobs.model.audio_arch import audio_params  # noqa: E402
from mimo_jobs.model.families import whisper  # noqa: E402

WORKER = Path(__file__).parent / "audio_worker.py"
TOL = 1e-5
TINY = dict(
    d_model=32,
    encoder_layers=2,
    encoder_attention_heads=4,
    encoder_ffn_dim=64,
    num_mel_bins=8,
    max_source_positions=16,
)
# openai/whisper-small's published config.json (its encoder's fields)
SMALL = dict(
    d_model=768,
    encoder_layers=12,
    encoder_attention_heads=12,
    encoder_ffn_dim=3072,
    num_mel_bins=80,
    max_source_positions=1500,
)
# every length the tiny encoder takes a different way: full (32), odd, even, the shortest
FRAMES = [32, 31, 10, 3, 1]


def _whisper_config(enc: dict):
    import transformers as T

    decoder = dict(decoder_layers=1, decoder_attention_heads=4, decoder_ffn_dim=64, max_target_positions=16)
    tokens = dict(vocab_size=100, pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)
    return T.WhisperConfig(**enc, **decoder, **tokens)


def _save_tiny(out: Path, seed: int = 0) -> Path:
    """A tiny random WhisperModel: every parameter drawn (norms near 1, the rest small) so a wrong mapping
    shows in the output."""
    import torch
    import transformers as T

    model = T.WhisperModel(_whisper_config(TINY))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            p.copy_(1 + 0.1 * noise if "norm" in name and p.dim() == 1 else 0.05 * noise)
    model.save_pretrained(out)
    return out


def _results(p: subprocess.CompletedProcess) -> list[dict]:
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-6000:]
    return [json.loads(ln[len("RESULT ") :]) for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]


def _run(specs, tmp_path: Path, nproc: int = 0) -> list[dict]:
    from helpers.launch import torchrun

    f = tmp_path / "specs.json"
    f.write_text(json.dumps(specs))
    cmd = torchrun(nproc, WORKER, f) if nproc else [sys.executable, str(WORKER), str(f)]
    return _results(subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=worker_env()))


def _meta_count(enc: dict) -> int:
    import torch
    import transformers as T

    with torch.device("meta"):
        model = T.models.whisper.modeling_whisper.WhisperEncoder(_whisper_config(enc))
    return sum(p.numel() for p in model.parameters())


def _as_json(enc: dict) -> dict:
    return json.loads(_whisper_config(enc).to_json_string(use_diff=False))


def test_parameter_totals_equal_transformers_and_the_built_module(tmp_path):
    cfgs = [_as_json(TINY), _as_json(SMALL)]
    built = _run([{"count": c} for c in cfgs], tmp_path)
    for c, b in zip(cfgs, built):
        a = whisper.audio_arch(c)
        assert audio_params(a) == _meta_count({k: c[k] for k in TINY})
        # the module holds Whisper's parameters plus the k rows of its fused QKV bias
        assert b["held"] == audio_params(a, held=True) == audio_params(a) + a.num_layers * a.hidden_size
        # the trainer's init draws everything at random; the frozen table is written again as transformers does
        assert b["positions_max_abs"] <= 1e-6, b
    assert audio_params(whisper.audio_arch(cfgs[1])) == 88_154_112  # whisper-small's encoder


def _tensors(d: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(d / "model.safetensors")


def _check(tmp_path: Path, results: list[dict], specs: list[dict]) -> None:
    import torch
    import transformers as T

    assert len(results) == len(specs), results
    for r, spec in zip(results, specs):
        a = whisper.audio_arch(json.loads((Path(spec["dir"]) / "config.json").read_text()))
        a = type(a).from_dict(a.to_dict() | {"pooling": spec.get("pooling", 1)})
        assert r["loaded"] == 4 + 2 + 1 + 12 * a.num_layers  # every parameter came from the directory
        assert all(rel <= TOL for rel in r["rel"]), r
        assert r["split_disagrees"] == [], r
        assert r["steps_rel"] <= TOL, r  # the written-out steps are transformers' forward
        assert r["rows"] == [a.tokens_for_frames(n) for n in spec["frames"]]
        assert r["total_rows"] == sum(r["rows"])
        want = {k[len("encoder.") :]: v for k, v in _tensors(Path(spec["dir"])).items() if "decoder" not in k}
        got = _tensors(Path(spec["export"]))
        assert set(got) == set(want) and not any(k.endswith("k_proj.bias") for k in got)
        for k, v in got.items():
            assert v.dtype == want[k].dtype and torch.equal(v, want[k]), k
        back = T.models.whisper.modeling_whisper.WhisperEncoder.from_pretrained(spec["export"])
        assert sum(p.numel() for p in back.parameters()) == audio_params(a)
        cfg = json.loads((Path(spec["export"]) / "config.json").read_text())
        # Whisper's fields, and the pooling the export was run with (Whisper's config has none)
        assert whisper.audio_fields(cfg) == whisper.audio_fields(_as_json(TINY)) | {"pooling": a.pooling}


def _specs(tmp_path: Path, tp: int) -> list[dict]:
    d = _save_tiny(tmp_path / "hf")
    run = dict(dir=str(d), tp=tp, frames=FRAMES)
    # pooling 2: Qwen2-Audio's encoder, the same weights, is the reference
    pooled = run | {"pooling": 2, "frames": FRAMES[:-1], "export": str(tmp_path / "out2")}  # 3: one token
    return [run | {"export": str(tmp_path / "out1")}, pooled]


def test_hf_weights_load_run_as_transformers_and_export_bit_identical(tmp_path):
    specs = _specs(tmp_path, 1)
    _check(tmp_path, _run(specs, tmp_path), specs)


@pytest.mark.slow
def test_the_same_at_tp2(tmp_path):
    specs = _specs(tmp_path, 2)
    _check(tmp_path, _run(specs, tmp_path, nproc=2), specs)


def test_a_directory_of_another_encoder_or_missing_a_tensor_is_refused_by_name(tmp_path):
    from safetensors.torch import save_file

    d = _save_tiny(tmp_path / "hf")
    holed = tmp_path / "holed"
    holed.mkdir()
    (holed / "config.json").write_text((d / "config.json").read_text())
    tensors = _tensors(d)
    del tensors["encoder.layers.1.fc2.bias"]
    save_file(tensors, str(holed / "model.safetensors"))
    run = dict(tp=1, frames=[4], export=str(tmp_path / "out"))
    specs = [run | {"dir": str(d), "arch": {"num_layers": 3}}, run | {"dir": str(holed)}]
    other, hole = _run(specs, tmp_path)
    assert other["error"] == (
        f"audio encoder weights: {d / 'config.json'} describes another encoder: num_layers=2, the model has "
        f"num_layers=3"
    )
    assert hole["error"] == (
        f"audio encoder weights: {holed}: tensor encoder.layers.1.fc2.bias: no such tensor, the encoder "
        f"needs [32]"
    )

"""trainer.init and export per encoder module, on the packaged vision + audio model (studies/cpu_omni.yaml:
the tiny ViT and the tiny-audio Whisper-class encoder): `trainer.init.encoders.audio` names a tiny random
Whisper model written by transformers' own save_pretrained. The module built the trainer's way
(build._build_encoders) computes transformers' encoder output on the mock data's clip lengths (fp32); a
colocated run starts from the directory, trains with the audio module frozen (its memory facts: no
optimizer state, nothing kept for backward, each module's activations apart) and exports every module,
the audio one as a WhisperEncoder directory bit-identical to the weights it started from; a module name the
model does not have is one line and exit 2, from validate and the trainer's preflight alike."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from helpers.launch import worker_env
from helpers.trainer import OMNI_DATA, OMNI_STUDY, assert_ok, run_reference, run_torchrun, study_run_yaml

pytest.importorskip("transformers")

from mimo_jobs.model.presets import AUDIO_ENCODERS  # noqa: E402
from mimo_jobs.model.resolve import arch_of  # noqa: E402

HERE = Path(__file__).parent
WORKER = HERE / "audio_modules_worker.py"
TOL = 1e-5
MODEL = {"name": "tiny-omni", "encoders": {"vision": "tiny", "audio": "tiny-audio"}, "llm": "tiny"}
# the packaged model with a vision tower and an LLM that HuggingFace families express (SigLIP, Qwen3), so the
# export writes every module
EXPORTABLE = {"encoders": {"vision": "tiny-swiglu", "audio": "tiny-audio"}, "llm": "tiny-swiglu"}


def _save_whisper(out: Path, seed: int = 0) -> Path:
    """A tiny random WhisperModel at the packaged tiny-audio encoder's sizes (its decoder is not read)."""
    import torch
    import transformers as T

    a = AUDIO_ENCODERS["tiny-audio"]
    cfg = T.WhisperConfig(
        d_model=a.hidden_size,
        encoder_layers=a.num_layers,
        encoder_attention_heads=a.num_attention_heads,
        encoder_ffn_dim=a.ffn_hidden_size,
        num_mel_bins=a.num_mel_bins,
        max_source_positions=a.max_source_positions,
        decoder_layers=1,
        decoder_attention_heads=2,
        decoder_ffn_dim=32,
        max_target_positions=16,
        vocab_size=100,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=1,
    )
    model = T.WhisperModel(cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("embed_positions.weight"):
                continue  # the sinusoidal table, as WhisperEncoder writes it
            noise = torch.randn(p.shape, generator=g)
            p.copy_(1 + 0.1 * noise if "norm" in name and p.dim() == 1 else 0.05 * noise)
    model.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def whisper_dir(tmp_path_factory):
    return _save_whisper(tmp_path_factory.mktemp("hf") / "whisper-tiny-audio")


def _tensors(d: Path) -> dict:
    from safetensors.torch import load_file

    out = {}
    for f in sorted(d.glob("*.safetensors")):
        out.update(load_file(f))
    return out


def _built(tmp_path: Path, whisper_dir: Path, tp: int) -> None:
    from helpers.launch import torchrun

    # the mock data's clips, the longest, an odd one
    frames = [*sorted(set(OMNI_DATA["audio_frames"])), 64, 7]
    spec = {"dir": str(whisper_dir), "tp": tp, "frames": frames, "model": MODEL}
    f = tmp_path / "spec.json"
    f.write_text(json.dumps(spec))
    cmd = torchrun(tp, WORKER, f) if tp > 1 else [sys.executable, str(WORKER), str(f)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=worker_env())
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-6000:]
    (r,) = [json.loads(ln[len("RESULT ") :]) for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    a = AUDIO_ENCODERS["tiny-audio"]
    assert r["rows"] == [a.tokens_for_frames(n) for n in frames]
    assert all(rel <= TOL for rel in r["rel"]), r


def test_the_audio_module_built_from_its_directory_computes_transformers_encoder(tmp_path, whisper_dir):
    _built(tmp_path, whisper_dir, 1)


@pytest.mark.slow
def test_the_same_at_encoder_tp2(tmp_path, whisper_dir):
    _built(tmp_path, whisper_dir, 2)  # the packaged study's second point: the encoders over the TP pair


def test_a_colocated_run_starts_from_the_directory_and_exports_every_module(tmp_path, whisper_dir):
    import torch
    import transformers as T

    run = tmp_path / "run"
    y = study_run_yaml(
        run,
        OMNI_STUDY,
        0,  # LLM DP 2, every module on both processes
        model=EXPORTABLE,
        data=OMNI_DATA | {"image_sizes": [8, 16]},  # multiples of its patch 4 x pixel shuffle 2
        train_iters=1,
        lr={"schedule": "constant", "max": 1.0e-3},
        save_interval=1,
        init={"encoders": {"audio": str(whisper_dir)}},
        freeze={"encoders": {"audio": True}},
    )
    p = run_torchrun(y, 2, run / "metrics.jsonl")
    assert_ok(p, "a colocated vision + audio run from HF audio weights")
    assert "saved checkpoint" in p.stdout
    # memory facts per module: the frozen audio module has no optimizer state and keeps nothing for backward
    facts = json.loads((run / "memory" / "rank-00000.json").read_text())
    mods = facts["modules"]
    assert set(mods) == {"encoder", "encoder.audio", "language"}, mods
    assert mods["encoder.audio"]["optimizer_state_bytes"] == 0 < mods["encoder"]["optimizer_state_bytes"]
    assert (
        mods["encoder.audio"]["saved_activation_peak_bytes"]
        == 0
        < mods["language"]["saved_activation_peak_bytes"]
    )
    assert all(
        m["saved_activation_peak_bytes"] <= facts["saved_activation_peak_bytes"] for m in mods.values()
    )

    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "mimo_jobs.cli", "export", str(run / "checkpoints"), str(out), "--to", "hf"]
    e = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=worker_env())
    assert e.returncode == 0, e.stderr[-3000:]
    assert sorted(d.name for d in out.iterdir()) == [
        "audio",
        "audio-projector",
        "encoder",
        "llm",
        "projector",
    ]

    want = {k[len("encoder.") :]: v for k, v in _tensors(whisper_dir).items() if k.startswith("encoder.")}
    got = _tensors(out / "audio")
    assert set(got) == set(want)  # Whisper's k_proj has no bias, and none is written
    for k, v in got.items():
        assert v.dtype == want[k].dtype and torch.equal(v, want[k]), k
    back = T.models.whisper.modeling_whisper.WhisperEncoder.from_pretrained(out / "audio")
    for k, v in back.state_dict().items():
        assert torch.equal(v, want[k]), k
    # each projector under its own module's name (the trainer's: encoder.audio, encoder), never a shared one
    proj = _tensors(out / "audio-projector")
    assert proj["encoder.audio.projector.encoder.linear_fc1.weight"].shape[1] == (
        AUDIO_ENCODERS["tiny-audio"].out_width
    )
    assert {k.removeprefix("encoder.audio.") for k in proj} == {
        k.removeprefix("encoder.") for k in _tensors(out / "projector")
    } and not set(proj) & set(_tensors(out / "projector"))
    # the audio pooling travels in the config: transformers keeps it, and a model described from the export
    # gives the trainer's tokens per clip
    a = AUDIO_ENCODERS["tiny-audio"]
    assert T.WhisperConfig.from_pretrained(out / "audio").pooling == a.pooling == 2
    again = arch_of(
        {"encoders": {"audio": {"hf_config": str(out / "audio" / "config.json")}}, "llm": "tiny-swiglu"}
    )
    assert again.encoders["audio"].pooling == a.pooling
    assert again.encoders["audio"].tokens_for_frames(64) == a.tokens_for_frames(64)
    assert (out / "encoder" / "config.json").is_file() and (out / "projector" / "model.safetensors").is_file()


def _study_file(tmp_path: Path, init: dict) -> Path:
    doc = yaml.safe_load(OMNI_STUDY.read_text())
    doc["trainer"]["init"] = init
    f = tmp_path / "omni.yaml"
    f.write_text(yaml.safe_dump(doc, sort_keys=False))  # the modules in the study's order
    return f


def test_a_module_name_the_model_lacks_is_one_line_and_exit_2(tmp_path, whisper_dir):
    from typer.testing import CliRunner

    from mimo_jobs.cli.app import app

    init = {"encoders": {"speech": str(whisper_dir)}}
    want = "the model has no encoder module 'speech' (its modules: vision, audio)"
    r = CliRunner().invoke(app, ["validate", str(_study_file(tmp_path, init))])
    assert r.exit_code == 2 and f"trainer.init.encoders.speech: [init] {want}" in r.output, r.output

    y = study_run_yaml(tmp_path / "run", OMNI_STUDY, 0, init=init)
    p = run_reference(y, tmp_path / "run" / "metrics.jsonl")
    lines = [ln for ln in p.stderr.splitlines() if "error" in ln]
    assert p.returncode == 2 and len(lines) == 1, p.stderr[-3000:]
    assert f"trainer.init.encoders.speech: {want}" in lines[0], lines


def test_validate_checks_the_audio_directory_against_its_module(tmp_path, whisper_dir):
    from typer.testing import CliRunner

    from mimo_jobs.cli.app import app

    good = CliRunner().invoke(
        app, ["validate", str(_study_file(tmp_path, {"encoders": {"audio": str(whisper_dir)}}))]
    )
    assert good.exit_code == 0, good.output
    other = tmp_path / "other"
    cfg = json.loads((whisper_dir / "config.json").read_text()) | {"encoder_layers": 3}
    other.mkdir()
    (other / "config.json").write_text(json.dumps(cfg))
    (other / "model.safetensors").write_bytes((whisper_dir / "model.safetensors").read_bytes())
    bad = CliRunner().invoke(
        app, ["validate", str(_study_file(tmp_path, {"encoders": {"audio": str(other)}}))]
    )
    assert bad.exit_code == 2, bad.output
    assert "trainer.init.encoders.audio" in bad.output and "num_layers=3" in bad.output, bad.output

"""Encoders of another modality are found by their family: an audio config (transformers' WhisperConfig) is
read by the Whisper family (model/families/whisper.py) into an AudioArch, run.yaml's inline form reads back
as the class its `kind` names (model/arch.py encoder_arch_from_dict), and every other config is still read
as an image encoder."""

from __future__ import annotations

import json

import pytest
from transformers import WhisperConfig

from mimo_jobs.model.arch import ArchError, ModelArch, encoder_arch_from_dict
from mimo_jobs.model.audio_arch import AudioArch
from mimo_jobs.model.resolve import arch_of, resolved_field


def _whisper_small(tmp_path):
    # whisper-small's encoder sizes (its config.json on the HuggingFace hub: d_model 768, 12 layers, 12 heads)
    cfg = WhisperConfig(d_model=768, encoder_layers=12, encoder_attention_heads=12, encoder_ffn_dim=3072)
    d = cfg.to_dict() | {"architectures": ["WhisperForConditionalGeneration"]}
    (tmp_path / "whisper-small").mkdir()
    (tmp_path / "whisper-small" / "config.json").write_text(json.dumps(d))


def test_an_audio_encoder_resolves_from_its_config_and_reads_back(tmp_path):
    _whisper_small(tmp_path)
    model = {
        "encoders": {"vision": "tiny", "audio": {"hf_config": "whisper-small/config.json"}},
        "llm": "tiny",
    }
    a = arch_of(model, tmp_path)
    assert [(n, e.modality) for n, e in a.named_encoders] == [("vision", "image"), ("audio", "audio")]
    audio = a.encoders["audio"]
    assert isinstance(audio, AudioArch) and audio.kind == "whisper"
    assert (audio.hidden_size, audio.num_layers, audio.ffn_hidden_size) == (768, 12, 3072)
    assert audio.out_width == 768 and audio.name == "whisper-small"
    field = resolved_field(model, tmp_path)
    assert field["encoders"]["audio"]["kind"] == "whisper"
    assert ModelArch.from_dict(field) == a
    assert arch_of(field) == a  # run.yaml's inline form is the same model


def test_a_kind_reads_back_as_its_class():
    audio = AudioArch.from_dict(
        dict(kind="whisper", num_layers=2, hidden_size=32, num_attention_heads=4, ffn_hidden_size=64)
        | dict(num_mel_bins=8, max_source_positions=16)
    )
    assert encoder_arch_from_dict(audio.to_dict()) == audio
    with pytest.raises(ArchError, match="kind"):
        encoder_arch_from_dict(audio.to_dict() | {"kind": "wav2vec"})


def test_a_config_of_no_audio_family_reads_as_an_image_encoder(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "wav2vec2", "hidden_size": 768}))
    with pytest.raises(ArchError, match="model_type 'wav2vec2'.*supported: CLIPVisionModel") as e:
        arch_of({"encoders": {"audio": {"hf_config": "config.json"}}, "llm": "tiny"}, tmp_path)
    assert e.value.field == "encoders.audio.hf_config"


def test_audio_families_are_reached_through_the_registry():
    """Code outside model/families/ asks the registry for an audio encoder's family (families.audio(kind)), so
    a second audio family is a module there, not a new import at every call site."""
    from pathlib import Path

    import mimo_jobs
    from mimo_jobs.model import families

    root = Path(mimo_jobs.__file__).parent
    # the family's functions (its config reader, tensor names, export) by the family's module: not outside
    # model/families/ (its log-mel settings record, MelFeatures, is data any caller may hold)
    by_module = ("families import whisper", "whisper.audio_", "whisper.encoder_prefix")
    named = [
        str(p.relative_to(root))
        for p in root.rglob("*.py")
        if "families" not in p.parts and any(w in p.read_text() for w in by_module)
    ]
    assert named == [], named
    fam = families.audio("whisper")
    assert fam.modality == "audio" and {"arch", "layout", "encoder_prefix", "hf_config"} <= set(dir(fam))

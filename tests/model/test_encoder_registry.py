"""Encoder architectures of another modality join through two registries: their `kind` read back from
run.yaml (model/arch.py) and their HuggingFace model_type read from a hf_config (model/resolve.py). A small
audio architecture shows both, and that every other config still reads as an image encoder."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import pytest

from mimo_jobs.model import arch as arch_mod
from mimo_jobs.model import resolve as resolve_mod
from mimo_jobs.model.arch import ModelArch
from mimo_jobs.model.resolve import arch_of, resolved_field


@dataclass(frozen=True)
class _Audio:
    """The shared attributes of an encoder architecture, for an audio encoder."""

    kind: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    ffn_hidden_size: int
    name: str = ""
    source: str = ""

    modality = "audio"

    @property
    def out_width(self) -> int:
        return self.hidden_size

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict):
        return cls(**d)


def _audio_fields(cfg: dict) -> dict:
    # HuggingFace WhisperConfig's encoder fields (transformers' configuration_whisper.py)
    return {
        "kind": "whisper",
        "num_layers": cfg["encoder_layers"],
        "hidden_size": cfg["d_model"],
        "num_attention_heads": cfg["encoder_attention_heads"],
        "ffn_hidden_size": cfg["encoder_ffn_dim"],
    }


@pytest.fixture
def registered(monkeypatch):
    monkeypatch.setitem(arch_mod._ENCODER_ARCHS, "whisper", _Audio)
    monkeypatch.setitem(resolve_mod._HF_ENCODERS, "whisper", _audio_fields)


def test_an_audio_encoder_resolves_from_its_config_and_reads_back(registered, tmp_path):
    # whisper-small's encoder sizes, as its config.json states them
    cfg = {"model_type": "whisper", "d_model": 768, "encoder_layers": 12, "encoder_attention_heads": 12}
    (tmp_path / "whisper-small").mkdir()
    (tmp_path / "whisper-small" / "config.json").write_text(json.dumps(cfg | {"encoder_ffn_dim": 3072}))
    model = {
        "encoders": {"vision": "tiny", "audio": {"hf_config": "whisper-small/config.json"}},
        "llm": "tiny",
    }
    a = arch_of(model, tmp_path)
    assert [(n, e.modality) for n, e in a.named_encoders] == [("vision", "image"), ("audio", "audio")]
    assert a.encoders["audio"].out_width == 768 and a.encoders["audio"].name == "whisper-small"
    field = resolved_field(model, tmp_path)
    assert ModelArch.from_dict(field) == a
    assert arch_of(field) == a  # run.yaml's inline form is the same model


def test_without_the_registration_a_config_reads_as_an_image_encoder(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "whisper", "d_model": 768}))
    with pytest.raises(arch_mod.ArchError, match="model_type 'whisper'.*supported: CLIPVisionModel") as e:
        arch_of({"encoders": {"audio": {"hf_config": "config.json"}}, "llm": "tiny"}, tmp_path)
    assert e.value.field == "encoders.audio.hf_config"

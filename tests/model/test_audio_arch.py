"""The audio encoder's description (model/audio_arch.py) and its Whisper family (model/families/whisper.py):
the token rule against torch's own Conv1d / AvgPool1d output lengths, what is refused and how it is said,
Whisper's config.json read both ways (written by transformers' own config classes, no download), the
tensor names against transformers' WhisperEncoder, and the input frames against WhisperFeatureExtractor."""

from __future__ import annotations

import json

import pytest

from mimo_jobs.model.arch import ArchError
from mimo_jobs.model.audio_arch import AudioArch
from mimo_jobs.model.families import whisper

TINY = dict(
    kind="whisper",
    num_layers=2,
    hidden_size=32,
    num_attention_heads=4,
    ffn_hidden_size=64,
    num_mel_bins=8,
    max_source_positions=16,
)


def _torch_lengths(frames: int, pooling: int) -> int:
    """Time steps torch's own layers give: Whisper's two Conv1d, then Qwen2-Audio's AvgPool1d."""
    torch = pytest.importorskip("torch")
    x = torch.zeros(1, 1, frames)
    x = torch.nn.Conv1d(1, 1, kernel_size=3, padding=1)(x)
    x = torch.nn.Conv1d(1, 1, kernel_size=3, stride=2, padding=1)(x)
    if pooling > 1:
        x = torch.nn.AvgPool1d(pooling, stride=pooling)(x)
    return x.shape[-1]


@pytest.mark.parametrize("pooling", [1, 2, 3])
def test_the_token_rule_is_the_layers_output_length(pooling):
    a = AudioArch(**TINY, pooling=pooling)
    for frames in range(a.min_frames, a.max_frames + 1):
        assert a.tokens_for_frames(frames) == _torch_lengths(frames, pooling), frames
        assert whisper.tokens_for_frames(a, frames) == a.tokens_for_frames(frames)
    big = AudioArch(**(TINY | {"max_source_positions": 1500}))
    assert big.max_frames == 3000 and big.tokens_for_frames(3000) == 1500  # a 30 s clip, Whisper's 1500


def test_a_clip_too_long_or_too_short_is_refused_by_name():
    a = AudioArch(**TINY)
    with pytest.raises(ArchError) as e:
        a.tokens_for_frames(33)
    assert e.value.field == "max_source_positions"
    assert "a clip of 33 mel frames is longer than the encoder takes: 32 frames" in str(e.value)
    assert "at most 32 frames" in str(e.value)
    pooled = AudioArch(**TINY, pooling=2)
    with pytest.raises(ArchError, match="fewer than the pooling stride 2: no audio token.*at least 3 frames"):
        pooled.tokens_for_frames(2)
    np = pytest.importorskip("numpy")
    assert a.tokens_for_frames(np.int64(10)) == 5  # a count a data loader holds as numpy
    for bad in (0, -1, 2.5, True, "10"):
        with pytest.raises(ArchError, match="must be a positive integer"):
            a.tokens_for_frames(bad)


def test_bad_descriptions_name_the_field_and_what_fits():
    cases = [
        ("activation", {"activation": "relu"}, "'relu' is not one of gelu"),
        ("kind", {"kind": "clap"}, "'clap' is not one of whisper"),
        ("num_attention_heads", {"num_attention_heads": 5}, "hidden_size 32 is not divisible by 5 heads"),
        ("hidden_size", {"hidden_size": 33, "num_attention_heads": 3}, "33 does not fit the sinusoidal"),
        ("hidden_size", {"hidden_size": 2, "num_attention_heads": 1}, "an even width of at least 4"),
        ("pooling", {"pooling": 17}, "choose at most 16"),
        ("norm_epsilon", {"norm_epsilon": float("nan")}, "finite number above 0"),
    ]
    for field, change, msg in cases:
        with pytest.raises(ArchError) as e:
            AudioArch(**(TINY | change))
        assert e.value.field == field and msg in str(e.value), (field, str(e.value))
    with pytest.raises(ArchError) as e:
        AudioArch.from_dict(TINY | {"patch_size": 14})
    assert e.value.field == "patch_size" and "unknown audio encoder field" in str(e.value)
    with pytest.raises(ArchError) as e:
        AudioArch.from_dict({k: v for k, v in TINY.items() if k != "num_layers"})
    assert e.value.field == "num_layers"


def test_the_description_round_trips_and_states_its_kind():
    a = AudioArch(**TINY, pooling=2, name="audio")
    assert AudioArch.from_dict(json.loads(json.dumps(a.to_dict()))) == a
    assert a.modality == "audio" and a.out_width == 32


# ------------------------------------------------------------------------------------- HF config


def _config(cls_name: str = "WhisperConfig", **enc) -> dict:
    T = pytest.importorskip("transformers")
    small = dict(
        d_model=32,
        encoder_layers=2,
        encoder_attention_heads=4,
        encoder_ffn_dim=64,
        num_mel_bins=8,
        max_source_positions=16,
    )
    cfg = getattr(T, cls_name)(**(small | enc))
    return json.loads(cfg.to_json_string(use_diff=False))


def test_a_whisper_config_is_read_from_its_encoder_fields_and_written_back():
    cfg = _config(decoder_layers=7, decoder_ffn_dim=999)  # the decoder is not the encoder's business
    a = whisper.audio_arch(cfg, name="audio")
    assert a == AudioArch(**TINY, name="audio")
    back = whisper.audio_config(a)
    # and the pooling, which Whisper's config has not: a model read from the export pools as the trainer did
    assert whisper.audio_fields(back) == whisper.audio_fields(cfg) | {"pooling": a.pooling}
    T = pytest.importorskip("transformers")
    again = json.loads(T.WhisperConfig(**back).to_json_string(use_diff=False))  # transformers reads it
    assert whisper.audio_arch(again, name="audio") == a


def test_what_a_whisper_config_cannot_be_is_refused_by_name():
    with pytest.raises(ArchError) as e:
        whisper.audio_fields(_config(activation_function="relu"))
    assert e.value.field == "activation_function"
    assert "'relu' is not an activation the trainer's audio encoder has; it has gelu" in str(e.value)
    with pytest.raises(ArchError) as e:
        whisper.audio_fields(_config("CLIPVisionConfig"))
    assert e.value.field == "model_type" and "'clip_vision_model' is not a Whisper config" in str(e.value)
    cfg = _config()
    del cfg["encoder_ffn_dim"]
    with pytest.raises(ArchError) as e:
        whisper.audio_fields(cfg)
    assert e.value.field == "encoder_ffn_dim" and "missing" in str(e.value)
    for bad in (0, True, 2.5, "2"):
        with pytest.raises(ArchError) as e:
            whisper.audio_fields(_config(pooling=bad))
        assert e.value.field == "pooling" and "at least 1" in str(e.value), bad
    with pytest.raises(ArchError) as e:
        whisper.audio_config(AudioArch(**TINY, norm_epsilon=1e-6))
    assert e.value.field == "norm_epsilon" and "Whisper's LayerNorms use 1e-05" in str(e.value)


# ------------------------------------------------------------------------------------ tensor names


def test_the_layout_names_every_tensor_of_transformers_whisper_encoder():
    torch = pytest.importorskip("torch")
    T = pytest.importorskip("transformers")
    cfg = T.WhisperConfig.from_dict(_config(decoder_attention_heads=4))
    with torch.device("meta"):
        model = T.WhisperModel(cfg)
    want = {n: tuple(p.shape) for n, p in model.named_parameters() if n.startswith("encoder.")}
    assert whisper.encoder_prefix(list(dict(model.named_parameters()))) == "encoder."
    lay = whisper.audio_layout(AudioArch(**TINY), "encoder.")
    assert lay.hf_shapes == want  # no k_proj.bias: Whisper has none
    qkv = lay.targets["decoder.layers.0.self_attention.linear_qkv.bias"]
    # per head: q rows, zeros for k, v rows
    assert [(p.hf and p.hf.rsplit(".", 2)[-2], p.start) for p in qkv.pieces[:3]] == [
        ("q_proj", 0),
        (None, 0),
        ("v_proj", 0),
    ]
    for names, prefix in ((["model.encoder.conv1.weight", "model.decoder.x"], "model.encoder."),):
        assert whisper.encoder_prefix(names) == prefix
    with pytest.raises(ArchError, match="0 Whisper encoders"):
        whisper.encoder_prefix(["vision_model.embeddings.patch_embedding.weight"])


# ------------------------------------------------------------------------------------ input frames


def test_frames_are_what_whisper_feature_extractor_gives():
    np = pytest.importorskip("numpy")
    T = pytest.importorskip("transformers")
    mel = whisper.features_of(AudioArch(**TINY | {"num_mel_bins": 80, "max_source_positions": 1500}))
    fe = T.WhisperFeatureExtractor()
    assert mel.extractor_kwargs() == {k: fe.to_dict()[k] for k in mel.extractor_kwargs()}
    assert mel.chunk_frames == fe.nb_max_frames == 3000
    for samples in (400, 1599, 1600, 16001, 480000):
        x = fe(np.zeros(samples, dtype=np.float32), sampling_rate=16000, padding=False, return_tensors="np")
        assert x["input_features"].shape[-1] == mel.frames_for_samples(samples), samples

"""flops_per_sample (the trainer's log line and the report's MFU) counts every encoder module of a model: a
vision tower and an audio encoder before one LLM sum each module's FLOPs, as the per-module formulas give
them (encoder_flops_per_token and audio_clip_flops, each equal to torch's FlopCounterMode on the built
module: test_predict_vs_trainer.py, test_several_encoders.py) and as the planner's module-by-module figure
(modmix.sample_flops_by_module) gives the same mix."""

from __future__ import annotations

import pytest

from mimo_jobs.model.arch import ModelArch
from mimo_jobs.model.presets import AUDIO_ENCODERS, PRESETS
from mimo_jobs.predict.flops import (
    audio_clip_flops,
    encoder_flops_per_token,
    flops_per_sample,
    llm_flops_per_sample,
)
from mimo_jobs.predict.modmix import ModuleMix, sample_flops_by_module

TINY = PRESETS["tiny"]
AUDIO = AUDIO_ENCODERS["tiny-audio"]
SEQ = 64


def _vision_audio() -> ModelArch:
    return ModelArch("va", None, TINY.llm, encoders={"vision": TINY.encoder, "audio": AUDIO})


def test_a_vision_and_audio_models_sample_counts_both_modules():
    arch, hl = _vision_audio(), TINY.llm.hidden_size
    image_tokens, per_image = 48.0, 16.0  # three images of 16 tokens
    frames, clips = 16, 1.5  # clips of 16 mel frames, one and a half a sample on average
    audio_tokens = clips * AUDIO.tokens_for_frames(frames)
    got = flops_per_sample(arch, SEQ, image_tokens, per_image, audio_tokens=audio_tokens, clip_frames=frames)
    vision = image_tokens * encoder_flops_per_token(TINY.encoder, hl, per_image)
    audio = clips * audio_clip_flops(AUDIO, hl, frames)
    assert vision > 0 and audio > 0
    assert got.encoder == pytest.approx(vision + audio, rel=1e-12)
    assert got.llm == pytest.approx(llm_flops_per_sample(TINY.llm, SEQ), rel=1e-12)
    mixes = (
        ModuleMix("vision", "image", image_tokens, per_image, 48, "stated"),
        ModuleMix(
            "audio", "audio", audio_tokens, AUDIO.tokens_for_frames(frames), 8, "stated", False, clips, frames
        ),
    )
    assert got.total == pytest.approx(sample_flops_by_module(arch, mixes, SEQ)[1].total, rel=1e-12)
    # without a clip length the audio tokens are full-length clips (max_frames)
    full = flops_per_sample(arch, SEQ, image_tokens, per_image, audio_tokens=audio_tokens)
    n = audio_tokens / AUDIO.tokens_for_frames(AUDIO.max_frames)
    assert full.encoder == pytest.approx(
        vision + n * audio_clip_flops(AUDIO, hl, AUDIO.max_frames), rel=1e-12
    )


def test_a_one_encoder_models_sample_is_unchanged_and_two_of_a_kind_are_refused():
    per_image = 16.0
    got = flops_per_sample(TINY, SEQ, 32.0, per_image)
    assert got.encoder == pytest.approx(
        32.0 * encoder_flops_per_token(TINY.encoder, TINY.llm.hidden_size, per_image)
    )
    two = ModelArch("vv", None, TINY.llm, encoders={"left": TINY.encoder, "right": TINY.encoder})
    with pytest.raises(ValueError, match="two encoder modules of one kind"):
        flops_per_sample(two, SEQ, 32.0, per_image)

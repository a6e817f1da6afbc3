"""Audio files into log-mel clips: the log-mel of a PCM `.wav` against transformers'
`WhisperFeatureExtractor` (the reference the audio family's settings come from), the samples `wave` reads
against the ones written, and each refusal naming the file and the rule."""

from __future__ import annotations

import io
import wave

import numpy as np
import pytest

from mimo_jobs.data.audio_input import AudioFileError, clip_member, log_mel, read_wav
from mimo_jobs.model.families.whisper import MelFeatures


def _waveform(seconds: float, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * 16000)) / 16000
    chirp = np.sin(2 * np.pi * (200 + 900 * t) * t)
    return (0.4 * chirp + 0.05 * rng.standard_normal(t.size)).astype(np.float32)


@pytest.mark.parametrize("n_mels,seconds", [(80, 1.0), (128, 2.37), (16, 0.5)])
def test_log_mel_matches_transformers_whisper_feature_extractor(n_mels, seconds):
    from transformers import WhisperFeatureExtractor

    f = MelFeatures(n_mels=n_mels)
    x = _waveform(seconds)
    ref = WhisperFeatureExtractor(**f.extractor_kwargs())(
        x, sampling_rate=16000, padding="longest", return_tensors="np"
    ).input_features[0]
    ours = log_mel(x, f)
    assert ours.dtype == np.float32 and ours.shape == ref.shape == (n_mels, f.frames_for_samples(x.size))
    np.testing.assert_allclose(ours, ref, atol=1e-4, rtol=0)


def _write_wav(path, samples: np.ndarray, rate=16000, channels=1, width=2):
    with wave.open(str(path), "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(width)
        w.setframerate(rate)
        w.writeframes(samples.astype(f"<i{width}").tobytes())


def test_a_wav_file_becomes_the_log_mel_of_its_samples(tmp_path):
    f = MelFeatures(n_mels=80)
    x = _waveform(1.2, seed=1)
    ints = np.round(x * 32767).astype(np.int16)
    stereo = np.stack([ints, ints], axis=1).reshape(-1)  # both channels the same: their mean is the signal
    _write_wav(tmp_path / "a.wav", stereo, channels=2)
    got = read_wav(tmp_path / "a.wav", f)
    np.testing.assert_array_equal(got, ints / 32768.0)
    clip = np.load(io.BytesIO(clip_member(tmp_path / "a.wav", f)), allow_pickle=False)
    np.testing.assert_array_equal(clip, log_mel(ints / 32768.0, f))


def test_refusals_name_the_file_and_the_rule(tmp_path):
    f = MelFeatures(n_mels=80)
    _write_wav(tmp_path / "fast.wav", np.zeros(4410, np.int16), rate=44100)
    with pytest.raises(
        AudioFileError, match=r"fast.wav is sampled at 44100 Hz; the audio encoder reads 16000"
    ):
        clip_member(tmp_path / "fast.wav", f)
    (tmp_path / "x.flac").write_bytes(b"fLaC")
    with pytest.raises(AudioFileError, match=r"x.flac: FLAC needs a decoder .* convert it to PCM WAV"):
        clip_member(tmp_path / "x.flac", f)
    np.save(tmp_path / "m.npy", np.zeros((40, 10), np.float32))
    with pytest.raises(
        AudioFileError, match=r"m.npy holds an array of shape \[40, 10\]; expected \[80, frames\]"
    ):
        clip_member(tmp_path / "m.npy", f)
    (tmp_path / "n.wav").write_bytes(b"RIFF....not a wav")
    with pytest.raises(AudioFileError, match=r"n.wav is not a PCM WAV file"):
        clip_member(tmp_path / "n.wav", f)
    (tmp_path / "s.mp3").write_bytes(b"ID3")
    with pytest.raises(AudioFileError, match=r"audio is read from .npy, .wav, .flac files, not .mp3"):
        clip_member(tmp_path / "s.mp3", f)

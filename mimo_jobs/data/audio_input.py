"""Audio files as the log-mel clips a Whisper-class encoder reads (what `data prepare` stores as `.npy`).

A clip given as `.npy` is read as data (`allow_pickle=False`) and must already be float32 log-mel
[n_mels, frames]. A `.wav` file (PCM, read with the standard library's `wave`) becomes log-mel here with the
audio family's own settings (`model.families.whisper.MelFeatures`: 16 kHz, a 400-sample Hann window every
160 samples, n_mels Slaney-scale filters up to 8 kHz), as transformers' `WhisperFeatureExtractor` computes it
with `padding="longest"` (no 30 s padding): power spectrum of the centred, reflect-padded STFT, the last
frame dropped, log10 floored at 1e-10, floored again at 8 below the clip's maximum, then (x + 4) / 4.
Several channels are averaged to one; another sampling rate is refused (no resampling here). FLAC needs a
decoder this installation does not have and is refused with what to do instead.
"""

from __future__ import annotations

import math
import wave
from pathlib import Path

import numpy as np

from mimo_jobs.model.families.whisper import MelFeatures

from .audio import npy_bytes, npy_shape

AUDIO_SUFFIXES = (".npy", ".wav", ".flac")
MAX_FILE_BYTES = 256 << 20  # one audio file (600 s of 16 kHz 32-bit stereo is under 80 MiB)
MAX_SECONDS = 600  # one clip of a record; longer audio is cut into clips before it is prepared
_LOG_FLOOR = 1e-10  # the extractor's mel floor
_DYNAMIC_RANGE = 8.0  # log10 units kept below the clip's maximum


class AudioFileError(ValueError):
    """An audio file that cannot become a clip: the message names the file and the rule."""


def _hz_to_mel(hz: np.ndarray) -> np.ndarray:
    """Slaney's mel scale (librosa's default, `htk=False`): linear below 1 kHz, logarithmic above."""
    f_sp, min_log_hz, min_log_mel = 200.0 / 3, 1000.0, 15.0
    logstep = 27.0 / math.log(6.4)
    hz = np.asarray(hz, dtype=np.float64)
    return np.where(
        hz < min_log_hz, hz / f_sp, min_log_mel + np.log(np.maximum(hz, 1e-12) / min_log_hz) * logstep
    )


def _mel_to_hz(mel: np.ndarray) -> np.ndarray:
    f_sp, min_log_hz, min_log_mel = 200.0 / 3, 1000.0, 15.0
    logstep = math.log(6.4) / 27.0
    mel = np.asarray(mel, dtype=np.float64)
    return np.where(mel < min_log_mel, mel * f_sp, min_log_hz * np.exp(logstep * (mel - min_log_mel)))


def mel_filters(f: MelFeatures) -> np.ndarray:
    """[n_fft // 2 + 1, n_mels] triangular filters, Slaney-normalised (each filter's area is 1 per Hz of
    width), between 0 Hz and the Nyquist frequency of 16 kHz audio (8 kHz)."""
    bins = f.n_fft // 2 + 1
    edges = _mel_to_hz(np.linspace(_hz_to_mel(0.0), _hz_to_mel(8000.0), f.n_mels + 2))
    fft_hz = np.linspace(0, f.sampling_rate // 2, bins)
    slopes = edges[None, :] - fft_hz[:, None]
    width = np.diff(edges)
    down = -slopes[:, :-2] / width[:-1]
    up = slopes[:, 2:] / width[1:]
    tri = np.maximum(0.0, np.minimum(down, up))
    return tri * (2.0 / (edges[2 : f.n_mels + 2] - edges[: f.n_mels]))[None, :]


def log_mel(waveform: np.ndarray, f: MelFeatures) -> np.ndarray:
    """A mono waveform at f.sampling_rate -> float32 log-mel [n_mels, len // hop] (see the module's text)."""
    x = np.asarray(waveform, dtype=np.float64)
    half = f.n_fft // 2
    if x.ndim != 1 or x.size <= half:
        raise AudioFileError(
            f"a clip needs more than {half} samples ({half / f.sampling_rate * 1000:.0f} ms)"
        )
    x = np.pad(x, half, mode="reflect")
    frames = 1 + (x.size - f.n_fft) // f.hop_length
    idx = np.arange(f.n_fft)[None, :] + f.hop_length * np.arange(frames)[:, None]
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(f.n_fft) / f.n_fft)  # periodic Hann
    power = np.abs(np.fft.rfft(x[idx] * window, n=f.n_fft, axis=1)) ** 2  # [frames, bins]
    mel = np.log10(np.maximum(power @ mel_filters(f), _LOG_FLOOR)).T[:, :-1]
    mel = np.maximum(mel, mel.max() - _DYNAMIC_RANGE)
    return ((mel + 4.0) / 4.0).astype(np.float32)


def read_wav(path: Path, f: MelFeatures) -> np.ndarray:
    """A PCM `.wav` file -> float64 mono samples in [-1, 1]; AudioFileError naming what does not fit."""
    try:
        with wave.open(str(path), "rb") as w:
            rate, width, channels, n = w.getframerate(), w.getsampwidth(), w.getnchannels(), w.getnframes()
            if rate != f.sampling_rate:
                raise AudioFileError(
                    f"{path} is sampled at {rate} Hz; the audio encoder reads {f.sampling_rate} Hz audio "
                    f"(resample it, e.g. `ffmpeg -i IN -ar {f.sampling_rate} OUT.wav`)"
                )
            if n > MAX_SECONDS * rate:
                raise AudioFileError(
                    f"{path} lasts {n / rate:.0f} s; cut it into clips of at most {MAX_SECONDS} s"
                )
            raw = w.readframes(n)
    except (wave.Error, EOFError) as e:
        raise AudioFileError(f"{path} is not a PCM WAV file the standard library reads ({e})") from None
    if width == 1:  # 8-bit WAV is unsigned
        x = (np.frombuffer(raw, dtype=np.uint8).astype(np.float64) - 128.0) / 128.0
    elif width in (2, 4):
        x = np.frombuffer(raw, dtype=f"<i{width}").astype(np.float64) / float(1 << (8 * width - 1))
    else:
        raise AudioFileError(f"{path} has {8 * width}-bit samples; give 8-, 16- or 32-bit PCM")
    if x.size != n * channels:
        raise AudioFileError(f"{path} is truncated: {x.size} of {n * channels} samples")
    return x.reshape(n, channels).mean(axis=1)


def clip_member(path: Path, f: MelFeatures) -> bytes:
    """One audio file -> the `.npy` bytes of its float32 log-mel clip; AudioFileError naming the rule."""
    suffix = path.suffix.lower()
    if suffix == ".npy":
        data = path.read_bytes()
        try:
            shape = npy_shape(data)
        except ValueError as e:
            raise AudioFileError(f"{path}: {e}") from None
        if len(shape) != 2 or shape[0] != f.n_mels:
            raise AudioFileError(
                f"{path} holds an array of shape {list(shape)}; expected [{f.n_mels}, frames] "
                f"(log-mel with the audio encoder's {f.n_mels} mel bins)"
            )
        return data
    if suffix == ".wav":
        return npy_bytes(log_mel(read_wav(path, f), f))
    if suffix == ".flac":
        raise AudioFileError(
            f"{path}: FLAC needs a decoder this installation lacks (the `soundfile` package); convert it to "
            f"PCM WAV (`ffmpeg -i IN.flac -ar {f.sampling_rate} OUT.wav`) or to log-mel `.npy`"
        )
    raise AudioFileError(
        f"{path}: audio is read from {', '.join(AUDIO_SUFFIXES)} files, not {suffix or 'no suffix'}"
    )


def record_clip(folder: Path, rel: str, f: MelFeatures) -> bytes:
    """The `.npy` member of one audio path of a record (relative to `folder`, kept inside it); ValueError
    naming the path and the rule (data prepare turns it into a refused record)."""
    path = folder / rel
    try:
        inside = path.resolve().is_relative_to(folder.resolve())
    except OSError as e:
        raise AudioFileError(f"audio {rel!r}: cannot resolve {path} ({e.strerror or e})") from None
    if not inside:
        raise AudioFileError(f"audio {rel!r}: {path} leads out of {folder}")
    if not path.exists():
        raise AudioFileError(f"audio {rel!r}: no such file {path}")
    if not path.is_file():
        raise AudioFileError(f"audio {rel!r}: {path} is not a regular file")
    if path.stat().st_size > MAX_FILE_BYTES:
        raise AudioFileError(f"audio {rel!r}: {path} is over {MAX_FILE_BYTES >> 20} MiB")
    try:
        return clip_member(path, f)
    except OSError as e:
        raise AudioFileError(f"audio {rel!r}: cannot read {path} ({e.strerror or e})") from None

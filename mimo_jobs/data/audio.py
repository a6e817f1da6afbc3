"""Audio clips as log-mel features, and what both sides of the bridge need of them.

A clip is an `.npy` member (numpy's format, `numpy/lib/format.py`): a float32 array [n_mels, frames], the
log-mel spectrogram an audio encoder reads (Whisper's feature extractor gives 80 or 128 mel bins at 100
frames a second). The LLM side needs only the clip's token count, read from the `.npy` header (no data
loaded); the encoder side loads the array with `np.load(..., allow_pickle=False)`. A member is data, never
run: an object array (numpy stores those as a pickle) is refused from its header before anything is loaded,
and `allow_pickle=False` refuses it again.

How many LLM tokens a clip of F frames becomes is the audio encoder family's rule (its convolutions and
pooling), handed in as `AudioSpec.tokens`; this module only applies it. With no audio encoder the spec is
None and a sample with a clip is refused.
"""

from __future__ import annotations

import io
import re
from collections.abc import Callable
from dataclasses import dataclass

AUDIO_MARKER = "<audio>"
DTYPE = "<f4"  # float32, little-endian: what Whisper's feature extractor gives
MAX_FRAMES = 1 << 20  # a bound on one clip, so a hostile header cannot ask for a huge array


@dataclass(frozen=True)
class AudioSpec:
    """What the data needs of the model's audio encoder: its token rule (mel frames -> LLM tokens) and, when
    known, its mel bins (a clip with another count is refused). `tokens` must pickle (energon's workers)."""

    tokens: Callable[[int], int]
    n_mels: int | None = None

    def clip_tokens(self, shape: tuple[int, ...]) -> int:
        """The LLM tokens of a clip of this shape; ValueError naming the rule it breaks."""
        if len(shape) != 2:
            raise ValueError(f"audio clip has shape {list(shape)}; expected [n_mels, frames]")
        mels, frames = shape
        if self.n_mels is not None and mels != self.n_mels:
            raise ValueError(f"audio clip has {mels} mel bins; the audio encoder reads {self.n_mels}")
        if not 1 <= frames <= MAX_FRAMES:
            raise ValueError(f"audio clip has {frames} frames; expected 1 to {MAX_FRAMES}")
        n = int(self.tokens(frames))
        if n < 1:
            raise ValueError(f"audio clip of {frames} frames gives {n} tokens: too short for the encoder")
        return n


def audio_spec_of(arch) -> AudioSpec | None:
    """The AudioSpec of a model (a resolved `ModelArch`): its encoder whose `modality` is "audio", with the
    family's `tokens_for_frames` and, when it says, its `num_mel_bins`; None when it has none."""
    encoders = getattr(arch, "encoders", None)
    found = list(encoders.values()) if isinstance(encoders, dict) else [getattr(arch, "encoder", None)]
    for enc in found:
        if getattr(enc, "modality", None) == "audio":
            return audio_spec_of_module(enc)
    return None


def audio_spec_of_module(enc) -> AudioSpec:
    """The AudioSpec of one audio encoder module (its family's token rule and mel bins)."""
    return AudioSpec(tokens=enc.tokens_for_frames, n_mels=getattr(enc, "num_mel_bins", None))


def npy_shape(data: bytes) -> tuple[int, ...]:
    """The shape of a float32 `.npy` member from its header alone; ValueError when it is not one (not
    `.npy`, another dtype, an object array, Fortran order, or its data shorter or longer than the header
    says)."""
    import numpy as np

    buf = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(buf)
        read = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
        if version not in read:
            raise ValueError(f"npy format version {version}")
        shape, fortran, dtype = read[version](buf)
    except (ValueError, SyntaxError, OSError) as e:
        raise ValueError(f"audio member is not a readable .npy array ({e})") from None
    if dtype.hasobject:
        raise ValueError(
            "audio member is an object array (a pickle); it is refused unread: save float32 features "
            "with np.save(f, features.astype(np.float32))"
        )
    if dtype.str != DTYPE:
        raise ValueError(f"audio member has dtype {dtype.str!r}; expected float32 ({DTYPE!r})")
    if fortran:
        raise ValueError("audio member is in Fortran order; save it C-contiguous")
    if any(n > MAX_FRAMES for n in shape):
        raise ValueError(f"audio member has shape {list(shape)}; no side may exceed {MAX_FRAMES}")
    need = 4
    for n in shape:
        need *= n
    if len(data) - buf.tell() != need:
        raise ValueError(
            f"audio member holds {len(data) - buf.tell()} data bytes; its header {list(shape)} needs {need}"
        )
    return tuple(int(n) for n in shape)


def load_clip(data: bytes):
    """The clip as a float32 tensor [n_mels, frames] (encoder side); never unpickles."""
    import numpy as np
    import torch

    npy_shape(data)
    arr = np.load(io.BytesIO(data), allow_pickle=False)
    if not np.isfinite(arr).all():  # a NaN or inf feature would reach the loss and the gradients
        bad = int(arr.size - np.isfinite(arr).sum())
        raise ValueError(f"audio clip has {bad} NaN or infinite value(s); log-mel features are finite")
    return torch.from_numpy(np.ascontiguousarray(arr, dtype=np.float32))


def npy_bytes(features) -> bytes:
    """A float32 array as `.npy` bytes (what synth writes; the same array gives the same bytes)."""
    import numpy as np

    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(features, dtype=np.float32), allow_pickle=False)
    return buf.getvalue()


def pad_clips(clips: list):
    """Clips [n_mels, f_i] -> (features [N, n_mels, max f] zero-padded on the right, frames [N]): one tensor
    for an encoder that takes a padded batch with lengths."""
    import torch

    if not clips:
        return torch.zeros(0, 0, 0), torch.zeros(0, dtype=torch.long)
    frames = torch.tensor([c.shape[-1] for c in clips], dtype=torch.long)
    out = torch.zeros(len(clips), clips[0].shape[0], int(frames.max()))
    for i, c in enumerate(clips):
        out[i, :, : c.shape[-1]] = c
    return out, frames


def parse_frames(text: str) -> int:
    """'100' -> 100: one clip length in frames, as the command line gives it."""
    m = re.fullmatch(r"\s*(\d{1,8})\s*", text)
    if m is None or not 1 <= int(m.group(1)) <= MAX_FRAMES:
        raise ValueError(f"audio frames {text!r}: a whole number of frames from 1 to {MAX_FRAMES}")
    return int(m.group(1))

"""A synthetic energon dataset of samples with audio clips, images, both or neither, of the sample type
`data prepare` writes (ConversationSample through samples.conversation_images), so one task encoder reads
both:

  DIR/audio/  audio-NNNNNN.tar  <key>.json {"conversation": [{"role": "assistant", "content": text}]}, and
              by sample <key>.0.png ..., <key>.audio.npy (one clip) or <key>.0.npy, <key>.1.npy (two clips)

The text is one assistant turn (nothing prompts it), which the task encoder reads as a document: BOS, the
text with its markers' placeholders, EOS, with or without a chat template.

Sample i is, by i mod 4: audio only (one or two clips), image only, image and audio, text only. A clip is a
float32 log-mel-like array [n_mels, frames]: its word's fixed band pattern plus noise, so a clip says which
word the text names after it; its length is one of `frames`. Content is a pure function of (seed, index):
the same arguments write the same bytes.
"""

from __future__ import annotations

import json
import random
import zlib
from dataclasses import dataclass
from pathlib import Path

from .audio import npy_bytes
from .errors import DataError
from .shards import prepare, write_shards
from .synth import COLORS, CONVERSATION, SHAPES, render_png

KINDS = ("audio", "image", "both", "text")
N_MELS = 80  # Whisper's log-mel bins (the 128-bin large-v3 aside)
MAX_MELS = 256
MAX_FRAMES = 3000  # Whisper's 30 s window at 100 frames a second


@dataclass(frozen=True)
class AudioSynthConfig:
    samples: int
    n_mels: int = N_MELS
    frames: tuple[int, ...] = (16, 32)  # clip lengths drawn from
    image_sizes: tuple[tuple[int, int], ...] = ((8, 8), (12, 12), (16, 16))
    seed: int = 0
    samples_per_shard: int = 64

    def check(self) -> None:
        if self.samples < 1:
            raise DataError(f"audio samples={self.samples}: need at least 1")
        if not 1 <= self.n_mels <= MAX_MELS:
            raise DataError(
                f"--n-mels={self.n_mels}: mel bins from 1 to {MAX_MELS} (Whisper reads 80 or 128)"
            )
        if not self.frames:
            raise DataError("--audio-frames is empty: give clip lengths in frames, e.g. 16,32")
        bad = [f for f in self.frames if not 1 <= f <= MAX_FRAMES]
        if bad:
            raise DataError(
                f"--audio-frames {bad[0]}: clip lengths from 1 to {MAX_FRAMES} frames (30 s at 100 a second)"
            )
        if not self.image_sizes:
            raise DataError("image_sizes is empty but the audio dataset has samples with images")


def clip_features(word: str, n_mels: int, frames: int, seed: int, index: int):
    """[n_mels, frames] float32: the word's bands (every k-th mel bin, k from the word) raised by 2, plus
    N(0, 0.25) noise from the clip's own generator."""
    import numpy as np

    k = 2 + zlib.crc32(word.encode()) % 5
    base = np.zeros((n_mels, 1), dtype=np.float32)
    base[::k] = 2.0
    noise = np.random.default_rng([seed, index]).standard_normal((n_mels, frames)).astype(np.float32)
    return base + 0.25 * noise


def audio_sample(seed: int, i: int, cfg: AudioSynthConfig) -> tuple[str, dict, dict]:
    """(key, its members {ext: bytes}, its record {"images": [[h, w]], "frames": [f]}) of sample i."""
    rng = random.Random(f"audio:{seed}:{i}")
    kind = KINDS[i % len(KINDS)]
    colors = sorted(COLORS)
    files: dict[str, bytes] = {}
    record: dict[str, list] = {"images": [], "frames": []}
    texts: list[str] = []
    if kind in ("image", "both"):
        h, w = cfg.image_sizes[rng.randrange(len(cfg.image_sizes))]
        color = rng.choice(colors)
        files["0.png"] = render_png(h, w, color, seed, i)
        record["images"].append([h, w])
        texts.append(f"<image> a {color} {rng.choice(SHAPES)}")
    if kind in ("audio", "both"):
        n = 1 if kind == "both" else rng.randint(1, 2)
        words = [rng.choice(colors) for _ in range(n)]
        for j, word in enumerate(words):
            f = cfg.frames[rng.randrange(len(cfg.frames))]
            clip = npy_bytes(clip_features(word, cfg.n_mels, f, seed, i * 4 + j))
            files["audio.npy" if n == 1 else f"{j}.npy"] = clip
            record["frames"].append(f)
        texts.append(" ".join(["<audio>"] * n) + " says " + " ".join(words))
    if kind == "text":
        texts.append(f"just text about {rng.choice(colors)}")
    turn = {"role": "assistant", "content": " ".join(texts)}
    files = {"json": json.dumps({"conversation": [turn]}).encode(), **files}
    return f"aud-{i:07d}", files, record


def write_audio(root: str | Path, cfg: AudioSynthConfig, progress=None) -> dict:
    """The audio dataset under root; returns {key: {"images": [[h, w], ...], "frames": [f, ...]}}."""
    cfg.check()
    tick = progress or (lambda n=1: None)
    root = Path(root)
    samples, records = [], {}
    for i in range(cfg.samples):
        key, files, record = audio_sample(cfg.seed, i, cfg)
        samples.append((key, files))
        records[key] = record
        tick(1)
    shards = write_shards(root, "audio", samples, cfg.samples_per_shard)
    prepare(root, shards, {"sample_type": CONVERSATION["sample_type"]}, loader="conversation_images")
    return records

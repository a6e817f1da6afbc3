"""Synthetic energon datasets whose samples hold several images (the members samples.py's loaders read):

  DIR/multi/        multi-NNNNNN.tar  <key>.json + <key>.0.png, <key>.1.png, ...
                    ConversationSample through samples.conversation_images: a user turn with one <image>
                    marker per image, the assistant naming each image's color in order (needs a chat template)
  DIR/interleaved/  interleaved-NNNNNN.tar  <key>.json + numbered images
                    energon's InterleavedSample through samples.interleaved_images: text pieces and images
                    alternating, each text naming the color of the image after it

Content is a pure function of (seed, index); images take sizes from `sizes` (different token counts).
Returns, per key, the image sizes in placeholder order: what a test checks the placeholders against.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from .shards import prepare, write_shards
from .synth import COLORS, SHAPES, render_png


def _images(rng: random.Random, seed: int, i: int, n: int, sizes) -> list[tuple[tuple[int, int], str, bytes]]:
    out = []
    for j in range(n):
        h, w = sizes[rng.randrange(len(sizes))]
        color = rng.choice(sorted(COLORS))
        out.append(((h, w), color, render_png(h, w, color, seed, i * 16 + j)))
    return out


def multi_image_sample(seed: int, i: int, sizes, max_images: int = 3) -> tuple[str, dict, list]:
    """(key, JSON member, [(size, color, png)]) of a conversation about 2..max_images images."""
    rng = random.Random(f"multi:{seed}:{i}")
    ims = _images(rng, seed, i, rng.randint(2, max_images), sizes)
    turns = [
        {"role": "user", "content": "".join("<image>\n" for _ in ims) + "color?"},
        {"role": "assistant", "content": " ".join(c for _, c, _ in ims)},
    ]
    return f"multi-{i:07d}", {"conversation": turns}, ims


def interleaved_sample(seed: int, i: int, sizes, max_images: int = 3) -> tuple[str, dict, list]:
    """(key, JSON member, [(size, color, png)]) of a document: text, image, text, image, ... text."""
    rng = random.Random(f"inter:{seed}:{i}")
    ims = _images(rng, seed, i, rng.randint(1, max_images), sizes)
    seq: list = []
    for j, (_, color, _) in enumerate(ims):
        seq += [f"a {color} {rng.choice(SHAPES)}", {"image": j}]
    seq.append("the end")
    return f"inter-{i:07d}", {"sequence": seq}, ims


def _write(root: Path, prefix: str, made: list, sample_type: dict, loader_fn: str, per_shard: int) -> dict:
    samples = []
    sizes: dict[str, list[list[int]]] = {}
    for key, member, ims in made:
        files = {"json": json.dumps(member).encode()}
        files.update({f"{j}.png": png for j, (_, _, png) in enumerate(ims)})
        samples.append((key, files))
        sizes[key] = [list(size) for size, _, _ in ims]
    shards = write_shards(root, prefix, samples, per_shard)
    prepare(root, shards, {"sample_type": sample_type}, loader=loader_fn)
    return sizes


def write_multi_image(root: str | Path, n: int, sizes, seed: int = 0, per_shard: int = 64) -> dict:
    """The multi-image conversation dataset under root; returns {key: [[h, w], ...]}."""
    made = [multi_image_sample(seed, i, sizes) for i in range(n)]
    sample_type = {"__module__": "mimo_jobs.data.samples", "__class__": "ConversationSample"}
    return _write(Path(root), "multi", made, sample_type, "conversation_images", per_shard)


def write_interleaved(root: str | Path, n: int, sizes, seed: int = 0, per_shard: int = 64) -> dict:
    """The interleaved image-text dataset under root; returns {key: [[h, w], ...]}."""
    made = [interleaved_sample(seed, i, sizes) for i in range(n)]
    sample_type = {"__module__": "megatron.energon", "__class__": "InterleavedSample"}
    return _write(Path(root), "interleaved", made, sample_type, "interleaved_images", per_shard)

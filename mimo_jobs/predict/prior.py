"""The image mix the planner assumes when a study's data has no statistics (pure): a stated prior put through
the project's own tiling rule (mimo_jobs/model/tiling.py), its low and high ends, and how packing scales
a row's images.

The prior: every sample carries one image and PRIOR_TEXT_TOKENS text tokens; the image's tiling grid
(cols x rows) is equally likely to be each grid InternVL's `dynamic_preprocess` chooses among (its
`target_ratios`: every cols x rows with 1 <= cols*rows <= max_tiles; https://github.com/OpenGVLab/InternVL,
internvl_chat/internvl/train/dataset.py), the image being large enough to fill it (cols*T x rows*T pixels,
T the tile side), so that tiling.py gives it exactly that grid, plus the thumbnail when one is configured.
With max_tiles 1 this is one full-size image per sample. Its ends: one full-size encoder sample per image
(low) and max_tiles tiles plus the thumbnail (high).

Packed rows (trainer.data.packing): a row of seq_length tokens carries seq_length / (text + image tokens
of a sample) samples (at least one; full rows, an upper bound of what first-fit packing reaches,
mimo_jobs/data/packing.py), each with its images, so a row's image tokens scale with that count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mimo_jobs.model.tiling import ImageGeometry, grids

# Text tokens per sample the prior assumes (a question and a short answer in a chat template): only packing
# reads it, to count the samples a row carries. An assumption, not a measurement: `data stats` measures it.
PRIOR_TEXT_TOKENS = 128


@dataclass(frozen=True)
class SampleMix:
    """Per dataset sample: mean image tokens, E[n^2]/E[n] over encoder samples, most image tokens."""

    image_tokens_mean: float
    tokens_per_image: float
    image_tokens_max: int
    tiles_mean: float = 1.0  # encoder samples per image


def prior_images(geom: ImageGeometry) -> list[tuple[int, int]]:
    """The prior's images, (h, w) in pixels: one per grid InternVL may choose, filling that grid."""
    t = geom.tile
    return [(r * t, c * t) for c, r in grids(geom.max_tiles)]


def mix_of_images(geom: ImageGeometry, images: list[tuple[int, int]], limit: int | None = None) -> SampleMix:
    """The SampleMix of equally likely images (one per sample), by the tiling rule; a sample's tokens at
    most `limit` (its row's seq_length: the loader never hands over a longer sample)."""
    plans = [geom.plan(h, w) for h, w in images]
    tokens = [p.tokens if limit is None else min(p.tokens, limit) for p in plans]
    squares = sum(p.tiles * p.tokens_per_piece**2 for p in plans)
    return SampleMix(
        sum(tokens) / len(tokens),
        squares / sum(p.tokens for p in plans),
        max(tokens),
        sum(p.tiles for p in plans) / len(plans),
    )


def prior_mix(geom: ImageGeometry, limit: int | None = None) -> SampleMix:
    return mix_of_images(geom, prior_images(geom), limit)


def prior_ends(geom: ImageGeometry, limit: int | None = None) -> tuple[SampleMix, SampleMix]:
    """(low, high): every image one full-size encoder sample; every image max_tiles tiles (+ thumbnail);
    a sample's tokens at most `limit`."""
    t = geom.tile
    return mix_of_images(geom, [(t, t)], limit), mix_of_images(geom, [(geom.max_tiles * t, t)], limit)


def samples_per_row(seq_length: int, text_tokens: float, image_tokens: float) -> float:
    """Samples a packed row of seq_length carries: full rows of whole samples, at least one."""
    per_sample = text_tokens + image_tokens
    return max(1.0, seq_length / per_sample) if per_sample > 0 else 1.0


def packed(mix: SampleMix, seq_length: int, text_tokens: float) -> SampleMix:
    """`mix` per packed row: the mean scaled by the samples a row carries; the most image tokens of a row,
    as many of the largest samples as fit, at least one and at least the mean; neither more than the row's
    seq_length (a longer sample is cut or skipped by the loader, never packed)."""
    k = samples_per_row(seq_length, text_tokens, mix.image_tokens_mean)
    mean = k * mix.image_tokens_mean
    fit = max(1, math.floor(seq_length / (text_tokens + mix.image_tokens_max))) if mix.image_tokens_max else 1
    most = max(fit * mix.image_tokens_max, math.ceil(mean))
    return SampleMix(min(mean, seq_length), mix.tokens_per_image, min(most, seq_length), mix.tiles_mean)

"""The tokens the planner prices per sample: the one rule that turns a study's data into image and text
tokens (FLOPs and time from the means, memory from the maximum), and says where they came from.

- mock provider: its image sizes (never larger than the encoder's image size, so never tiled) and its
  text-only share, exactly;
- energon with statistics (`trainer.data.stats`, or the file `mimo-jobs data stats` writes beside
  `trainer.data.path`): the dataset's measured per-sample image tokens (after tiling and the pixel shuffle),
  E[n^2]/E[n] over its encoder samples, and its text tokens. A named file of another image geometry is
  refused when the study is read (spec.DataSpec); here (a report reading run.yaml, the file gone or changed
  since) unusable statistics are passed over, saying so;
- otherwise (energon without statistics, or data unknown): the stated prior of prior.py (one image per
  sample, its tiling grid equally likely to be each one InternVL may choose; with max_tiles 1 one full-size
  image), marked `assumed`, with its low and high ends (one full-size encoder sample per image; max_tiles
  tiles plus the thumbnail) for the verdicts that depend on it (assumed.py).

Packed rows (trainer.data.packing) carry several samples, each with its images: statistics and the prior
are scaled by the samples a row of seq_length holds (prior.packed), from the measured text tokens or the
prior's.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from mimo_jobs.contract.datastats import DataStats, StatsFileError, read_stats, stats_file_for
from mimo_jobs.model.arch import EncoderArch
from mimo_jobs.model.tiling import ImageGeometry, grids

from .prior import PRIOR_TEXT_TOKENS, SampleMix, packed, prior_ends, prior_mix, samples_per_row


@dataclass(frozen=True)
class DataMix:
    image_tokens_mean: float  # LLM image tokens per sample, on average (FLOPs, time)
    tokens_per_image: float  # E[n^2]/E[n] over encoder samples (images or tiles): the attention core's mix
    image_tokens_max: int  # LLM image tokens of one sample at most (memory)
    source: str  # which data the figures come from, in words
    text_tokens_mean: float | None = None  # measured text tokens per sample, per row when packed (statistics)
    text_tokens_max: int | None = None
    assumed: bool = False  # the figures come from the stated prior, not from the data
    ends: tuple[DataMix, DataMix] | None = None  # the prior's low and high ends (assumed only)

    @property
    def range(self) -> tuple[float, float] | None:
        """Mean image tokens per sample (per row when packed) at the prior's low and high ends."""
        return None if self.ends is None else (self.ends[0].image_tokens_mean, self.ends[1].image_tokens_mean)


@lru_cache(maxsize=64)
def _read(path: str, mtime_ns: int) -> DataStats:
    return read_stats(path)


def stats_at(path: Path) -> DataStats:
    """The statistics file at `path`, read once per change of it."""
    try:
        mtime = path.stat().st_mtime_ns
    except OSError:
        return read_stats(path)  # raises, naming the file
    return _read(str(path), mtime)


def from_stats(st: DataStats, packing_at: int | None = None) -> DataMix:
    """The statistics' mix; per packed row of `packing_at` tokens when given."""
    mix = SampleMix(st.image_tokens_mean, st.tokens_per_tile, st.image_tokens_max)
    source = f"dataset statistics {st.path} ({st.samples} samples)"
    text = st.text_tokens_mean
    if packing_at:
        rows = packed(mix, packing_at, st.text_tokens_mean)
        source += _packed_words(mix, rows, packing_at, st.text_tokens_mean, "measured")
        # the row's text: its samples' (as many samples as bring their images)
        text = min(text * samples_per_row(packing_at, text, mix.image_tokens_mean), packing_at)
        mix = rows
    return DataMix(
        image_tokens_mean=mix.image_tokens_mean,
        tokens_per_image=mix.tokens_per_image,
        image_tokens_max=mix.image_tokens_max,
        source=source,
        text_tokens_mean=text,
        text_tokens_max=st.text_tokens_max,
    )


def _packed_words(per_sample: SampleMix, rows: SampleMix, seq_length: int, text: float, how: str) -> str:
    k = rows.image_tokens_mean / per_sample.image_tokens_mean if per_sample.image_tokens_mean else 1.0
    return f"; packed: {k:.3g} samples per row of {seq_length} ({text:.0f} text tokens a sample, {how})"


def _mix(m: SampleMix, source: str, **kw) -> DataMix:
    return DataMix(m.image_tokens_mean, m.tokens_per_image, m.image_tokens_max, source, **kw)


def assumed_mix(
    geom: ImageGeometry, seq_length: int | None = None, packing: bool = False, note: str = ""
) -> DataMix:
    """The prior's mix (prior.py), marked assumed, with its two ends; a sample at most a row of
    `seq_length`, and per packed row when `packing`."""
    mean, (low, high) = prior_mix(geom, seq_length), prior_ends(geom, seq_length)
    if geom.max_tiles > 1:
        thumb = " + thumbnail" if geom.thumbnail else ""
        words = (
            f"one image per sample, its tiling grid equally likely to be each of the "
            f"{len(grids(geom.max_tiles))} grids up to max_tiles {geom.max_tiles}{thumb} "
            f"({mean.tiles_mean:.3g} encoder samples, {mean.image_tokens_mean:.0f} image tokens a sample)"
        )
    else:
        words = "one full-size image per sample"
    source = f"assumed: {words} (no dataset statistics)"
    if packing and seq_length:
        rows = [packed(m, seq_length, PRIOR_TEXT_TOKENS) for m in (mean, low, high)]
        source += _packed_words(mean, rows[0], seq_length, PRIOR_TEXT_TOKENS, "assumed")
        mean, low, high = rows
    ends = (_mix(low, "assumed: low end", assumed=True), _mix(high, "assumed: high end", assumed=True))
    return _mix(mean, source + note, assumed=True, ends=ends)


def _mock_mix(data, enc: EncoderArch) -> DataMix:
    """The mock provider's pictures (data/mock.py draws them): a side drawn evenly from `image_sizes`, and a
    share `video_fraction` of them a video of a frame count drawn evenly from `video_frames`, which the
    encoder embeds as one sample of one image's tokens per temporal group."""
    sizes = list(data.image_sizes) or [enc.image_size]
    share = float(getattr(data, "video_fraction", 0.0) or 0.0)
    frames = list(getattr(data, "video_frames", ()) or ())
    if not share or not frames:
        ns = [enc.tokens_for(s, s) for s in sizes]
        mean_n = sum(ns) / len(ns)
        per_image = sum(n * n for n in ns) / sum(ns) if sum(ns) else 0.0
        return DataMix(
            (1 - data.text_only_fraction) * mean_n, per_image, max(ns), "the mock provider's images"
        )
    kinds = [(1 - share, 0)] + [(share / len(frames), f) for f in frames]
    ns = [
        (w / len(sizes), enc.video_tokens(f, s, s) if f else enc.tokens_for(s, s))
        for w, f in kinds
        for s in sizes
    ]
    mean_n = sum(w * n for w, n in ns)
    per_image = sum(w * n * n for w, n in ns) / mean_n if mean_n else 0.0
    words = f"the mock provider's images and videos ({share:g} of them)"
    return DataMix((1 - data.text_only_fraction) * mean_n, per_image, max(n for _, n in ns), words)


def data_mix(data, enc: EncoderArch, seq_length: int | None = None) -> DataMix:
    """The DataMix of a study's trainer.data (spec.DataSpec; None: unknown); packed rows are priced per row
    of `seq_length` tokens (given by every caller that prices a run)."""
    if data is not None and getattr(data, "provider", "mock") == "mock":
        return _mock_mix(data, enc)
    geom = ImageGeometry.of(enc, getattr(data, "max_tiles", 1), getattr(data, "thumbnail", False))
    packing_at = seq_length if getattr(data, "packing", False) else None
    note = ""
    named = bool(data is not None and data.stats)
    path = (
        Path(data.stats) if named else stats_file_for(data.path) if data is not None and data.path else None
    )
    if path is not None and (named or path.is_file()):
        try:
            st = stats_at(path)
            problem = st.geometry_problem(geom)
        except StatsFileError as e:
            problem = str(e)
        if not problem:
            return from_stats(st, packing_at)
        note = f"; passed over {path}: {problem}"
    return assumed_mix(geom, seq_length, bool(packing_at), note)

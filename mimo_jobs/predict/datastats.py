"""The tokens the planner prices per sample: the one rule that turns a study's data into image and text
tokens (FLOPs and time from the means, memory from the maximum), and says where they came from.

- mock provider: its image sizes (never larger than the encoder's image size, so never tiled) and its
  text-only share, exactly;
- energon with statistics (`trainer.data.stats`, or the file `mimo-jobs data stats` writes beside
  `trainer.data.path`): the dataset's measured per-sample image tokens (after tiling and the pixel shuffle),
  E[n^2]/E[n] over its encoder samples, and its text tokens. A named file of another image geometry is
  refused when the study is read (spec.DataSpec); here (a report reading run.yaml, the file gone or changed
  since) unusable statistics are passed over, saying so;
- otherwise (energon without statistics, or data unknown): one full-size image per sample for time, and for
  memory the largest image the tiling allows (max_tiles tiles, plus the thumbnail).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from mimo_jobs.contract.datastats import DataStats, StatsFileError, read_stats, stats_file_for
from mimo_jobs.model.arch import EncoderArch
from mimo_jobs.model.tiling import ImageGeometry


@dataclass(frozen=True)
class DataMix:
    image_tokens_mean: float  # LLM image tokens per sample, on average (FLOPs, time)
    tokens_per_image: float  # E[n^2]/E[n] over encoder samples (images or tiles): the attention core's mix
    image_tokens_max: int  # LLM image tokens of one sample at most (memory)
    source: str  # which data the figures come from, in words
    text_tokens_mean: float | None = None  # measured text tokens per sample (statistics only)
    text_tokens_max: int | None = None


@lru_cache(maxsize=64)
def _read(path: str, mtime_ns: int) -> DataStats:
    return read_stats(path)


def _stats(path: Path) -> DataStats:
    try:
        mtime = path.stat().st_mtime_ns
    except OSError:
        return read_stats(path)  # raises, naming the file
    return _read(str(path), mtime)


def from_stats(st: DataStats) -> DataMix:
    return DataMix(
        image_tokens_mean=st.image_tokens_mean,
        tokens_per_image=st.tokens_per_tile,
        image_tokens_max=st.image_tokens_max,
        source=f"dataset statistics {st.path} ({st.samples} samples)",
        text_tokens_mean=st.text_tokens_mean,
        text_tokens_max=st.text_tokens_max,
    )


def data_mix(data, enc: EncoderArch) -> DataMix:
    """The DataMix of a study's trainer.data (spec.DataSpec; None: unknown)."""
    if data is not None and getattr(data, "provider", "mock") == "mock":
        sizes = list(data.image_sizes) or [enc.image_size]
        ns = [enc.tokens_for(s, s) for s in sizes]
        mean_n = sum(ns) / len(ns)
        per_image = sum(n * n for n in ns) / sum(ns) if sum(ns) else 0.0
        return DataMix(
            (1 - data.text_only_fraction) * mean_n, per_image, max(ns), "the mock provider's images"
        )
    geom = ImageGeometry.of(enc, getattr(data, "max_tiles", 1), getattr(data, "thumbnail", False))
    note = ""
    named = bool(data is not None and data.stats)
    path = (
        Path(data.stats) if named else stats_file_for(data.path) if data is not None and data.path else None
    )
    if path is not None and (named or path.is_file()):
        try:
            st = _stats(path)
            problem = st.geometry_problem(geom)
        except StatsFileError as e:
            problem = str(e)
        if not problem:
            return from_stats(st)
        note = f"; passed over {path}: {problem}"
    full = geom.tile_tokens
    return DataMix(
        float(full),
        float(full),
        geom.max_tokens,
        "one full-size image per sample (no dataset statistics)" + note,
    )

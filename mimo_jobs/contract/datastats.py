"""The dataset statistics file: `mimo-jobs data stats` writes it (mimo_jobs.data.stats), the planner reads it
(mimo_jobs.predict.datastats) to price a study's real image and text tokens. Torch-free and pure but for
reading the file.

Where it lives by default: beside a blend YAML (`<stem>.stats.json`) or inside a dataset folder
(`stats.json`). What the planner reads: the per-sample image tokens (after tiling and the pixel shuffle)
and text tokens (mean, p99, max), the encoder samples (tiles) per sample, E[n^2]/E[n] over encoder samples
(n their tokens: what prices the encoder's attention), and the image geometry the counts hold for (the
encoder's patch, image size and downsample, and the tiling settings): counts made with another geometry
price nothing.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mimo_jobs.errors import MimoJobsError

STATS_FORMAT = 2
# what decides an image's tokens: the fields of mimo_jobs.model.tiling.ImageGeometry the counts depend on
GEOMETRY_FIELDS = ("patch_size", "image_size", "downsample", "max_tiles", "thumbnail")


class StatsFileError(MimoJobsError, ValueError):
    pass


def stats_file_for(data_path: str | Path) -> Path:
    """Where `data stats` writes a dataset's statistics by default, and where the planner looks for them."""
    p = Path(data_path)
    return p.with_suffix(".stats.json") if p.suffix in (".yaml", ".yml") or p.is_file() else p / "stats.json"


def geometry_record(geometry: Any) -> dict:
    """The fields of an image geometry that decide token counts, as the file records them."""
    return {f: getattr(geometry, f) for f in GEOMETRY_FIELDS}


@dataclass(frozen=True)
class ModuleStats:
    """One encoder module's counts (the file's `modules: {name: ...}` map): the items it encodes per sample
    (images, clips) and the tokens a sample's items hand the LLM."""

    items_mean: float
    tokens_mean: float
    tokens_max: int


@dataclass(frozen=True)
class DataStats:
    path: str
    samples: int
    image_tokens_mean: float
    image_tokens_p99: int
    image_tokens_max: int
    text_tokens_mean: float
    text_tokens_max: int
    tiles_mean: float  # encoder samples per sample
    tiles_max: int
    tokens_per_tile: float  # E[n^2]/E[n] over encoder samples
    geometry: dict
    # audio (absent from a file of image data alone: zeros): tokens a sample's clips hand the LLM, and clips
    audio_tokens_mean: float = 0.0
    audio_tokens_max: int = 0
    audio_clips_mean: float = 0.0
    modules: dict = field(default_factory=dict)  # module name -> ModuleStats (a per-module file)

    def geometry_problem(self, geometry: Any) -> str | None:
        """Why these counts do not hold for `geometry` (None: they do)."""
        want = geometry_record(geometry)
        diff = [
            f"{k} {self.geometry.get(k)!r} (the study's: {v!r})"
            for k, v in want.items()
            if self.geometry.get(k) != v
        ]
        if not diff:
            return None
        return (
            f"{self.path} was measured with another image geometry: {', '.join(diff)}; rerun `mimo-jobs data "
            "stats --study STUDY.yaml` (or with the study's --model, --max-tiles and --thumbnail)"
        )


def _number(doc: dict, path: str, what: type, where: str) -> Any:
    cur: Any = doc
    for part in path.split("."):
        if not isinstance(cur, dict) or part not in cur:
            raise StatsFileError(
                f"{where}: field {path!r} is missing (a `mimo-jobs data stats` JSON file has it)"
            )
        cur = cur[part]
    ok = isinstance(cur, (int, float)) and not isinstance(cur, bool) and math.isfinite(cur) and cur >= 0
    if not ok or (what is int and cur != int(cur)):
        raise StatsFileError(f"{where}: field {path!r} is {cur!r}; expected a non-negative {what.__name__}")
    return what(cur)


def parse_stats(doc: Any, where: str) -> DataStats:
    """The planner's view of a stats document; StatsFileError naming the file and field otherwise."""
    if not isinstance(doc, dict):
        raise StatsFileError(
            f"{where}: not a statistics document (a JSON object written by `mimo-jobs data stats`)"
        )
    if doc.get("format") != STATS_FORMAT:
        raise StatsFileError(
            f"{where}: format {doc.get('format')!r}, this version reads format {STATS_FORMAT}; rerun "
            "`mimo-jobs data stats`"
        )
    geom = doc.get("geometry")
    if not isinstance(geom, dict) or set(GEOMETRY_FIELDS) - set(geom):
        raise StatsFileError(f"{where}: field 'geometry' must hold {', '.join(GEOMETRY_FIELDS)}")
    samples = _number(doc, "samples", int, where)
    if samples < 1:
        raise StatsFileError(f"{where}: field 'samples' is 0; statistics of no sample price nothing")
    return DataStats(
        path=where,
        samples=samples,
        image_tokens_mean=_number(doc, "image_tokens.mean", float, where),
        image_tokens_p99=_number(doc, "image_tokens.p99", int, where),
        image_tokens_max=_number(doc, "image_tokens.max", int, where),
        text_tokens_mean=_number(doc, "text_tokens.mean", float, where),
        text_tokens_max=_number(doc, "text_tokens.max", int, where),
        tiles_mean=_number(doc, "tiles.mean", float, where),
        tiles_max=_number(doc, "tiles.max", int, where),
        tokens_per_tile=_number(doc, "tokens_per_tile", float, where),
        geometry={k: geom[k] for k in GEOMETRY_FIELDS},
        **_audio(doc, where),
        modules=_modules(doc, where),
    )


def _items_mean(items: Any, where: str) -> float:
    """Items per sample: a number, or a map of item counts to sample counts ({"0": 10, "1": 90})."""
    if isinstance(items, dict) and all(
        k.isdigit() and isinstance(v, int) and not isinstance(v, bool) and v >= 0 for k, v in items.items()
    ):
        n = sum(items.values())
        return sum(int(k) * v for k, v in items.items()) / n if n else 0.0
    return _number({"items": items}, "items", float, where)


def _modules(doc: dict, where: str) -> dict:
    """The per-module counts (none: a file written before they were per module)."""
    mods = doc.get("modules")
    if mods is None:
        return {}
    if not isinstance(mods, dict) or not all(isinstance(v, dict) for v in mods.values()):
        raise StatsFileError(
            f"{where}: field 'modules' must map module names to their counts, e.g. "
            '{"audio": {"items": 0.5, "tokens": {"mean": 75, "max": 150}}}'
        )
    out = {}
    for name, m in mods.items():
        at = f"{where}: modules.{name}"
        if "items" not in m:
            raise StatsFileError(f"{at}: field 'items' is missing (items per sample, or counts of samples)")
        out[name] = ModuleStats(
            _items_mean(m["items"], at),
            _number(m, "tokens.mean", float, at),
            _number(m, "tokens.max", int, at),
        )
    return out


def _audio(doc: dict, where: str) -> dict:
    """The audio fields of a stats document (none: an older file, or data without audio)."""
    if "audio_tokens" not in doc:
        return {}
    clips = doc.get("audio_clips_per_sample")
    if not isinstance(clips, dict) or not all(
        k.isdigit() and isinstance(v, int) and not isinstance(v, bool) and v >= 0 for k, v in clips.items()
    ):
        raise StatsFileError(
            f"{where}: field 'audio_clips_per_sample' must map clip counts to sample counts, e.g. "
            '{"0": 10, "1": 90}'
        )
    n = sum(clips.values())
    return {
        "audio_tokens_mean": _number(doc, "audio_tokens.mean", float, where),
        "audio_tokens_max": _number(doc, "audio_tokens.max", int, where),
        "audio_clips_mean": sum(int(k) * v for k, v in clips.items()) / n if n else 0.0,
    }


def read_stats(path: str | Path) -> DataStats:
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise StatsFileError(f"{p}: no such statistics file (write it with `mimo-jobs data stats`)") from None
    except OSError as e:
        raise StatsFileError(f"{p}: cannot read it ({e.strerror})") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise StatsFileError(f"{p}: not JSON ({e.msg} at line {e.lineno})") from None
    return parse_stats(doc, str(p))

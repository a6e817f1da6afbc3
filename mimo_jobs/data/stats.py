"""Token statistics of a dataset (pure): per-sample counts in, the summary the planner and people read out.

Per sample: image tokens (after tiling and the encoder's pixel shuffle: what the LLM reads; a video's
tokens are the image module's too, and counted apart as video tokens), audio tokens
(the audio encoder's token rule over each clip's frames), text tokens (everything else the LLM reads:
template, prompt, answer, BOS/EOS), images, audio clips, and the encoder samples the images make (tiles, a
thumbnail included; an untiled image is one). Summary: count, mean, percentiles and maximum
of each, E[n^2]/E[n] over encoder samples (n their tokens: the planner prices the encoder's attention
with it), the images-per-sample and clips-per-sample histograms, a histogram of sequence lengths, and the packing efficiency at a seq_length:
the share of the LLM's token slots holding real tokens when every sample is padded to seq_length, and when
samples are packed first-fit-decreasing into sequences of seq_length (an upper bound of what a packing
loader with a large buffer reaches).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from mimo_jobs.contract.datastats import STATS_FORMAT

PERCENTILES = (50, 90, 95, 99)


@dataclass(frozen=True)
class SampleStat:
    key: str
    image_tokens: int
    text_tokens: int
    images: int
    tiles: int = 0  # encoder samples of the sample's images
    tile_tokens_sq: int = 0  # sum over those encoder samples of their tokens squared
    audio_tokens: int = 0  # all its audio clips' placeholder tokens
    audio_clips: int = 0
    videos: int = 0  # its videos (each one encoder sample of the image module; `images` counts stills)
    video_tokens: int = 0  # its videos' placeholder tokens (part of image_tokens: the image module's)

    @property
    def tokens(self) -> int:
        return self.image_tokens + self.audio_tokens + self.text_tokens


def percentile(sorted_values: list[int], q: float) -> int:
    """Nearest-rank percentile (a value that occurs: token counts stay integers)."""
    if not sorted_values:
        return 0
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def describe_values(values: list[int]) -> dict:
    v = sorted(values)
    out = {"mean": (sum(v) / len(v)) if v else 0.0, "min": v[0] if v else 0, "max": v[-1] if v else 0}
    out.update({f"p{q}": percentile(v, q) for q in PERCENTILES})
    return out


def pack_first_fit(lengths: list[int], seq_length: int) -> int:
    """Sequences of seq_length that hold all samples, packed first-fit-decreasing (samples longer than
    seq_length take one sequence each: they do not fit either way)."""
    free: list[int] = []
    for n in sorted(lengths, reverse=True):
        n = min(n, seq_length)
        for i, f in enumerate(free):
            if f >= n:
                free[i] = f - n
                break
        else:
            free.append(seq_length - n)
    return len(free)


def histogram(values: list[int], bins: int = 10) -> list[dict]:
    """Equal-width bins over [min, max]: [{lo, hi, count}], hi inclusive on the last bin."""
    if not values:
        return []
    lo, hi = min(values), max(values)
    width = max(1, math.ceil((hi - lo + 1) / bins))
    counts: dict[int, int] = {}
    for x in values:
        b = (x - lo) // width
        counts[b] = counts.get(b, 0) + 1
    return [
        {"lo": lo + b * width, "hi": lo + (b + 1) * width - 1, "count": counts.get(b, 0)}
        for b in range(max(counts) + 1)
    ]


def tokens_per_tile(samples: list[SampleStat]) -> float:
    """E[n^2]/E[n] over all encoder samples of the dataset (n: an encoder sample's tokens)."""
    n = sum(s.image_tokens for s in samples)
    return sum(s.tile_tokens_sq for s in samples) / n if n else 0.0


def module_summary(samples: list[SampleStat], modality: str, seq_length: int) -> dict:
    """One encoder module's share of the dataset: its items (images, or audio clips) and the LLM tokens they
    become, per sample, and the share of the LLM's real token slots they fill (the packing figures of the
    whole sequence are the summary's)."""
    items = [s.images + s.videos if modality == "image" else s.audio_clips for s in samples]
    tokens = [s.image_tokens if modality == "image" else s.audio_tokens for s in samples]
    total = sum(min(s.tokens, seq_length) for s in samples)
    per: dict[int, int] = {}
    for n in items:
        per[n] = per.get(n, 0) + 1
    out = {
        "modality": modality,
        "items": sum(items),
        "samples_with": sum(1 for n in items if n),
        "items_per_sample": {str(k): v for k, v in sorted(per.items())},
        "tokens": describe_values(tokens),
        "token_share": sum(tokens) / total if total else 0.0,
    }
    if modality == "image":
        out["tiles"] = describe_values([s.tiles for s in samples])
        out["tokens_per_tile"] = tokens_per_tile(samples)
    return out


def _modules(samples: list[SampleStat], modules: dict[str, str], seq_length: int) -> dict:
    first: dict[str, str] = {}  # modality -> the module its items go to (the first of that modality)
    out = {}
    for name, modality in modules.items():
        if modality in first:
            out[name] = {"modality": modality, "items": 0, "samples_with": 0, "items_go_to": first[modality]}
            continue
        first[modality] = name
        out[name] = module_summary(samples, modality, seq_length)
    return out


def summarize(
    samples: list[SampleStat], seq_length: int, skipped: int = 0, modules: dict[str, str] | None = None
) -> dict:
    """The summary; `modules` (encoder module name -> its modality, in the model's order) adds `modules`:
    each one's module_summary (a second module of one modality counts nothing: the data routes those items to the first, named in
    its `items_go_to`)."""
    if seq_length < 1:
        raise ValueError(f"seq_length={seq_length}: must be >= 1")
    lengths = [s.tokens for s in samples]
    total = sum(min(n, seq_length) for n in lengths)
    packed = pack_first_fit(lengths, seq_length)
    per_image: dict[int, int] = {}
    per_clip: dict[int, int] = {}
    per_video: dict[int, int] = {}
    for s in samples:
        per_image[s.images] = per_image.get(s.images, 0) + 1
        per_clip[s.audio_clips] = per_clip.get(s.audio_clips, 0) + 1
        per_video[s.videos] = per_video.get(s.videos, 0) + 1
    return {
        "format": STATS_FORMAT,
        "samples": len(samples),
        "skipped": skipped,
        "seq_length": seq_length,
        "over_seq_length": sum(1 for n in lengths if n > seq_length),
        "image_tokens": describe_values([s.image_tokens for s in samples]),
        "text_tokens": describe_values([s.text_tokens for s in samples]),
        "tiles": describe_values([s.tiles for s in samples]),
        "tokens_per_tile": tokens_per_tile(samples),
        "tokens": describe_values(lengths),
        "images_per_sample": {str(k): v for k, v in sorted(per_image.items())},
        "audio_tokens": describe_values([s.audio_tokens for s in samples]),
        "audio_clips_per_sample": {str(k): v for k, v in sorted(per_clip.items())},
        **(
            {
                "video_tokens": describe_values([s.video_tokens for s in samples]),
                "videos_per_sample": {str(k): v for k, v in sorted(per_video.items())},
            }
            if any(s.videos for s in samples)
            else {}
        ),
        "packing": {
            "padded_efficiency": total / (len(samples) * seq_length) if samples else 0.0,
            "packed_sequences": packed,
            "packed_efficiency": total / (packed * seq_length) if packed else 0.0,
        },
        "tokens_histogram": histogram(lengths),
        **({"modules": _modules(samples, modules, seq_length)} if modules else {}),
        "per_sample": [asdict(s) for s in samples],
    }

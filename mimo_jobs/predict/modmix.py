"""The tokens each encoder module hands the LLM per sample (the planner prices every model module by module:
one encoder is a model of one module): one ModuleMix per module, and the one rule of its training FLOPs per
sample.

- an image module: datastats.data_mix's rule (the mock provider's images, dataset statistics, or the stated
  prior of prior.py);
- an audio module (model/audio_arch.py): dataset statistics (the module's own entry of the file's
  `modules:` map when it has one, else `audio_tokens` and `audio_clips_per_sample` of the file
  `mimo-jobs data stats` writes) give the tokens per sample and the clips per sample; the clips
  are priced as clips of one length, the mean tokens per clip turned back into mel frames by the module's
  token rule. The mock provider's mix is the study's own (`audio_fraction` of the samples carry one clip, its
  length drawn evenly from `audio_frames`), priced the same way. Without either (energon data with no
  statistics) the stated prior AUDIO_PRIOR: one full-length clip (max_frames mel frames, Whisper's 30 s)
  per sample, marked assumed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mimo_jobs.contract.datastats import StatsFileError, stats_file_for
from mimo_jobs.model.arch import ModelArch
from mimo_jobs.model.audio_arch import input_stride

from .datastats import DataMix, data_mix, stats_at
from .flops import SampleFlops, audio_clip_flops, encoder_flops_per_token, llm_flops_per_sample

AUDIO_PRIOR = "one full-length clip per sample"


@dataclass(frozen=True)
class ModuleMix:
    """What one encoder module sees per sample (per packed row when the data packs)."""

    name: str
    modality: str  # the architecture's: "image" | "audio"
    tokens_mean: float  # tokens it hands the LLM per sample, on average (FLOPs, time)
    tokens_per_item: float  # images: E[n^2]/E[n] per encoder sample; audio: tokens of the priced clip
    tokens_max: int  # tokens per sample at most (memory)
    source: str  # which data the figures come from, in words
    assumed: bool = False  # the stated prior, not the data
    items_mean: float = 0.0  # audio: clips per sample
    frames: int = 0  # audio: mel frames of the priced clip
    # images: the text tokens per sample (per row when packed) the data's statistics measure, else None
    text_tokens_mean: float | None = None
    # images priced by the stated prior (prior.py): this module at the prior's low and high ends, else None
    ends: tuple[ModuleMix, ModuleMix] | None = None

    @property
    def max_items(self) -> int:
        """Audio: whole clips of `frames` that hold tokens_max tokens."""
        return -(-self.tokens_max // self.tokens_per_item) if self.tokens_per_item else 0


def frames_for_tokens(a, tokens: float) -> int:
    """The mel frames of a clip that hands the LLM `tokens` tokens (at least one, at most a full clip): the
    inverse of AudioArch.tokens_for_frames, rounded to whole frames."""
    frames = round(max(1.0, tokens) * a.pooling * input_stride())
    return int(min(max(frames, a.min_frames), a.max_frames))


def mock_audio_mix(name: str, a, data) -> ModuleMix | None:
    """The mock provider's audio mix (data/mock.py draws it): `audio_fraction` of the samples carry one clip
    of a length drawn evenly from `audio_frames`; None when the study states no clip."""
    if data is None or getattr(data, "provider", "mock") != "mock":
        return None
    fraction, lengths = float(data.audio_fraction or 0.0), list(data.audio_frames or ())
    if not fraction or not lengths:
        return None
    tokens = [a.tokens_for_frames(f) for f in lengths]
    per_clip = sum(tokens) / len(tokens)
    frames = frames_for_tokens(a, per_clip)
    return ModuleMix(
        name,
        "audio",
        fraction * per_clip,
        float(a.tokens_for_frames(frames)),
        max(tokens),
        f"the mock provider's clips ({fraction:g} of the samples, {', '.join(map(str, lengths))} mel frames: "
        f"{per_clip:.4g} tokens a clip)",
        items_mean=fraction,
        frames=frames,
    )


def audio_mix(name: str, a, data) -> ModuleMix:
    """An audio module's mix: dataset statistics when the study's data has them, the mock provider's stated
    clips, else the stated prior."""
    mock = mock_audio_mix(name, a, data)
    if mock is not None:
        return mock
    path = None
    if data is not None and getattr(data, "provider", "mock") != "mock":
        named = bool(data.stats)
        path = Path(data.stats) if named else stats_file_for(data.path) if data.path else None
        if path is not None and not (named or path.is_file()):
            path = None
    note = ""
    if path is not None:
        try:
            st = stats_at(path)
        except StatsFileError as e:
            st, note = None, f"; passed over {path}: {e}"
        own = st.modules.get(name) if st is not None else None
        clips, tokens_mean, tokens_max, which = (
            (own.items_mean, own.tokens_mean, own.tokens_max, f" module {name!r}")
            if own is not None
            else (st.audio_clips_mean, st.audio_tokens_mean, st.audio_tokens_max, "")
            if st is not None
            else (0.0, 0.0, 0, "")
        )
        if clips > 0:
            per_clip = tokens_mean / clips
            frames = frames_for_tokens(a, per_clip)
            return ModuleMix(
                name,
                "audio",
                tokens_mean,
                float(a.tokens_for_frames(frames)),
                tokens_max,
                f"dataset statistics {st.path}{which} ({st.samples} samples, {clips:.3g} clips a sample of "
                f"{frames} mel frames)",
                items_mean=clips,
                frames=frames,
            )
        if st is not None:
            note = f"; passed over {path}: it counts no audio clip"
    full = a.tokens_for_frames(a.max_frames)
    return ModuleMix(
        name,
        "audio",
        float(full),
        float(full),
        full,
        f"assumed: {AUDIO_PRIOR} ({a.max_frames} mel frames, {full} tokens; no dataset statistics){note}",
        assumed=True,
        items_mean=1.0,
        frames=a.max_frames,
    )


def module_mixes(data, preset: ModelArch, seq_length: int) -> tuple[ModuleMix, ...]:
    """Each encoder module's mix, in rank order (none for a text-only model)."""
    out = []
    for name, a in preset.named_encoders:
        if a.modality == "audio":
            out.append(audio_mix(name, a, data))
            continue
        out.append(image_mix(name, data_mix(data, a, seq_length)))
    return tuple(out)


def image_mix(name: str, m: DataMix) -> ModuleMix:
    """An image module's mix from datastats.data_mix's (its prior's ends too, when assumed)."""
    ends = (image_mix(name, m.ends[0]), image_mix(name, m.ends[1])) if m.assumed and m.ends else None
    return ModuleMix(
        name,
        "image",
        m.image_tokens_mean,
        m.tokens_per_image,
        m.image_tokens_max,
        m.source,
        m.assumed,
        text_tokens_mean=m.text_tokens_mean,
        ends=ends,
    )


def module_flops(a, mix: ModuleMix, llm_hidden: int) -> float:
    """Training FLOPs of one sample through one encoder module and its projector (flops.py's formulas)."""
    if a.modality == "audio":
        return mix.items_mean * audio_clip_flops(a, llm_hidden, mix.frames) if mix.frames else 0.0
    return mix.tokens_mean * encoder_flops_per_token(a, llm_hidden, mix.tokens_per_item)


def sample_flops_by_module(preset: ModelArch, mixes: tuple, seq_length: int) -> tuple[dict, SampleFlops]:
    """(module name -> its training FLOPs per sample, the sample's SampleFlops: every encoder module's
    together, and the LLM's over seq_length tokens)."""
    hl = preset.llm.hidden_size
    per = {n: module_flops(a, m, hl) for (n, a), m in zip(preset.named_encoders, mixes)}
    return per, SampleFlops(sum(per.values(), 0.0), llm_flops_per_sample(preset.llm, seq_length))

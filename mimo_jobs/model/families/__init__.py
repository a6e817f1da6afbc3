"""Model families: one module per HuggingFace family (or a group of near-identical ones), each the one
owner of that family's facts (families/base.py says what a family holds). This package answers look-ups:
by name, and by a config.json's `architectures` (or `model_type` when it has none), refusing the families
the trainer cannot build by the feature that stops them.

Adding a family is one module in this package (found here by walking the package, registered by its
`@register` class) plus its tests.
"""

from __future__ import annotations

import importlib
import pkgutil

from mimo_jobs.model.arch import ArchError
from mimo_jobs.model.families.base import REGISTRY, Family, Pixels

__all__ = [
    "REGISTRY",
    "Family",
    "Pixels",
    "audio",
    "audio_of",
    "by_name",
    "of_config",
    "of_modality",
    "vision",
]

# the package's modules that hold no family
_ENGINES = {"base", "vit", "decoder", "docs"}

# Families the trainer cannot build, by the feature that stops them.
REFUSED = {
    "deepseek_v2": "multi-head latent attention (MLA)",
    "deepseek_v3": "multi-head latent attention (MLA)",
    "mamba": "Mamba layers",
    "mamba2": "Mamba layers",
    "jamba": "Mamba layers",
    "nemotron_h": "Mamba layers",
    "falcon_h1": "Mamba layers",
    "zamba": "Mamba layers",
    "zamba2": "Mamba layers",
}
REFUSED_ARCHITECTURES = {
    "DeepseekV2ForCausalLM": "deepseek_v2",
    "DeepseekV3ForCausalLM": "deepseek_v3",
    "MambaForCausalLM": "mamba",
    "Mamba2ForCausalLM": "mamba2",
    "JambaForCausalLM": "jamba",
    "NemotronHForCausalLM": "nemotron_h",
    "FalconH1ForCausalLM": "falcon_h1",
}

for _m in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    if _m not in _ENGINES:
        importlib.import_module(f"{__name__}.{_m}")


def by_name(name: str, modality: str | None = None) -> Family:
    """The family called `name` (of `modality` when given)."""
    fam = REGISTRY.get(name)
    if fam is None or (modality and fam.modality != modality):
        known = ", ".join(f.name for f in of_modality(modality)) if modality else ", ".join(REGISTRY)
        raise ArchError("kind", f"{name!r} is not a model family here; known: {known}")
    return fam


def vision(kind: str) -> Family:
    """The image family of an EncoderArch.kind."""
    return by_name(kind, "image")


def audio(kind: str) -> Family:
    """The audio family of an AudioArch.kind: its config reader (`arch`), tensor names (`layout`,
    `encoder_prefix`) and export (`hf_config`)."""
    return by_name(kind, "audio")


def of_modality(modality: str | None) -> list[Family]:
    return [f for f in REGISTRY.values() if modality is None or f.modality == modality]


def architectures(modality: str) -> dict[str, Family]:
    """{config.json `architectures` entry: family} of one modality."""
    return {a: f for f in of_modality(modality) for a in f.architectures}


def audio_of(cfg) -> Family | None:
    """The audio family a config.json names by `architectures` or `model_type` (None: not an audio one)."""
    if not isinstance(cfg, dict):
        return None
    for f in of_modality("audio"):
        if (
            set(cfg.get("architectures") or ()) & set(f.architectures)
            or cfg.get("model_type") in f.model_types
        ):
            return f
    return None


def of_config(cfg: dict, modality: str) -> Family:
    """The family of `modality` a config.json describes, from `architectures` (or `model_type` when that is
    absent), refusing unknown and unbuildable families by name."""
    if not isinstance(cfg, dict):
        raise ArchError("", f"a HuggingFace config is a JSON object, got {type(cfg).__name__}")
    archs = cfg.get("architectures") or []
    by_arch = architectures(modality)
    for a in archs:
        if a in by_arch:
            return by_arch[a]
        if a in REFUSED_ARCHITECTURES:
            mt = REFUSED_ARCHITECTURES[a]
            raise ArchError("architectures", f"{a} has {REFUSED[mt]}, which the trainer cannot build")
    mt = cfg.get("model_type")
    if mt in REFUSED:
        raise ArchError("model_type", f"{mt!r} has {REFUSED[mt]}, which the trainer cannot build")
    if not archs:
        for f in of_modality(modality):
            if mt in f.model_types:
                return f
    what = f"architectures {archs}" if archs else f"model_type {mt!r}"
    raise ArchError(
        "architectures" if archs else "model_type",
        f"unknown architecture ({what}); supported: {', '.join(by_arch)}",
    )

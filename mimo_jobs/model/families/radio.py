"""The trainer's own ViT with no HuggingFace family here (megatron-core's RADIO ViT, as every vision family
is built: trainer/model/models.py): described inline or by preset fields only, its pixels standardised with
CLIP's constants (the trainer's original standardisation). It has no config.json to read or write and no
HuggingFace weight names: loading and export refuse it by name."""

from __future__ import annotations

from mimo_jobs.model.arch import ArchError
from mimo_jobs.model.families.base import register
from mimo_jobs.model.families.clip import CLIP
from mimo_jobs.model.families.vit import VisionFamily


def _no_hf(what: str) -> ArchError:
    return ArchError(
        "kind",
        f"'radio' has no HuggingFace form here, so it has no {what}; describe the encoder as a family that "
        "has one (clip, siglip, internvit) to load or export HuggingFace weights",
    )


@register
class Radio(VisionFamily):
    name = "radio"
    title = "RADIO"
    features = "no HuggingFace config or weights: the trainer's own ViT, described inline"
    pixels = CLIP.pixels
    hf = {}

    def fields(self, cfg: dict) -> dict:
        raise _no_hf("config.json to read")

    def hf_config(self, e, dtype: str = "float32") -> dict:
        raise _no_hf("config.json to write")

    def patch_tensor(self) -> str:
        raise _no_hf("weight names")

    def layout(self, e, prefix: str = ""):
        raise _no_hf("weight names")

    def doc_rows(self) -> list[tuple[str, str, str]]:
        return []

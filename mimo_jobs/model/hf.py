"""A HuggingFace transformers config.json (as a dict) <-> the trainer's descriptions and weight names, by
family: each family's facts live in its own module of model/families/ (families/base.py says what a family
holds); this module is the entry the rest of the package calls.

The family comes from `architectures` (or `model_type` when that is absent). Every field the trainer cannot
build is refused by name rather than priced as something else.
"""

from __future__ import annotations

from mimo_jobs.model import families
from mimo_jobs.model.arch import EncoderArch, LLMArch
from mimo_jobs.model.families.decoder import export_family
from mimo_jobs.model.hf_weights import HFLayout

REFUSED = families.REFUSED


def llm_family(cfg: dict) -> str:
    """The LLM family (its model_type) a causal-LM config.json describes."""
    return families.of_config(cfg, "text").name


def llm_fields(cfg: dict) -> dict:
    """LLMArch fields of a causal-LM config.json."""
    return families.of_config(cfg, "text").fields(cfg)


def encoder_fields(cfg: dict) -> dict:
    """EncoderArch fields of a vision config.json, or of a full vision + text config's vision tower."""
    return families.of_config(cfg, "image").fields(cfg)


def llm_layout(p: LLMArch, family: str, tp: int) -> HFLayout:
    """The LLM's targets as a TP group of `tp` ranks builds them (the vocabulary padding depends on tp), for
    an HF checkpoint of `family` (a model_type of a text family)."""
    return families.by_name(family, "text").layout(p, tp)


def encoder_layout(e: EncoderArch, prefix: str = "") -> HFLayout:
    """The ViT's targets for the vision tower whose tensor names start with `prefix`."""
    return families.vision(e.kind).layout(e, prefix)


def export_llm_family(p: LLMArch) -> str:
    """The HF family an LLM description is written as (refusing what none of them expresses)."""
    return export_family(p).name


def llm_config(p: LLMArch, dtype: str = "float32") -> dict:
    """An HF config.json for the description (llm_fields reads it back to the same fields)."""
    return export_family(p).hf_config(p, dtype)


def encoder_config(e: EncoderArch, dtype: str = "float32") -> dict:
    """An HF vision config.json for the description (encoder_fields reads it back to the same fields)."""
    return families.vision(e.kind).hf_config(e, dtype)

"""What a model family is: the one unit that knows a HuggingFace family (pure: no torch, no I/O).

A family reads its HuggingFace config.json into the trainer's description (`fields`), writes a description
back as a config.json (`hf_config`), and names every weight: its `hf` name table (data) generates both the
mapping between the trainer's parameters and the HuggingFace tensors (`layout`, built with
model/hf_weights.py's engine) and docs/weights.md's tables (`doc_rows`, families/docs.py). A vision family also owns its pixels' preprocessing (`pixels`: the mean,
std and rescale of its image processor) and its token rule. `modality` says which kind of input a family
encodes ("image", "audio") or "text" for a language model; code that needs per-kind behaviour dispatches on
it. `REGISTRY` (model/registry.py) holds every family by name, its name being the description's `kind`:
families/__init__.py fills it from the package's modules and answers look-ups.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from mimo_jobs.model.fields import ArchError
from mimo_jobs.model.registry import REGISTRY


def register(cls: type[Family]) -> type[Family]:
    """Class decorator: one instance of the family, under its name (a name registered twice is a bug)."""
    fam = cls()
    if fam.name in REGISTRY:
        raise AssertionError(f"two model families named {fam.name!r}")
    REGISTRY[fam.name] = fam
    return cls


def req(cfg: dict, key: str):
    """A field the family cannot do without."""
    if cfg.get(key) is None:
        raise ArchError(key, "missing from the HuggingFace config")
    return cfg[key]


class Family:
    """One HuggingFace family. Subclasses set the class attributes and implement the methods."""

    name: ClassVar[str] = ""  # the family's own name (EncoderArch.kind of a vision family, a model_type)
    title: ClassVar[str] = ""  # as a person writes it (docs)
    modality: ClassVar[str] = ""  # "image", "audio" or "text"
    architectures: ClassVar[tuple[str, ...]] = ()  # config.json `architectures` entries read as this family
    model_types: ClassVar[tuple[str, ...]] = ()  # config.json `model_type` values read as this family
    features: ClassVar[str] = ""  # what the family's reader takes from its config (docs/weights.md)

    def fields(self, cfg: dict) -> dict:
        """The description's fields of a config.json of this family."""
        raise NotImplementedError

    def hf_config(self, arch, dtype: str = "float32") -> dict:
        """A config.json of this family for a description (read back by `fields` to the same fields)."""
        raise NotImplementedError

    def doc_rows(self) -> list[tuple[str, str, str]]:
        """(trainer parameter, HuggingFace tensor(s), layout) of each entry of the family's name table, in
        the generic form docs/weights.md shows (i: a layer, e: an expert)."""
        raise NotImplementedError


@dataclass(frozen=True)
class Pixels:
    """How an image processor turns 8-bit pixels into the encoder's input: x * rescale, then (x - mean) / std
    per channel (transformers' BaseImageProcessor: rescale, then normalize)."""

    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    rescale: float = 1 / 255

    def channels(self, c: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """(mean, std) of `c` channels: the RGB values, or for one channel (L images) their averages."""
        if c == 3:
            return self.mean, self.std
        return (sum(self.mean) / 3,), (sum(self.std) / 3,)

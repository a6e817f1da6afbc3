"""docs/weights.md's name tables say what the families' mappings (model/families) do, in both directions: every name the
table shows is a name the mapping uses (a trainer parameter, or a HuggingFace tensor of some family), and
every HuggingFace tensor and trainer parameter the mapping uses for the families the page lists is named by
some row. The mapping is built here for the tiny configurations of every family (tests/weights/hf_models.py;
a two-layer Whisper encoder);
`i` and `e` in the table stand for a layer and an expert index."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("transformers")

from weights import hf_models  # noqa: E402

from helpers import REPO  # noqa: E402
from mimo_jobs.model import hf  # noqa: E402
from mimo_jobs.model.arch import EncoderArch, LLMArch  # noqa: E402
from mimo_jobs.model.audio_arch import AudioArch  # noqa: E402
from mimo_jobs.model.families import whisper  # noqa: E402
from mimo_jobs.model.hf import encoder_layout, llm_layout  # noqa: E402

PAGE = REPO / "docs" / "weights.md"
LLMS = ["llama", "llama-tied", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "mixtral"]
VISION = [("clip", ""), ("siglip", ""), ("internvit", "")]


def _rows() -> list[tuple[str, str]]:
    """(trainer column, HuggingFace column) of each row of the name tables."""
    text = PAGE.read_text().split("### Language models", 1)[1]
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0].startswith("`"):
            rows.append((cells[0], cells[1]))
    return rows


def _names(cell: str) -> list[str]:
    """The backquoted names of a cell, each cut at a '/' alternative (`.weight` / `.bias`)."""
    out = []
    for name in re.findall(r"`([^`]+)`", cell):
        out += [n.strip() for n in name.split("/") if n.strip()]
    return out


def _generic(name: str) -> str:
    """A concrete name with its layer and expert indices written as the table writes them (i, e)."""
    name = re.sub(r"(layers?)\.\d+", r"\1.i", name)
    return re.sub(r"(experts)\.(\d+)", r"\1.e", name)


def _mapping() -> tuple[set[str], set[str]]:
    """(trainer parameters, HuggingFace tensors) the mapping uses over every family, generic."""
    params, tensors = set(), set()
    for fam in LLMS:
        cfg = hf_models.llm_config(fam).to_dict()
        lay = llm_layout(LLMArch(**hf.llm_fields(cfg)), hf.llm_family(cfg), 1)
        params |= {_generic(n) for n in lay.targets}
        tensors |= {_generic(n) for n in lay.hf_shapes}
    for kind, prefix in VISION:
        e = EncoderArch(**hf.encoder_fields(hf_models.encoder_config(kind).to_dict()))
        lay = encoder_layout(e, prefix)
        params |= {_generic(n) for n in lay.targets}
        tensors |= {_generic(n) for n in lay.hf_shapes}
    audio = AudioArch("whisper", 2, 32, 4, 64, num_mel_bins=8, max_source_positions=16)
    lay = whisper.audio_layout(audio)
    params |= {_generic(n) for n in lay.targets}
    tensors |= {_generic(n) for n in lay.hf_shapes}
    return params, tensors


def _mentions(name: str, shown: list[str]) -> bool:
    """A mapping name is named by the table when some shown name (shortened with `...`, as a tail, or ending
    in `.*` for everything under it) is a piece of it, or when its last parts are shown (`k_proj` for
    self_attn.k_proj.weight)."""
    parts = name.split(".")
    for s in shown:
        s = s.removeprefix("...")
        if s.endswith(".*"):  # everything under it
            if s[:-1] in name:
                return True
        elif s in name or s.removesuffix(".weight") in name:
            return True
    tails = {".".join(parts[-k:-1]) for k in (2, 3)} | {parts[-2]}
    return any(t in shown for t in tails)


@pytest.fixture(scope="module")
def table():
    rows = _rows()
    assert len(rows) >= 15, "docs/weights.md lost its name tables"
    return rows


def test_every_tensor_and_parameter_the_mapping_uses_has_a_row(table):
    params, tensors = _mapping()
    shown_params = [n for r in table for n in _names(r[0])]
    shown_tensors = [n for r in table for n in _names(r[1])]
    missing = sorted(p for p in params if not _mentions(p, shown_params))
    assert not missing, f"docs/weights.md has no row for the trainer parameters {missing[:8]}"
    missing = sorted(t for t in tensors if not _mentions(t, shown_tensors))
    assert not missing, f"docs/weights.md has no row for the HuggingFace tensors {missing[:8]}"


def test_every_name_the_table_shows_is_one_the_mapping_uses(table):
    params, tensors = _mapping()
    every = " ".join(sorted(params | tensors))
    stale = []
    for trainer_cell, hf_cell in table:
        for n in _names(trainer_cell) + _names(hf_cell):
            piece = n.removeprefix("...").removesuffix(".*").removesuffix(".weight").removesuffix(".bias")
            if piece and piece not in every:
                stale.append(n)
    assert not stale, f"docs/weights.md names what the mapping does not use: {stale}"


def test_the_check_can_fail(table):
    params, tensors = _mapping()
    assert not _mentions(
        "decoder.layers.i.mlp.a_layer_no_row_names.weight", [n for r in table for n in _names(r[0])]
    )
    assert "a_layer_no_row_names" not in " ".join(params | tensors)

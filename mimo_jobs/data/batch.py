"""The batch contract between data providers (mock, energon) and the trainer's step, keyed by encoder module.

A provider yields, for one LLM DP lane and one microbatch, a LaneBatch of `mbs` samples. Each encoder module
of the model has its entry in `LaneBatch.inputs` (`ModuleInputs`, by the module's name in the study, in the
model's order): its placeholder token id, per sample how many placeholder tokens it fills (positions where
tokens == that id) and, on the ranks that embed it, per sample its inputs in placeholder order (images,
audio clips: whatever input kind the module's family consumes, `model.arch` `modality`). The encoder replica
serving lanes [i*k, (i+1)*k) asks the provider for exactly those lanes' LaneBatches (same seeds, same order)
and embeds its module's inputs; alignment is checked through `sample_keys` and each module's counts.

Two modules of one input kind (two vision towers) each have an entry: the sample's image reaches both, and
each module's embeddings go to its own placeholders (`placeholder_ids` gives every module its own id).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# the placeholder ids are the contract's (validate checks the vocabulary has room for them); re-exported
from mimo_jobs.contract.placeholders import audio_token_id, placeholder_ids  # noqa: F401

IGNORE_INDEX = -100


def flatten(items) -> list:
    """Per-sample inputs of a module -> what it embeds, in placeholder order: None (nothing for it) gives
    none, a [T, C, H, W] tensor its T tiles, a [1, F, C, H, W] tensor one video of F frames (its [F, C, H, W]
    frames, embedded as one input), a list or tuple its items in turn (several images, a sample's clips,
    packed samples), any other tensor itself (an image [C, H, W], a clip [n_mels, frames])."""
    out: list = []
    for x in items:
        if x is None:
            continue
        if isinstance(x, (list, tuple)):
            out += flatten(x)
        elif x.dim() in (4, 5):  # tiles, or a video's frames: each along the first dimension is one input
            out += list(x.unbind(0))
        else:
            out.append(x)
    return out


@dataclass
class ModuleInputs:
    """One encoder module's share of a lane microbatch."""

    token_id: int  # its placeholder in `LaneBatch.tokens`
    counts: list[int]  # per sample its placeholder tokens (0: nothing for this module)
    # per sample (encoder side only): None, or the module's inputs in placeholder order: one image (FloatTensor
    # [C, H, W]; [T, C, H, W] for its tiles; [1, F, C, H, W] for a video of F frames) or a list of them
    # (several images, packed samples); for an audio
    # module a list of clips (FloatTensor [n_mels, frames]). The module embeds them flattened in that order
    # (`flatten`), the LLM scatters its rows back row-major
    items: list[Any] | None = None

    @property
    def tokens(self) -> int:
        return sum(self.counts)


@dataclass
class LaneBatch:
    lane: int  # LLM DP rank this microbatch belongs to
    step: int  # global iteration (0-based)
    microbatch: int  # index within the iteration
    sample_keys: list[str]  # stable per-sample ids (checked on both sides of the bridge)
    tokens: Any  # LongTensor [mbs, seq]; a module's positions hold its placeholder token id
    labels: Any  # LongTensor [mbs, seq]
    loss_mask: Any  # FloatTensor [mbs, seq]; 0 on placeholder positions and padding
    position_ids: Any  # LongTensor [mbs, seq]
    inputs: dict[str, ModuleInputs] = field(default_factory=dict)  # by encoder module, in the model's order
    meta: dict[str, Any] = field(default_factory=dict)
    # packed rows (LongTensor [mbs, seq]): which of the row's samples each position belongs to, padding -1;
    # attention never crosses two values and position_ids restart at each sample. None: one sample per row
    segment_ids: Any = None

    def counts(self, module: str) -> list[int]:
        """Per sample the placeholder tokens of `module` (zeros when the batch carries nothing for it)."""
        got = self.inputs.get(module)
        return list(got.counts) if got is not None else [0] * len(self.sample_keys)

    def items(self, module: str) -> list[Any]:
        """Per sample the module's inputs (None entries: nothing for it, or not decoded on this rank)."""
        got = self.inputs.get(module)
        if got is None or got.items is None:
            return [None] * len(self.sample_keys)
        return list(got.items)

    def kind_tokens(self, kinds: dict[str, str], kind: str) -> int:
        """Placeholder tokens of every module whose input kind (`kinds`: module -> kind) is `kind`."""
        return sum(m.tokens for name, m in self.inputs.items() if kinds.get(name) == kind)


class Provider:
    """What the trainer needs from a data source (mock or energon). One provider object per rank, built for
    the lanes that rank consumes: an LLM rank -> [its DP lane]; an encoder replica -> the lanes it serves;
    the one-process reference -> all lanes. Each lane is an independent deterministic stream, so the
    encoder replica and the LLM lane draw identical samples in identical order.

    Built by `mimo_jobs.data.mock.make_provider(run_spec, plan, lanes, need_images, need_text)`.
    """

    #: {encoder module: its placeholder id in this provider's tokens} (the tokenizer's own `<image>` for the
    #: first image module when it has one); the trainer scatters a module's embeddings where tokens == its id
    placeholders: dict[str, int]

    def next(self, lane: int) -> LaneBatch:  # the lane's next microbatch (mbs samples)
        raise NotImplementedError

    def state_dict(self) -> dict:  # enough to resume every lane exactly (checkpoints)
        raise NotImplementedError

    def load_state_dict(self, state: dict) -> None:
        raise NotImplementedError

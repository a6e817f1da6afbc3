"""The batch contract between data providers (mock, energon) and the trainer's step.

A provider yields, for one LLM DP lane and one microbatch, a LaneBatch of `mbs` samples. The encoder
replica serving lanes [i*k, (i+1)*k) asks the provider for exactly those lanes' LaneBatches (same seeds,
same order) and embeds their images; alignment is checked through `sample_keys` and `image_token_counts`.

Audio clips (log-mel features of a model with an audio encoder) travel the same way: per sample their
placeholder tokens (`audio_token_counts`, positions where tokens == the provider's `audio_token_id`) and, on
the ranks that embed audio, the clips themselves in placeholder order. Both default to none, so a consumer
that knows nothing of audio reads image batches as before.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

IGNORE_INDEX = -100


def audio_token_id(vocab_size: int) -> int:
    """The audio placeholder of both providers when the model has an audio encoder: the vocabulary's
    second-to-last entry (the image placeholder is the last)."""
    return vocab_size - 2


@dataclass
class LaneBatch:
    lane: int  # LLM DP rank this microbatch belongs to
    step: int  # global iteration (0-based)
    microbatch: int  # index within the iteration
    sample_keys: list[str]  # stable per-sample ids (checked on both sides of the bridge)
    tokens: Any  # LongTensor [mbs, seq]; image positions hold the image placeholder token id
    labels: Any  # LongTensor [mbs, seq]
    loss_mask: Any  # FloatTensor [mbs, seq]; 0 on image positions and padding
    position_ids: Any  # LongTensor [mbs, seq]
    image_token_counts: list[int]  # per sample; 0 = text-only. == (tokens[i] == image_token_id).sum()
    # per sample (encoder side only): None, one image (FloatTensor [C, H, W]; [T, C, H, W] for its tiles), or
    # a list of them in placeholder order (several images, or packed samples); the encoder embeds them
    # flattened in that order (images.encoder_inputs), the LLM scatters them back row-major
    images: list[Any] | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    # packed rows (LongTensor [mbs, seq]): which of the row's samples each position belongs to, padding -1;
    # attention never crosses two values and position_ids restart at each sample. None: one sample per row
    segment_ids: Any = None
    # per sample its audio placeholder tokens (0 = no clip); == (tokens[i] == audio_token_id).sum(). None:
    # the provider carries no audio
    audio_token_counts: list[int] | None = None
    # per sample (audio encoder side only): None or a list of clips, FloatTensor [n_mels, frames] each, in
    # placeholder order; the audio encoder embeds them flattened in that order (audio.audio_inputs; padded
    # with their lengths: audio.pad_clips), the LLM scatters them back row-major
    audio: list[Any] | None = None

    @property
    def num_image_tokens(self) -> int:
        return sum(self.image_token_counts)

    @property
    def num_audio_tokens(self) -> int:
        return sum(self.audio_token_counts or ())


class Provider:
    """What the trainer needs from a data source (mock or energon). One provider object per rank, built for
    the lanes that rank consumes: an LLM rank -> [its DP lane]; an encoder replica -> the lanes it serves;
    the one-process reference -> all lanes. Each lane is an independent deterministic stream, so the
    encoder replica and the LLM lane draw identical samples in identical order.

    Built by `mimo_jobs.data.mock.make_provider(run_spec, plan, lanes, need_images, need_text)`.
    """

    #: the placeholder id at image positions in this provider's tokens (the tokenizer's own `<image>` when it
    #: has one); the trainer scatters image embeddings where tokens == this id
    image_token_id: int
    #: the placeholder id at audio positions (None: no audio encoder, no audio placeholders)
    audio_token_id: int | None = None

    def next(self, lane: int) -> LaneBatch:  # the lane's next microbatch (mbs samples)
        raise NotImplementedError

    def state_dict(self) -> dict:  # enough to resume every lane exactly (checkpoints)
        raise NotImplementedError

    def load_state_dict(self, state: dict) -> None:
        raise NotImplementedError

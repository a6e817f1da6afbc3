"""One pass over a prepared energon dataset or blend, through the trainer's own task encoder, collecting
per-sample token counts for `data stats` (imports energon and torch: called inside the command only).

The same encoder as training means the same sample types, field maps, chat template and image geometry;
nothing is cut (the sequence limit is lifted, so over-long samples show their full length) and bad samples
are counted as skipped instead of stopping the pass."""

from __future__ import annotations

from typing import Any

from .audio import AudioSpec
from .batch import audio_token_id
from .check import check_data_path
from .energon_provider import image_token_id
from .errors import DataError
from .images import ImageGeometry, header_size
from .stats import SampleStat
from .tokenizer import PRINTABLE, load_tokenizer

NO_LIMIT = 1 << 30
BUILTIN_VOCAB = (
    len(PRINTABLE) + 5
)  # the built-in tokenizer's ids: 4 specials, the placeholder, the characters


def _stat(s: Any, geometry: ImageGeometry) -> SampleStat:
    """One encoded sample's counts; its images' encoder samples from their headers (the task encoder has
    already checked them), by the same plan the encoder side cuts; a video (its frames, a list) is one
    encoder sample of all its tokens."""
    stills = [b for b in s.images if not isinstance(b, list)]
    plans = [geometry.plan(*header_size(bytes(b))) for b in stills]
    video_tokens = [n for b, n in zip(s.images, s.image_tokens) if isinstance(b, list)]
    return SampleStat(
        key=s.__key__,
        image_tokens=s.image_token_count,
        text_tokens=len(s.tokens) - s.image_token_count - s.audio_token_count,
        images=len(plans),
        tiles=sum(p.tiles for p in plans) + len(video_tokens),
        tile_tokens_sq=sum(p.tiles * p.tokens_per_piece**2 for p in plans) + sum(n * n for n in video_tokens),
        audio_tokens=s.audio_token_count,
        audio_clips=len(s.audio),
        videos=len(video_tokens),
        video_tokens=sum(video_tokens),
    )


def scan(
    path: str,
    geometry: ImageGeometry,
    vocab_size: int | None,
    tokenizer: str | None,
    audio: AudioSpec | None = None,
    trust_code: bool = False,
) -> tuple[list[SampleStat], int]:
    """(per-sample stats in the dataset's order, samples skipped as bad). vocab_size None (an image encoder
    without its LLM): the tokenizer's own ids, the placeholders after them; token counts do not depend
    on the vocabulary's size. `audio`: the audio encoder's token rule (None: a clip stops the pass).
    `trust_code`: the dataset's own loader code may run (check.py)."""
    if vocab_size is None:
        vocab_size = BUILTIN_VOCAB + (audio is not None) if tokenizer is None else NO_LIMIT
    from megatron.energon import WorkerConfig, get_loader, get_val_dataset

    from .task_encoder import EncodeConfig, MimoTaskEncoder

    class _Counting(MimoTaskEncoder):
        def batch(self, samples: list[Any]) -> list[SampleStat]:
            return [_stat(s, geometry) for s in samples]

    check_data_path(path, trust_code)
    aud_id = audio_token_id(vocab_size) if audio is not None else None
    tok = load_tokenizer(tokenizer, vocab_size, image_token_id(vocab_size), aud_id)
    enc = _Counting(
        tok,
        EncodeConfig(
            seq_length=NO_LIMIT, geometry=geometry, need_images=False, on_bad_sample="skip", audio=audio
        ),
    )
    wc = WorkerConfig(rank=0, world_size=1, num_workers=0, global_error_handler=enc.on_error)
    ds = get_val_dataset(path, split_part="train", worker_config=wc, batch_size=1, task_encoder=enc)
    out: list[SampleStat] = []
    try:
        for batch in get_loader(ds):
            out += batch
    except ValueError as e:  # energon's reader on a shard shorter than its index says
        if "end of tar file" not in str(e):
            raise
        shard = str(e).rsplit(":", 1)[-1].strip()
        raise DataError(
            f"{path}: shard {shard} ends before the samples its index lists (a copy or a write that did "
            "not finish): copy or prepare the dataset again"
        ) from None
    skipped = sum(1 for e in enc._events if e["kind"] == "skipped")
    return out, skipped

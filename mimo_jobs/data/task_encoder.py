"""The energon TaskEncoder: raw samples -> the trainer's microbatch contract (see trainer/batch.py).

Per sample (both sides of the bridge, identically): tokenize the text, read the image size from the
header (no pixel decode; a video's frames likewise, one size for all) and each audio clip's shape from its
`.npy` header (no data loaded), insert one
placeholder per image token and per audio token (the audio encoder's token rule, `AudioSpec`), build labels
and the loss mask. Per batch: pad to seq_length and stack; on encoder ranks only, decode the images (flat
variable-length list with per-sample token counts) and load the clips. Only JSON members are parsed on the
way in (samples.MemberDecoder); images and clips arrive encoded so LLM ranks never pay for pixels or
features, and every failure passes through code that names the shard and the sample key. Labels follow one
rule for every layout (chat.py): a position carries loss exactly when the next token is a target
(answer/assistant/caption text) and the position is not an image or audio placeholder.

Bad samples (corrupt image, missing/undecodable field, empty text, too long for seq_length) either raise
DataError naming dataset, shard and key (on_bad_sample="error") or are skipped and *counted*: the skip is
attached to the next batch the lane yields, so the provider logs it and keeps totals. Every check runs on
the LLM side too, so the encoder replica and its lanes skip exactly the same samples.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

import torch
from megatron.energon import (
    Batch,
    CaptioningSample,
    DefaultTaskEncoder,
    InterleavedSample,
    Sample,
    SkipSample,
    TextSample,
    VQASample,
    edataclass,
    stateless,
)

from mimo_jobs.data.batch import IGNORE_INDEX

from .audio import AUDIO_MARKER, AudioSpec, load_clip, npy_shape
from .chat import (
    IMAGE_MARKER,
    chat_layout,
    document_text,
    interleaved_layout,
    marked_layout,
    normalize_turns,
    picture_order,
    place_images,
    plain_layout,
)
from .errors import DataError, describe
from .images import ImageGeometry, decode, header_size
from .packing import row_layout, select_packs
from .samples import ConversationSample, MediaSample, MemberDecoder
from .tokenizer import Tokenizer

MAX_CONSECUTIVE_SKIPS = 1000


@dataclass(frozen=True)
class EncodeConfig:
    seq_length: int
    geometry: ImageGeometry | None  # None: the model has no image module (images refused)
    need_images: bool = True  # decode pixels (encoder ranks); LLM ranks only need token counts
    on_bad_sample: Literal["error", "skip"] = "error"
    truncate_text: bool = False  # True: cut overlong text to fit (counted); images are never cut
    image_slice: tuple[int, int] | None = None  # decode only these batch positions (fan-in encoder replica)
    packing: bool = False  # rows hold several samples (PackingTaskEncoder); batches carry segment_ids
    audio: AudioSpec | None = None  # the audio encoder's token rule; None: no audio encoder (clips refused)
    need_audio: bool | None = None  # load the clips (audio encoder ranks); None: as need_images


@edataclass
class EncodedSample(Sample):
    tokens: list[int]  # unpadded: BOS first (plain layout) or as the chat template renders
    targets: list[bool]  # per token: the model is trained to produce it (answer/assistant tokens)
    image_token_count: int  # all its images' and videos' tokens (the image module's placeholders)
    # encoded images (bytes), or a video's frames (a list of bytes), in placeholder order, decoded later
    # (encoder side only)
    images: list
    image_tokens: list  # per image or video: its placeholder tokens
    audio_token_count: int  # all its clips' tokens
    audio: list  # `.npy` clips (bytes) in placeholder order, loaded later (encoder side only)
    audio_tokens: list  # per clip: its placeholder tokens
    lengths: list  # the samples it holds end to end: [len(tokens)], or several once packed
    truncated: bool


@edataclass
class EncodedBatch(Batch):
    tokens: torch.Tensor  # [B, S] long
    labels: torch.Tensor  # [B, S] long, IGNORE_INDEX where no loss
    loss_mask: torch.Tensor  # [B, S] float
    position_ids: torch.Tensor  # [B, S] long; restart at 0 for each packed sample
    segment_ids: torch.Tensor | None  # [B, S] long when packing: the sample each position belongs to
    image_token_counts: list[int]
    # per sample [C, H, W], or [T, C, h, w] for a tiled image (None for text-only / not decoded); None on
    # the LLM side
    images: list[Any] | None
    audio_token_counts: list[int]
    # per sample a list of clips [n_mels, frames] in placeholder order (None: no clip / not loaded); None on
    # the ranks that do not load audio
    audio: list[Any] | None
    events: list[dict]  # skipped/truncated samples since the lane's previous batch (counted by the provider)


def label_row(
    tokens: list[int], targets: list[bool], image_token_id: int, audio_token_id: int | None = None
) -> torch.Tensor:
    """Next-token labels for positions 0..n-2: tokens[t+1] where it is a target, else IGNORE_INDEX.
    An image or audio position never carries loss (the contract in batch.py, as the mock provider does)."""
    ids = torch.tensor(tokens, dtype=torch.long)
    keep = torch.tensor(targets[1:], dtype=torch.bool) & (ids[:-1] != image_token_id)
    if audio_token_id is not None:
        keep &= ids[:-1] != audio_token_id
    return torch.where(keep, ids[1:], torch.full_like(ids[1:], IGNORE_INDEX))


def _source(sample: Any) -> tuple[str | None, str | None, str | None]:
    """(key, shard, dataset) of a sample at any stage: an energon Sample, a raw dict, or RawSampleData (the
    shard reader's output, which wraps the raw dicts in `.data`)."""
    if hasattr(sample, "data") and isinstance(sample.data, tuple):
        inner = [d for d in sample.data if d is not None]
        sample = inner[0] if inner else sample
    if isinstance(sample, dict):
        key, srcs = sample.get("__key__"), sample.get("__sources__")
    else:
        key, srcs = getattr(sample, "__key__", None), getattr(sample, "__sources__", None)
    shard = dataset = None
    if srcs:
        shard = getattr(srcs[0], "shard_name", None)
        dataset = str(getattr(srcs[0], "dataset_path", "")) or None
    return key, shard, dataset


def _text(value: Any, what: str) -> str:
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"field {what!r} is not UTF-8 text ({e.reason} at byte {e.start})") from None
    if isinstance(value, str):
        return value
    raise ValueError(f"field {what!r} has type {type(value).__name__}, expected text")


def _image_list(image: Any) -> list:
    """A sample's image field as a list: none, one, or several (a list of encoded images)."""
    if image is None:
        return []
    return list(image) if isinstance(image, (list, tuple)) else [image]


def _clip_list(audio: Any) -> list:
    """A sample's audio field as a list of `.npy` members: none, one, or several."""
    if audio is None:
        return []
    return list(audio) if isinstance(audio, (list, tuple)) else [audio]


def split_interleaved(sequence: Any) -> tuple[list[str | None], list]:
    """energon's InterleavedSample.sequence -> (text pieces with None where an image goes, the images in
    order). Text is str; an image is its encoded bytes (samples.MemberDecoder leaves images encoded)."""
    if not isinstance(sequence, (list, tuple)) or not sequence:
        raise ValueError("field 'sequence' must be a non-empty list of text and images")
    pieces: list[str | None] = []
    images = []
    for i, item in enumerate(sequence):
        if isinstance(item, str):
            pieces.append(item)
        elif isinstance(item, (bytes, bytearray)):
            pieces.append(None)
            images.append(item)
        else:
            raise ValueError(
                f"sequence item {i} has type {type(item).__name__}; expected text (str) or an encoded "
                "image (bytes)"
            )
    return pieces, images


class MimoTaskEncoder(DefaultTaskEncoder[Sample, EncodedSample, EncodedBatch, EncodedBatch]):
    """One instance per lane loader: `_events` is that lane's (per worker process) pending skip list."""

    # JSON members parsed (field_map json[...] works); images stay bytes, decoded only where needed
    decoder = MemberDecoder()

    def __init__(self, tokenizer: Tokenizer, cfg: EncodeConfig):
        super().__init__()
        self.tok = tokenizer
        self.cfg = cfg
        self._events: list[dict] = []
        self._consecutive_skips = 0

    # ------------------------------------------------------------ failures

    def _bad(self, sample: Any, reason: str, detail: str) -> None:
        key, shard, dataset = _source(sample)
        if self.cfg.on_bad_sample == "error":
            raise DataError(
                f"{describe(key, shard, dataset)}: {detail} "
                "(set trainer.data.on_bad_sample: skip to skip and count such samples)"
            )
        self._skip_event(reason, key, shard, detail)
        raise SkipSample()

    def _skip_event(self, reason: str, key: str | None, shard: str | None, detail: str) -> None:
        self._events.append(
            {"kind": "skipped", "reason": reason, "key": key, "shard": shard, "detail": detail}
        )
        # energon does not count SkipSample towards its failure tolerance: an all-bad dataset would loop
        # forever. Stop with the evidence instead.
        self._consecutive_skips += 1
        if self._consecutive_skips >= MAX_CONSECUTIVE_SKIPS:
            raise DataError(
                f"{self._consecutive_skips} consecutive samples were skipped as bad (last: "
                f"{describe(key, shard)}: {detail}); the dataset looks broken"
            )

    def on_error(self, exc: Exception, sample: Any, sources: Any = None) -> None:
        """energon's global_error_handler: failures inside energon (e.g. a field missing from the shard)."""
        if isinstance(exc, DataError):
            raise exc
        key, shard, dataset = _source(sample)
        if sources and not shard:
            shard = getattr(sources[0], "shard_name", None)
            dataset = str(getattr(sources[0], "dataset_path", "")) or dataset
        # energon's messages embed the whole sample repr; keep the first clause
        detail = f"{type(exc).__name__}: {str(exc).split(' in {', 1)[0]}"
        if self.cfg.on_bad_sample == "error":
            raise DataError(
                f"{describe(key, shard, dataset)}: energon failed to load the sample: {detail} "
                f"(set trainer.data.on_bad_sample: skip to skip and count such samples)"
            ) from exc
        # energon drops the sample after this returns; we count it.
        self._skip_event("load", key, shard, detail)

    # ------------------------------------------------------------ per sample

    def _fields(self, sample: Sample) -> tuple[tuple[str, Any], str, list, list, list]:
        """((layout, its input), the text trained on, images, audio clips and videos in their markers'
        order) of a supported sample type: layout "plain" (input: the prompt), "chat" (the turns),
        "interleaved" (text pieces, None where an image goes) or "marked" (the text with its markers).
        ValueError when malformed."""
        if isinstance(sample, MediaSample):
            text = _text(sample.text, "text")
            bare = text.replace(IMAGE_MARKER, "").replace(AUDIO_MARKER, "")
            return ("marked", text), bare, _image_list(sample.image), _clip_list(sample.audio), []
        if isinstance(sample, ConversationSample):
            turns = normalize_turns(sample.conversation)
            text = " ".join(t["content"] for t in turns if t["role"] == "assistant")
            images, clips = _image_list(sample.image), _clip_list(sample.audio)
            videos = _clip_list(sample.video)
            if all(t["role"] == "assistant" for t in turns):
                # nothing prompts it (a caption, a document: `data synth --audio`): BOS, its text, EOS, all
                # of it learned, with or without a chat template (a template renders no generation prompt
                # for an empty history, so it could not tell the answer's tokens from the turn's frame)
                return ("marked", document_text(turns, len(images))), text, images, clips, videos
            return ("chat", turns), text, images, clips, videos
        return (*self._image_fields(sample), [], [])

    def _image_fields(self, sample: Sample) -> tuple[tuple[str, Any], str, list]:
        if isinstance(sample, CaptioningSample):
            return ("plain", ""), _text(sample.caption, "caption"), _image_list(sample.image)
        if isinstance(sample, VQASample):
            answers = sample.answers if isinstance(sample.answers, list) else [sample.answers]
            if not answers:
                raise ValueError("field 'answers' is empty")
            context, answer = _text(sample.context, "context"), _text(answers[0], "answers")
            if self.tok.chat_template is None:
                return ("plain", context), answer, _image_list(sample.image)
            turns = [{"role": "user", "content": context}, {"role": "assistant", "content": answer}]
            return ("chat", turns), answer, _image_list(sample.image)
        if isinstance(sample, InterleavedSample):
            pieces, images = split_interleaved(sample.sequence)
            return ("interleaved", pieces), "".join(p for p in pieces if p is not None), images
        if isinstance(sample, TextSample):
            return ("plain", ""), _text(sample.text, "text"), []
        raise ValueError(
            f"unsupported sample type {type(sample).__name__} (use CaptioningSample, VQASample, "
            "ConversationSample, MediaSample, InterleavedSample or TextSample)"
        )

    def _image_tokens(self, sample: Sample, image: Any) -> int:
        if not isinstance(image, (bytes, bytearray)):
            self._bad(sample, "field", f"image field has type {type(image).__name__}, expected encoded bytes")
        try:
            h, w = header_size(bytes(image))
        except Exception as e:  # noqa: BLE001 -- PIL raises many types for broken files
            self._bad(sample, "image", f"corrupt image ({type(e).__name__}: {e})")
        if self.cfg.geometry is None:
            # a setting that fits no image sample: skipping would only hide it
            raise DataError(
                f"{describe(*_source(sample))}: the sample has an image but the model has no image encoder "
                "(add one to trainer.model, or train on data without images)"
            )
        return self.cfg.geometry.tokens(h, w)

    def _video_tokens(self, sample: Sample, frames: Any) -> int:
        """A video's placeholders: its frames' one size from their headers (no pixel decode), the image
        module's temporal patch groups (ImageGeometry.video_tokens)."""
        if not isinstance(frames, (list, tuple)) or not frames:
            self._bad(sample, "field", "a video has no frames")
        sizes = []
        for i, f in enumerate(frames):
            if not isinstance(f, (bytes, bytearray)):
                self._bad(
                    sample, "field", f"video frame {i} has type {type(f).__name__}, expected image bytes"
                )
            try:
                sizes.append(header_size(bytes(f)))
            except Exception as e:  # noqa: BLE001 -- PIL raises many types for broken files
                self._bad(sample, "image", f"video frame {i} is corrupt ({type(e).__name__}: {e})")
        if len(set(sizes)) > 1:
            i = next(i for i, s in enumerate(sizes) if s != sizes[0])
            self._bad(
                sample,
                "video",
                f"video frame {i} is {sizes[i][0]}x{sizes[i][1]} but frame 0 is {sizes[0][0]}x{sizes[0][1]}; "
                "a video's frames share one size",
            )
        g = self.cfg.geometry
        if g is None or g.temporal < 2:
            # a setting that fits no video sample: skipping would only hide it
            why = "no image encoder" if g is None else "an image module without a temporal patch"
            raise DataError(
                f"{describe(*_source(sample))}: the sample has a video but the model has {why} "
                "(an image module with temporal_patch_size 2, Qwen2-VL's 3-D patch, embeds a video's frames)"
            )
        return g.video_tokens(len(frames), *sizes[0])

    def _clip_tokens(self, sample: Sample, clip: Any) -> int:
        if not isinstance(clip, (bytes, bytearray)):
            self._bad(sample, "field", f"audio field has type {type(clip).__name__}, expected .npy bytes")
        if self.cfg.audio is None:
            # a setting that fits no audio sample: skipping would only hide it
            key, shard, dataset = _source(sample)
            raise DataError(
                f"{describe(key, shard, dataset)}: the sample has an audio clip but the model has no audio "
                "encoder (add one to trainer.model, or train on data without audio)"
            )
        try:
            return self.cfg.audio.clip_tokens(npy_shape(bytes(clip)))
        except ValueError as e:
            self._bad(sample, "audio", str(e))

    def encode_sample(self, sample: Sample) -> EncodedSample:
        try:
            (layout, given), response, images, clips, videos = self._fields(sample)
        except ValueError as e:
            self._bad(sample, "field", str(e))
        if not response.strip():
            self._bad(sample, "empty", "text is empty")
        counts = [self._image_tokens(sample, im) for im in images]
        video_counts = [self._video_tokens(sample, v) for v in videos]
        n_img = sum(counts) + sum(video_counts)
        audio_counts = [self._clip_tokens(sample, c) for c in clips]
        t = self.tok
        try:
            if layout == "plain":  # every image's placeholders lead, in order
                ids, targets = plain_layout(t, given, response, n_img)
            elif layout == "chat":
                ids, targets = chat_layout(t, given, counts, audio_counts, video_counts)
            elif layout == "marked":
                ids, targets = marked_layout(t, given, counts, audio_counts, video_counts)
            else:
                ids, targets = interleaved_layout(t, given, counts)
        except DataError:
            raise  # a setting that fits no sample (e.g. no chat template): skipping would only hide it
        except ValueError as e:
            self._bad(sample, "field", str(e))
        if videos:  # the image module embeds images and videos as their placeholders stand
            text = (
                given
                if layout == "marked"
                else "".join(x["content"] for x in place_images(given, len(images)))
            )
            images, counts = _pictures(picture_order(text), images, counts, videos, video_counts)
        ids, targets, truncated = self._fit(sample, ids, targets, n_img, sum(audio_counts))
        self._consecutive_skips = 0
        return EncodedSample.derive_from(
            sample,
            tokens=ids,
            targets=targets,
            image_token_count=n_img,
            images=[[bytes(f) for f in im] if isinstance(im, (list, tuple)) else bytes(im) for im in images],
            image_tokens=counts,
            audio_token_count=sum(audio_counts),
            audio=[bytes(c) for c in clips],
            audio_tokens=audio_counts,
            lengths=[len(ids)],
            truncated=truncated,
        )

    def _fit(
        self, sample: Sample, ids: list[int], targets: list[bool], n_img: int, n_audio: int = 0
    ) -> tuple[list[int], list[bool], bool]:
        """Cut text past seq_length when allowed; never an image's or a clip's placeholders, never every
        target."""
        seq = self.cfg.seq_length
        if len(ids) <= seq:
            return ids, targets, False
        img, aud = self.tok.image_token_id, self.tok.audio_token_id
        cut_ok = ids[:seq].count(img) == n_img and any(targets[1:seq])
        cut_ok = cut_ok and (not n_audio or ids[:seq].count(aud) == n_audio)
        if not self.cfg.truncate_text or not cut_ok:
            self._bad(
                sample,
                "overlong",
                f"{len(ids)} tokens ({n_img} image tokens"
                + (f", {n_audio} audio tokens" if n_audio else "")
                + f") do not fit seq_length={seq}"
                + ("" if self.cfg.truncate_text else "; set trainer.data.truncate_text: true to cut text"),
            )
        key, shard, _ = _source(sample)
        self._events.append(
            {
                "kind": "truncated",
                "reason": "overlong",
                "key": key,
                "shard": shard,
                "detail": f"{len(ids)} tokens cut to {seq}",
            }
        )
        return ids[:seq], targets[:seq], True

    # ------------------------------------------------------------ per batch

    def batch(self, samples: list[EncodedSample]) -> EncodedBatch:
        seq, b = self.cfg.seq_length, len(samples)
        tokens = torch.full((b, seq), self.tok.pad_id, dtype=torch.long)
        labels = torch.full((b, seq), IGNORE_INDEX, dtype=torch.long)
        for i, s in enumerate(samples):
            ids = torch.tensor(s.tokens, dtype=torch.long)
            tokens[i, : len(ids)] = ids
            a = 0
            for n in s.lengths:  # packed samples: each one's last position predicts nothing
                labels[i, a : a + n - 1] = label_row(
                    s.tokens[a : a + n],
                    s.targets[a : a + n],
                    self.tok.image_token_id,
                    self.tok.audio_token_id,
                )
                a += n
        loss_mask = (labels != IGNORE_INDEX).float()
        segment_ids = None
        if self.cfg.packing:
            rows = [row_layout(s.lengths, seq) for s in samples]
            position_ids = torch.tensor([r.positions for r in rows], dtype=torch.long)
            segment_ids = torch.tensor([r.segments for r in rows], dtype=torch.long)
        else:
            position_ids = torch.arange(seq, dtype=torch.long).unsqueeze(0).expand(b, seq).contiguous()
        images = None
        if self.cfg.need_images:
            lo, hi = self.cfg.image_slice or (0, b)
            images = []
            for i, s in enumerate(samples):
                if not s.images or not lo <= i < hi:
                    images.append(None)
                    continue
                row = [self._decoded(s, im, n) for im, n in zip(s.images, s.image_tokens)]
                # one image as before (a tensor); several (multi-image or packed) as a list in order
                images.append(row[0] if len(row) == 1 else row)
        audio = None
        if self.cfg.need_images if self.cfg.need_audio is None else self.cfg.need_audio:
            lo, hi = self.cfg.image_slice or (0, b)
            audio = [
                [self._loaded(s, c, n) for c, n in zip(s.audio, s.audio_tokens)]
                if s.audio and lo <= i < hi
                else None
                for i, s in enumerate(samples)
            ]
        events, self._events = self._events, []
        return EncodedBatch.from_samples(
            samples,
            tokens=tokens,
            labels=labels,
            loss_mask=loss_mask,
            position_ids=position_ids,
            segment_ids=segment_ids,
            image_token_counts=[s.image_token_count for s in samples],
            images=images,
            audio_token_counts=[s.audio_token_count for s in samples],
            audio=audio,
            events=events,
        )

    def _loaded(self, s: EncodedSample, clip: bytes, tokens: int) -> Any:
        """One clip of sample s, loaded ([n_mels, frames] float32), checked to give the `tokens` its header
        promised."""
        try:
            x = load_clip(clip)
        except ValueError as e:
            raise _loaded_error(s, f"audio clip passed the header check but failed to load ({e})") from e
        n = self.cfg.audio.clip_tokens(tuple(x.shape))
        if n != tokens:
            raise _loaded_error(s, f"audio header gives {tokens} tokens but the loaded clip gives {n}")
        return x

    def _decoded(self, s: EncodedSample, image: Any, tokens: int) -> Any:
        """One image of sample s (or a video: its frames), decoded, checked to give the `tokens` its header
        promised."""
        if isinstance(image, list):
            return self._decoded_video(s, image, tokens)
        try:
            img = decode(image, self.cfg.geometry)
        except Exception as e:
            # The LLM side accepted this image from its header; skipping here would misalign the
            # lanes, so this is always an error.
            key, shard, dataset = _source(s)
            raise DataError(
                f"{describe(key, shard, dataset)}: image passed the header check but "
                f"failed to decode ({type(e).__name__}: {e}); remove or fix the sample"
            ) from e
        g = self.cfg.geometry
        n = g.tokens_of_decoded(tuple(img.shape))  # a tiled image: all its tiles
        if n != tokens:  # header and pixels disagree (e.g. EXIF/frames): never silent
            raise DataError(
                f"{describe(*_source(s))}: header size gives {tokens} image "
                f"tokens but the decoded image gives {n}"
            )
        return img

    def _decoded_video(self, s: EncodedSample, frames: list, tokens: int) -> Any:
        """A video of sample s: its frames, each one piece at its dynamic resolution (never tiled), as one
        [1, F, C, H, W] input of the image module (the mock provider's form)."""
        g = dataclasses.replace(self.cfg.geometry, max_tiles=1, thumbnail=False)
        try:
            x = torch.stack([decode(f, g) for f in frames])
        except Exception as e:
            # The LLM side accepted these frames from their headers; skipping here would misalign the lanes
            raise DataError(
                f"{describe(*_source(s))}: a video frame passed the header check but failed to decode "
                f"({type(e).__name__}: {e}); remove or fix the sample"
            ) from e
        n = g.video_tokens_of_pixels(x.shape[0], x.shape[-2], x.shape[-1])
        if n != tokens:
            raise DataError(
                f"{describe(*_source(s))}: the video's frame headers give {tokens} tokens but its decoded "
                f"frames give {n}"
            )
        return x.unsqueeze(0)


def _pictures(
    is_video: list[bool], images: list, counts: list[int], videos: list, video_counts: list[int]
) -> tuple[list, list[int]]:
    """Images and videos (and their placeholder counts) merged in their markers' order (`is_video`: per
    `<image>`/`<video>` marker, chat.picture_order)."""
    its = iter(zip(images, counts, strict=True))
    vs = iter(zip(videos, video_counts, strict=True))
    merged = [next(vs) if v else next(its) for v in is_video]
    return [m for m, _ in merged], [n for _, n in merged]


def _loaded_error(s: EncodedSample, detail: str) -> DataError:
    # The LLM side accepted this clip from its header; skipping here would misalign the lanes
    return DataError(f"{describe(*_source(s))}: {detail}; remove or fix the sample")


def pack_encoded(samples: list[EncodedSample]) -> EncodedSample:
    """Encoded samples end to end as one: tokens, targets and images in order, `lengths` saying where each
    sample ends. Its key joins theirs with '+' (checked on both sides of the bridge like any key)."""
    first = samples[0]
    return EncodedSample.derive_from(
        first,
        __key__="+".join(str(s.__key__) for s in samples),
        tokens=[t for s in samples for t in s.tokens],
        targets=[t for s in samples for t in s.targets],
        image_token_count=sum(s.image_token_count for s in samples),
        images=[im for s in samples for im in s.images],
        image_tokens=[n for s in samples for n in s.image_tokens],
        audio_token_count=sum(s.audio_token_count for s in samples),
        audio=[c for s in samples for c in s.audio],
        audio_tokens=[n for s in samples for n in s.audio_tokens],
        lengths=[n for s in samples for n in s.lengths],
        truncated=any(s.truncated for s in samples),
    )


class PackingTaskEncoder(MimoTaskEncoder):
    """MimoTaskEncoder with energon's packing hooks, active when the dataset is built with
    `packing_buffer_size`: from each full buffer, packing.select_packs chooses the samples that share a row
    and pack_encoded lays them end to end. encode_sample and the final packer are stateless (their output
    is a function of their input), which energon needs to restore the samples a checkpointed packing
    buffer holds."""

    @stateless
    def encode_sample(self, sample: Sample) -> EncodedSample:
        return super().encode_sample(sample)

    def select_samples_to_pack(self, samples: list[EncodedSample]) -> list[list[EncodedSample]]:
        packs = select_packs([len(s.tokens) for s in samples], self.cfg.seq_length)
        return [[samples[i] for i in p] for p in packs]

    @stateless
    def pack_selected_samples(self, samples: list[EncodedSample]) -> EncodedSample:
        return pack_encoded(samples)


def make_task_encoder(tokenizer: Tokenizer, cfg: EncodeConfig) -> MimoTaskEncoder:
    """The task encoder of a data setting: packing or not (the one place that chooses)."""
    return (PackingTaskEncoder if cfg.packing else MimoTaskEncoder)(tokenizer, cfg)

"""Instruction samples -> token ids and per-token target flags (pure; no energon, no torch).

Two layouts, one rule for the loss: a token is a *target* when the model is trained to produce it.
  plain   BOS, image placeholders, prompt, response, EOS          targets: response + EOS
  chat    the tokenizer's chat template over the turns            targets: what follows each assistant
          turn's generation prompt (its content and end-of-turn text), nothing else
  interleaved  BOS, text pieces and image placeholders in order, EOS      targets: every text token + EOS
  marked  BOS, the text with each <image>/<audio> marker replaced by that image's or clip's placeholders,
          EOS                                                     targets: every text token + EOS
          (also a conversation of assistant turns only, with or without a chat template: nothing prompts it)

The chat layout finds each assistant turn as character spans of the rendered text: the rendering of the
turns before it with the generation prompt, and the rendering up to and including it, must be prefixes of
the whole (true of ChatML-like templates; a template that rewrites earlier turns is refused). Tokens are
marked from the fast tokenizer's character offsets, so a token is a target exactly when it starts inside an
assistant span. `<image>` in a turn's text marks where an image's placeholder tokens go, and `<audio>`
where an audio clip's go (when the tokenizer has an audio placeholder, i.e. the model an audio encoder;
otherwise `<audio>` is text like any other), and `<video>` where a video's go (image placeholders: the image
module embeds its frames; one marker per video, never placed by guess).
"""

from __future__ import annotations

import re

from .audio import AUDIO_MARKER
from .errors import DataError
from .tokenizer import Tokenizer

IMAGE_MARKER = "<image>"
VIDEO_MARKER = "<video>"  # a video's place: its frames go to the image module, its placeholders are images'
_MARKERS = re.compile(f"({re.escape(IMAGE_MARKER)}|{re.escape(VIDEO_MARKER)}|{re.escape(AUDIO_MARKER)})")
_IMAGE_ONLY = re.compile(f"({re.escape(IMAGE_MARKER)}|{re.escape(VIDEO_MARKER)})")
_PICTURES = re.compile(f"{re.escape(IMAGE_MARKER)}|{re.escape(VIDEO_MARKER)}")
ROLES = {"user": "user", "human": "user", "assistant": "assistant", "gpt": "assistant", "system": "system"}


def normalize_turns(raw: object) -> list[dict]:
    """[{role, content}] from the OpenAI-style ({role, content}) or LLaVA-style ({from, value}) form."""
    if not isinstance(raw, list) or not raw:
        raise ValueError("field 'conversation' must be a non-empty list of turns")
    turns = []
    for i, t in enumerate(raw):
        if not isinstance(t, dict):
            raise ValueError(f"conversation turn {i} is {type(t).__name__}, expected an object")
        role, content = t.get("role", t.get("from")), t.get("content", t.get("value"))
        if role not in ROLES:
            raise ValueError(f"conversation turn {i} has role {role!r}; expected one of {sorted(ROLES)}")
        if not isinstance(content, str):
            raise ValueError(f"conversation turn {i} has no text content")
        turns.append({"role": ROLES[role], "content": content})
    if not any(t["role"] == "assistant" for t in turns):
        raise ValueError("conversation has no assistant turn: nothing to train on")
    return turns


def place_images(turns: list[dict], n_images: int) -> list[dict]:
    """Put one marker per image: as written in the turns, or (none written) before the first user text."""
    n = sum(t["content"].count(IMAGE_MARKER) for t in turns)
    if n == n_images:
        return turns
    if n == 0:
        out = [dict(t) for t in turns]
        first = next((t for t in out if t["role"] == "user"), out[0])
        first["content"] = (IMAGE_MARKER + "\n") * n_images + first["content"]
        return out
    raise ValueError(f"the text has {n} {IMAGE_MARKER} marker(s) but the sample has {n_images} image(s)")


def document_text(turns: list[dict], n_images: int) -> str:
    """The text of a conversation of assistant turns only, for the marked layout (a document): its
    turns' contents joined by newlines, with one `<image>` marker per image (place_images: none written, all
    of them first)."""
    return "\n".join(t["content"] for t in place_images(turns, n_images))


def check_video_markers(text: str, n_videos: int) -> None:
    """One `<video>` marker per video, in the text (a video is never placed by guess)."""
    n = text.count(VIDEO_MARKER)
    if n != n_videos:
        raise ValueError(f"the text has {n} {VIDEO_MARKER} marker(s) but the sample has {n_videos} video(s)")


def picture_order(text: str) -> list[bool]:
    """Per `<image>` or `<video>` marker of the text, in order: is it a video's (the image module embeds
    images and videos in this order, as their placeholders stand)."""
    return [m.group(0) == VIDEO_MARKER for m in _PICTURES.finditer(text)]


def check_audio_markers(tok: Tokenizer, text: str, n_clips: int) -> None:
    """One `<audio>` marker per clip, in the text (a clip is never placed by guess); with no audio
    placeholder (no audio encoder) `<audio>` is text and a clip has nowhere to go."""
    if tok.audio_token_id is None:
        if n_clips:
            raise ValueError(f"the sample has {n_clips} audio clip(s) but the model has no audio encoder")
        return
    n = text.count(AUDIO_MARKER)
    if n != n_clips:
        raise ValueError(
            f"the text has {n} {AUDIO_MARKER} marker(s) but the sample has {n_clips} audio clip(s)"
        )


def _split(tok: Tokenizer, text: str) -> list[str]:
    """Text pieces and markers alternating (even indices text, odd a marker); `<audio>` is a marker only
    when the tokenizer has an audio placeholder."""
    return (_IMAGE_ONLY if tok.audio_token_id is None else _MARKERS).split(text)


def _placeholders(tok: Tokenizer, marker: str, images, clips, videos=iter(())) -> list[int]:
    if marker == IMAGE_MARKER:
        return [tok.image_token_id] * next(images)
    if marker == VIDEO_MARKER:  # the image module's placeholders: its embeddings of the frames
        return [tok.image_token_id] * next(videos)
    return [tok.audio_token_id] * next(clips)


def marked_layout(
    tok: Tokenizer,
    text: str,
    image_tokens: list[int],
    audio_tokens: list[int],
    video_tokens: list[int] = (),
) -> tuple[list[int], list[bool]]:
    """A text whose markers say where each image, clip and video goes: BOS, text pieces (targets) and, at the
    i-th `<image>` / j-th `<audio>` / k-th `<video>`, image i's / clip j's / video k's placeholders (not
    targets), EOS (a target)."""
    n_img = text.count(IMAGE_MARKER)
    if n_img != len(image_tokens):
        raise ValueError(
            f"the text has {n_img} {IMAGE_MARKER} marker(s) but the sample has {len(image_tokens)} image(s)"
        )
    check_audio_markers(tok, text, len(audio_tokens))
    check_video_markers(text, len(video_tokens))
    ids, flags = [tok.bos_id], [False]
    images, clips, videos = iter(image_tokens), iter(audio_tokens), iter(video_tokens)
    for k, part in enumerate(_split(tok, text)):
        if k % 2:
            held = _placeholders(tok, part, images, clips, videos)
            ids += held
            flags += [False] * len(held)
        else:
            t = tok.encode(part)
            ids += t
            flags += [True] * len(t)
    return ids + [tok.eos_id], flags + [True]


def plain_layout(
    tok: Tokenizer, prompt: str, response: str, image_tokens: int
) -> tuple[list[int], list[bool]]:
    head = [tok.bos_id] + [tok.image_token_id] * image_tokens + tok.encode(prompt)
    body = tok.encode(response) + [tok.eos_id]
    return head + body, [False] * len(head) + [True] * len(body)


def interleaved_layout(
    tok: Tokenizer, pieces: list[str | None], image_tokens: list[int]
) -> tuple[list[int], list[bool]]:
    """Interleaved image-text (a document): BOS, then each piece in order, text (targets) or, where the
    piece is None, the next image's placeholders (not targets), then EOS (a target)."""
    if len(image_tokens) != sum(p is None for p in pieces):
        raise ValueError(f"{sum(p is None for p in pieces)} image slot(s) but {len(image_tokens)} image(s)")
    ids, flags = [tok.bos_id], [False]
    images = iter(image_tokens)
    for p in pieces:
        if p is None:
            n = next(images)
            ids += [tok.image_token_id] * n
            flags += [False] * n
        else:
            t = tok.encode(p)
            ids += t
            flags += [True] * len(t)
    return ids + [tok.eos_id], flags + [True]


def _assistant_spans(tok: Tokenizer, turns: list[dict], full: str) -> list[tuple[int, int]]:
    spans = []
    for k, t in enumerate(turns):
        if t["role"] != "assistant":
            continue
        before = tok.render_chat(turns[:k], add_generation_prompt=True)
        upto = tok.render_chat(turns[: k + 1], add_generation_prompt=False)
        if not (upto.startswith(before) and full.startswith(upto)):
            raise DataError(
                f"tokenizer {tok.name}: its chat template renders earlier turns differently once later "
                "turns follow, so the assistant tokens cannot be found; use a prefix-stable template"
            )
        spans.append((len(before), len(upto)))
    return spans


def chat_layout(
    tok: Tokenizer,
    turns: list[dict],
    image_tokens: list[int],
    audio_tokens: list[int] = (),
    video_tokens: list[int] = (),
) -> tuple[list[int], list[bool]]:
    """Render turns with the chat template; image i's marker becomes image_tokens[i] placeholder ids, clip
    j's `<audio>` marker audio_tokens[j] and video k's `<video>` marker video_tokens[k] image placeholders
    (one marker per clip and per video, written in the turns)."""
    turns = place_images(turns, len(image_tokens))
    check_audio_markers(tok, "".join(t["content"] for t in turns), len(audio_tokens))
    check_video_markers("".join(t["content"] for t in turns), len(video_tokens))
    full = tok.render_chat(turns, add_generation_prompt=False)
    spans = _assistant_spans(tok, turns, full)
    ids: list[int] = []
    flags: list[bool] = []
    base = 0
    images, clips, videos = iter(image_tokens), iter(audio_tokens), iter(video_tokens)
    for k, part in enumerate(_split(tok, full)):
        if k % 2:
            held = _placeholders(tok, part, images, clips, videos)
            ids += held
            flags += [False] * len(held)
        else:
            p_ids, offs = tok.encode_offsets(part)
            ids += p_ids
            flags += [any(a <= base + s < b for a, b in spans) for s, _ in offs]
        base += len(part)
    if not any(flags):
        raise ValueError("the assistant turns render to no tokens: nothing to train on")
    return ids, flags

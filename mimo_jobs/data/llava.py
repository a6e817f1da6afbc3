"""One record of a LLaVA/ShareGPT-style JSONL file, checked (pure: no I/O, no energon).

A record is a JSON object on one line:

  {"id": "...", "image": "rel/path.jpg" (optional; or a list of paths),
   "audio": "rel/clip.npy" (optional; or a list; `.npy` log-mel or `.wav`: data/audio_input.py),
   "video": ["rel/f0.png", "rel/f1.png", ...] (optional: one video, its frames in time order; or "rel/clip.mp4",
            a video file; several videos: a list whose items are each a frame list or a video file, or a
            list of video files only, each named by a VIDEO_SUFFIXES suffix),
   "conversations": [{"from": "human", "value": "<image>\\nWhat ...?"}, {"from": "gpt", "value": "..."}]}

The turns must be what the task encoder trains on (chat.normalize_turns: roles human/gpt/system or
user/assistant, text content, an assistant turn), and the `<image>` markers must fit the images
(chat.place_images: one per image, or none and they go before the first user text). An image path is
relative to the image folder and stays inside it (no absolute path, no `..`); so is an audio path, and the
`<audio>` markers must be one per clip (never placed by guess), and so must the `<video>` markers per video.
Any other key is reported in `unknown`.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import PurePosixPath

from .audio import AUDIO_MARKER
from .chat import VIDEO_MARKER, normalize_turns, place_images


class BadRecord(ValueError):
    """A record that cannot become a sample; the message says which field and which rule."""


@dataclass(frozen=True)
class Record:
    id: object  # the record's own "id" (any JSON value), kept in the sample's JSON member
    conversations: list  # as written: LLaVA's {"from", "value"} turns
    images: tuple[str, ...]  # paths relative to the image folder, in marker order
    audio: tuple[
        str, ...
    ] = ()  # audio files (.npy log-mel, .wav), relative to the same folder, in marker order
    unknown: tuple[str, ...] = ()  # keys the record has that nothing reads (warned about, never silent)
    # videos in `<video>` marker order: each its frames' paths in time order, or (a str) a video file's path
    videos: tuple = ()


KNOWN_KEYS = ("id", "image", "audio", "video", "conversations")


def _image_paths(value: object, key: str = "image") -> tuple[str, ...]:
    if value is None:
        return ()
    paths = value if isinstance(value, list) else [value]
    if not paths:
        raise BadRecord(f'field "{key}" is an empty list; leave it out for a record without one')
    out = []
    for i, p in enumerate(paths):
        where = f'field "{key}"' + (f" item {i}" if isinstance(value, list) else "")
        if not isinstance(p, str) or not p.strip():
            raise BadRecord(f"{where} is {p!r}; expected a path relative to the image folder")
        pp = PurePosixPath(p.replace("\\", "/"))
        if pp.is_absolute() or ".." in pp.parts:
            raise BadRecord(f"{where} {p!r} leaves the image folder; give a path relative to it")
        out.append(str(pp))
    return tuple(out)


# How a flat list of paths names video files rather than one video's frames (a frame is a PNG/JPEG/WebP
# image): FFmpeg's usual containers for camera and web video.
VIDEO_SUFFIXES = (".mp4", ".m4v", ".mov", ".mkv", ".webm", ".avi", ".mpg", ".mpeg", ".ts")


def _is_video_file(p: object) -> bool:
    return isinstance(p, str) and p.lower().endswith(VIDEO_SUFFIXES)


def _videos(value: object) -> tuple:
    """A record's "video": one video (a list of frame paths, or a video file's path) or several (a list of
    frame lists and video files, or a list of video files only)."""
    if value is None:
        return ()
    if isinstance(value, str):  # a video file
        return _image_paths(value, "video")[:1]
    if (
        isinstance(value, list)
        and value
        and (any(isinstance(v, list) for v in value) or all(_is_video_file(v) for v in value))
    ):
        out = []
        for i, v in enumerate(value):
            if isinstance(v, list) and not v:
                raise BadRecord(f'field "video" item {i} is an empty list; a video needs at least one frame')
            if isinstance(v, list):
                out.append(_image_paths(v, f"video item {i}"))
            else:  # a video file
                out.append(_image_paths(v, f"video item {i}")[0])
        return tuple(out)
    if isinstance(value, list) and not value:
        raise BadRecord(
            'field "video" is an empty list; give its frames, or leave it out for a record without'
        )
    if isinstance(value, list) and any(_is_video_file(v) for v in value):
        i = next(i for i, v in enumerate(value) if _is_video_file(v))
        raise BadRecord(
            f'field "video" item {i} {value[i]!r} is a video file among frames; give several videos as a '
            'list of frame lists and video files (e.g. [["f0.png", "f1.png"], "clip.mp4"])'
        )
    return (_image_paths(value, "video"),)


def _json(line: str) -> object:
    """The line's JSON value; BadRecord for what is not JSON or cannot be a record's text."""
    try:
        doc = json.loads(line)
    except json.JSONDecodeError as e:
        raise BadRecord(f"not JSON ({e.msg} at column {e.colno})") from None
    except RecursionError:
        raise BadRecord(
            "JSON nested too deep for Python to read; a record is a flat object of turns"
        ) from None
    except ValueError:  # the only other ValueError: an integer beyond Python's digit limit
        raise BadRecord(
            f"a JSON integer of more than {sys.get_int_max_str_digits():,} digits; no record field needs one"
        ) from None
    try:
        json.dumps(doc, ensure_ascii=False).encode("utf-8")
    except RecursionError:
        raise BadRecord(
            "JSON nested too deep for Python to read; a record is a flat object of turns"
        ) from None
    except UnicodeEncodeError as e:
        raise BadRecord(
            f"a lone surrogate {e.object[e.start]!r} in its text (a \\ud800-\\udfff escape not in a "
            "pair): no tokenizer can encode it"
        ) from None
    return doc


def parse_record(line: str) -> Record:
    """The record of one non-blank JSONL line; BadRecord naming the field and the rule."""
    doc = _json(line)
    if not isinstance(doc, dict):
        raise BadRecord(f'a JSON {type(doc).__name__}, expected an object with "conversations"')
    if "conversations" not in doc:
        raise BadRecord('no "conversations" field (a list of {"from", "value"} turns)')
    images = _image_paths(doc.get("image"))
    audio = _image_paths(doc.get("audio"), "audio")
    try:
        turns = normalize_turns(doc["conversations"])
        place_images(turns, len(images))
    except ValueError as e:
        raise BadRecord(str(e).replace("field 'conversation'", 'field "conversations"')) from None
    # one marker per clip, as the task encoder checks (chat.check_audio_markers): a clip is never placed by guess
    n = sum(t["content"].count(AUDIO_MARKER) for t in turns)
    if n != len(audio):
        raise BadRecord(
            f'the text has {n} {AUDIO_MARKER} marker(s) but field "audio" gives {len(audio)} clip(s); '
            f"write one {AUDIO_MARKER} where each clip goes"
        )
    videos = _videos(doc.get("video"))
    n = sum(t["content"].count(VIDEO_MARKER) for t in turns)
    if n != len(videos):
        raise BadRecord(
            f'the text has {n} {VIDEO_MARKER} marker(s) but field "video" gives {len(videos)} video(s); '
            f"write one {VIDEO_MARKER} where each video goes"
        )
    unknown = tuple(k for k in doc if k not in KNOWN_KEYS)
    return Record(doc.get("id"), doc["conversations"], images, audio, unknown, videos)

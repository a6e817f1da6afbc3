"""What a raw webdataset sample becomes before the task encoder sees it (imports energon: trainer side).

- MemberDecoder: JSON members (`.json`, `.jsn`) are parsed, so a dataset.yaml field_map such as
  `context: json[context]` reads into them, as energon's own loader allows; every other member stays
  encoded bytes (images are decoded later, and only on encoder ranks; text is decoded by the task
  encoder, which names the sample when it is not UTF-8).
- ConversationSample: a list of turns and an optional image (or several) and audio clips, for energon's
  dataset.yaml `sample_type: {__module__: mimo_jobs.data.samples, __class__: ConversationSample}`.
- MediaSample: a text whose `<image>` and `<audio>` markers say where each image and audio clip goes
  (`sample_type: {__module__: mimo_jobs.data.samples, __class__: MediaSample}`): what `data synth --audio`
  wrote before it wrote ConversationSample as `data prepare` does; kept so such datasets still read.
- Sample loaders for samples with several images or clips, or with some members only on some samples,
  which a field_map (one member per field, on every sample) cannot express: energon's dataset.yaml names
  them with `sample_loader: sample_loader.py:sample_loader` and `part_filter: sample_loader.py:part_filter`
  (a file in the dataset's .nv-meta that imports these). The members are numbered images (`<key>.0.png`,
  `<key>.1.png`, ...) and audio clips, float32 log-mel `.npy` arrays: numbered (`<key>.0.npy`,
  `<key>.1.npy`, ...) or, a sample's one clip, `<key>.audio.npy`, and videos' frames (`<key>.v0.0.png`,
  `<key>.v0.1.png`, ...: video 0's frames in time order, then `v1`); and
    conversation_images  ConversationSample: JSON (`<key>.json`) {"conversation": turns}; image i goes where
                         the i-th `<image>` marker is, clip j where the j-th `<audio>` is, video k
                         where the k-th `<video>` is
    interleaved_images   energon's InterleavedSample: JSON {"sequence": [text, {"image": i}, text, ...]}
    media_members        MediaSample: the text `<key>.txt`, and the images and clips (none, some or both)
"""

from __future__ import annotations

import json
import re
from typing import Any

from megatron.energon import Sample, edataclass
from megatron.energon.cache import FileStoreDecoder

JSON_EXTS = ("json", "jsn")
NUMBERED_IMAGE = re.compile(r"(\d+)\.(png|jpg|jpeg|webp)")
NUMBERED_AUDIO = re.compile(r"(\d+)\.npy")
NUMBERED_FRAME = re.compile(r"v(\d+)\.(\d+)\.(png|jpg|jpeg|webp)")  # video v's frame f: `<key>.v<v>.<f>.png`
AUDIO_MEMBER = "audio.npy"  # a sample's one clip, when it is not numbered
TEXT_MEMBER = "txt"


def _ext(name: str) -> str:
    return name.rsplit(".", 1)[-1].lower()


def _parse(name: str, raw: Any) -> Any:
    if not isinstance(raw, (bytes, bytearray)):
        return raw
    try:
        return json.loads(bytes(raw).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"member {name!r} is not valid UTF-8 JSON ({e})") from None


class MemberDecoder(FileStoreDecoder):
    def decode(self, fname: str, data: bytes) -> Any:
        return _parse(fname, data) if _ext(fname) in JSON_EXTS else data

    def __call__(self, sample: dict) -> dict:
        return {
            k: (_parse(k, v) if not k.startswith("__") and _ext(k) in JSON_EXTS else v)
            for k, v in sample.items()
        }

    def config(self) -> dict:
        return {"decoder": "mimo_jobs.json-members"}


@edataclass
class ConversationSample(Sample):
    #: turns: [{"role": "user"|"assistant"|"system", "content": str}] (or LLaVA's {"from", "value"})
    conversation: list
    #: encoded image bytes, or a list of them; image i's placeholders go where the text has its i-th <image>
    #: marker (no marker written: all of them before the first user turn)
    image: Any = None
    #: `.npy` audio clips (bytes), a list in `<audio>` marker order; one marker per clip, written in the turns
    audio: Any = None
    #: videos, a list in `<video>` marker order, each the list of its frames' encoded image bytes in time
    #: order; one marker per video, written in the turns; the image module embeds them
    video: Any = None


@edataclass
class MediaSample(Sample):
    #: the text trained on; each `<image>` / `<audio>` marker is where the next image's / clip's
    #: placeholders go (one marker per image and per clip)
    text: Any
    #: encoded image bytes, or a list of them, in `<image>` marker order
    image: Any = None
    #: `.npy` audio clips (bytes), or a list of them, in `<audio>` marker order
    audio: Any = None


def part_filter(part: str) -> bool:
    """The members these sample loaders read: the JSON, the text, the numbered images and the clips."""
    return (
        part in JSON_EXTS
        or part in (TEXT_MEMBER, AUDIO_MEMBER)
        or NUMBERED_IMAGE.fullmatch(part) is not None
        or NUMBERED_AUDIO.fullmatch(part) is not None
        or NUMBERED_FRAME.fullmatch(part) is not None
    )


def _member(raw: dict) -> dict:
    member = next((raw[e] for e in JSON_EXTS if e in raw), None)
    if not isinstance(member, dict):
        raise ValueError("the sample has no JSON member (<key>.json) holding an object")
    return member


def _numbered(raw: dict, pattern: re.Pattern, what: str) -> list:
    """The members `pattern` numbers, in number order; numbers must run 0, 1, ... without gaps."""
    found = {int(m.group(1)): raw[k] for k in raw if (m := pattern.fullmatch(k))}
    if sorted(found) != list(range(len(found))):
        raise ValueError(f"{what} members are numbered {sorted(found)}; expected 0..{len(found) - 1}")
    return [found[i] for i in range(len(found))]


def _numbered_images(raw: dict) -> list:
    return _numbered(raw, NUMBERED_IMAGE, "image")


def _clips(raw: dict) -> list:
    """The audio clips: `audio.npy` (one), or `0.npy`, `1.npy`, ... (in number order); never both."""
    clips = _numbered(raw, NUMBERED_AUDIO, "audio")
    if AUDIO_MEMBER in raw:
        if clips:
            raise ValueError(
                f"the sample has both {AUDIO_MEMBER} and numbered .npy members; name its clips one way"
            )
        return [raw[AUDIO_MEMBER]]
    return clips


def _videos(raw: dict) -> list:
    """The videos, each its frames in order: `v0.0.png`, `v0.1.png`, ..., `v1.0.png`, ...; videos and each
    video's frames numbered from 0 without gaps."""
    found: dict[int, dict[int, Any]] = {}
    for k in raw:
        if m := NUMBERED_FRAME.fullmatch(k):
            found.setdefault(int(m.group(1)), {})[int(m.group(2))] = raw[k]
    if sorted(found) != list(range(len(found))):
        raise ValueError(f"video members are numbered {sorted(found)}; expected v0..v{len(found) - 1}")
    out = []
    for v in range(len(found)):
        frames = found[v]
        if sorted(frames) != list(range(len(frames))):
            raise ValueError(
                f"video {v}'s frames are numbered {sorted(frames)}; expected 0..{len(frames) - 1}"
            )
        out.append([frames[f] for f in range(len(frames))])
    return out


def conversation_images(raw: dict) -> dict:
    """sample_loader of a ConversationSample with numbered images (and clips, and videos' frames)."""
    member = _member(raw)
    if "conversation" not in member:
        raise ValueError("the JSON member has no 'conversation'")
    images = _numbered_images(raw)
    return {
        "conversation": member["conversation"],
        "image": images or None,
        "audio": _clips(raw) or None,
        "video": _videos(raw) or None,
    }


def media_members(raw: dict) -> dict:
    """sample_loader of a MediaSample: the text member and whatever images and clips the sample has."""
    if TEXT_MEMBER not in raw:
        raise ValueError(f"the sample has no text member (<key>.{TEXT_MEMBER})")
    return {"text": raw[TEXT_MEMBER], "image": _numbered_images(raw) or None, "audio": _clips(raw) or None}


def interleaved_images(raw: dict) -> dict:
    """sample_loader of energon's InterleavedSample: the JSON's sequence with each {"image": i} replaced by
    image member i (text stays str, images stay encoded bytes)."""
    seq = _member(raw).get("sequence")
    if not isinstance(seq, list):
        raise ValueError("the JSON member has no 'sequence' list")
    images = _numbered_images(raw)
    out: list = []
    for k, item in enumerate(seq):
        if isinstance(item, str):
            out.append(item)
        elif (
            isinstance(item, dict) and isinstance(item.get("image"), int) and 0 <= item["image"] < len(images)
        ):
            out.append(images[item["image"]])
        else:
            raise ValueError(
                f'sequence item {k} is {item!r}; expected text or {{"image": i}} with 0 <= i < {len(images)}'
            )
    return {"sequence": out}

"""What a raw webdataset sample becomes before the task encoder sees it (imports energon: trainer side).

- MemberDecoder: JSON members (`.json`, `.jsn`) are parsed, so a dataset.yaml field_map such as
  `context: json[context]` reads into them, as energon's own loader allows; every other member stays
  encoded bytes (images are decoded later, and only on encoder ranks; text is decoded by the task
  encoder, which names the sample when it is not UTF-8).
- ConversationSample: a list of turns and an optional image (or several), for energon's dataset.yaml
  `sample_type: {__module__: mimo_jobs.data.samples, __class__: ConversationSample}`.
- Sample loaders for samples with several images, which a field_map (one member per field) cannot express:
  energon's dataset.yaml names them with `sample_loader: sample_loader.py:sample_loader` and
  `part_filter: sample_loader.py:part_filter` (a file in the dataset's .nv-meta that imports these). The
  members are one JSON (`<key>.json`) and numbered images (`<key>.0.png`, `<key>.1.png`, ...):
    conversation_images  ConversationSample: JSON {"conversation": turns}; image i goes where the i-th
                         `<image>` marker is
    interleaved_images   energon's InterleavedSample: JSON {"sequence": [text, {"image": i}, text, ...]}
"""

from __future__ import annotations

import json
import re
from typing import Any

from megatron.energon import Sample, edataclass
from megatron.energon.cache import FileStoreDecoder

JSON_EXTS = ("json", "jsn")
NUMBERED_IMAGE = re.compile(r"(\d+)\.(png|jpg|jpeg|webp)")


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


def part_filter(part: str) -> bool:
    """The members a multi-image sample loader reads: the JSON and the numbered images."""
    return part in JSON_EXTS or NUMBERED_IMAGE.fullmatch(part) is not None


def _member(raw: dict) -> dict:
    member = next((raw[e] for e in JSON_EXTS if e in raw), None)
    if not isinstance(member, dict):
        raise ValueError("the sample has no JSON member (<key>.json) holding an object")
    return member


def _numbered_images(raw: dict) -> list:
    """The numbered image members in number order; numbers must run 0, 1, ... without gaps."""
    found = {int(m.group(1)): raw[k] for k in raw if (m := NUMBERED_IMAGE.fullmatch(k))}
    if sorted(found) != list(range(len(found))):
        raise ValueError(f"image members are numbered {sorted(found)}; expected 0..{len(found) - 1}")
    return [found[i] for i in range(len(found))]


def conversation_images(raw: dict) -> dict:
    """sample_loader of a ConversationSample with numbered images."""
    member = _member(raw)
    if "conversation" not in member:
        raise ValueError("the JSON member has no 'conversation'")
    images = _numbered_images(raw)
    return {"conversation": member["conversation"], "image": images or None}


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

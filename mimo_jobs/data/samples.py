"""What a raw webdataset sample becomes before the task encoder sees it (imports energon: trainer side).

- MemberDecoder: JSON members (`.json`, `.jsn`) are parsed, so a dataset.yaml field_map such as
  `context: json[context]` reads into them, as energon's own loader allows; every other member stays
  encoded bytes (images are decoded later, and only on encoder ranks; text is decoded by the task
  encoder, which names the sample when it is not UTF-8).
- ConversationSample: a list of turns and an optional image, for energon's dataset.yaml
  `sample_type: {__module__: mimo_jobs.data.samples, __class__: ConversationSample}`.
"""

from __future__ import annotations

import json
from typing import Any

from megatron.energon import Sample, edataclass
from megatron.energon.cache import FileStoreDecoder

JSON_EXTS = ("json", "jsn")


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
    #: encoded image bytes; its placeholder goes where the text says <image> (else before the first user turn)
    image: Any = None

"""Tokenizers for the energon task encoder.

Built-in: a character tokenizer for the synthetic data (fits the tiny presets' vocab of 128): specials
PAD/BOS/EOS/UNK, the image placeholder (and, for a model with an audio encoder, the audio placeholder), then
printable ASCII. Otherwise a HuggingFace tokenizer from a
local directory (optional import of `transformers`); its image placeholder is its own `<image>` token
when it has one, else the configured id, which must then lie outside the ids the tokenizer emits (the
audio placeholder likewise, with `<audio>`). A
tokenizer with a chat template renders instruction samples as conversations (see chat.py); the built-in
one has none, so its samples keep the plain layout BOS, image, prompt, response, EOS.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from .errors import DataError

PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3
PRINTABLE = [chr(c) for c in range(32, 127)]
NO_TEMPLATE = (
    "conversation samples need a tokenizer with a chat template: set trainer.data.tokenizer to a local "
    "HuggingFace tokenizer directory that has one (tokenizer_config.json or chat_template.jinja)"
)


class Tokenizer(Protocol):
    name: str
    vocab_size: int
    pad_id: int
    bos_id: int
    eos_id: int
    image_token_id: int
    audio_token_id: int | None  # None: no audio placeholder (the model has no audio encoder)

    chat_template: str | None

    def encode(self, text: str) -> list[int]: ...

    def encode_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]: ...

    def render_chat(self, turns: list[dict], add_generation_prompt: bool) -> str: ...


@dataclass
class CharTokenizer:
    """Printable ASCII -> one id each; anything else -> UNK. Ids skip the image placeholder id."""

    vocab_size: int
    image_token_id: int
    name: str = "builtin-char"
    pad_id: int = PAD_ID
    bos_id: int = BOS_ID
    eos_id: int = EOS_ID
    unk_id: int = UNK_ID
    chat_template: str | None = None
    audio_token_id: int | None = None

    def __post_init__(self) -> None:
        audio = self.audio_token_id is not None
        need = len(PRINTABLE) + 5 + audio
        if self.vocab_size < need:
            raise DataError(
                f"built-in tokenizer needs vocab_size >= {need} (4 specials + image "
                + ("+ audio " if audio else "")
                + f"+ {len(PRINTABLE)} characters); the model has {self.vocab_size}: "
                "choose a larger preset or give trainer.data.tokenizer"
            )
        for what, i in (("image", self.image_token_id), ("audio", self.audio_token_id)):
            if i is not None and (not 0 <= i < self.vocab_size or i in (PAD_ID, BOS_ID, EOS_ID, UNK_ID)):
                raise DataError(f"{what}_token_id={i} must be in [4, {self.vocab_size}) and not a special id")
        if audio and self.audio_token_id == self.image_token_id:
            raise DataError(f"audio_token_id={self.audio_token_id} is the image placeholder too")
        placeholders = (self.image_token_id, self.audio_token_id)
        ids = [i for i in range(4, self.vocab_size) if i not in placeholders]
        self._table = dict(zip(PRINTABLE, ids))

    def encode(self, text: str) -> list[int]:
        t = self._table
        return [t.get(c, self.unk_id) for c in text]

    def encode_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        return self.encode(text), [(i, i + 1) for i in range(len(text))]

    def render_chat(self, turns: list[dict], add_generation_prompt: bool) -> str:
        raise DataError(f"{self.name}: {NO_TEMPLATE}")

    def decode(self, ids: list[int]) -> str:
        inv = {v: k for k, v in self._table.items()}
        return "".join(inv.get(i, "?") for i in ids)


class HFTokenizer:
    """A HuggingFace tokenizer loaded from a local path (no network)."""

    def __init__(self, path: str, vocab_size: int, image_token_id: int, audio_token_id: int | None = None):
        try:
            from transformers import AutoTokenizer
        except ImportError:
            raise DataError(
                f"trainer.data.tokenizer={path!r} needs the `transformers` package "
                "(pip install transformers), or leave it unset for the built-in tokenizer"
            ) from None
        if not Path(path).exists():
            raise DataError(f"trainer.data.tokenizer={path!r}: no such local directory")
        tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
        self._tok = tok
        self.name = f"hf:{path}"
        self.vocab_size = len(tok)
        if self.vocab_size > vocab_size:
            raise DataError(
                f"tokenizer {path!r} has {self.vocab_size} ids but the model's vocab_size is "
                f"{vocab_size}; choose a preset with vocab_size >= {self.vocab_size}"
            )
        img = tok.convert_tokens_to_ids("<image>") if "<image>" in tok.get_vocab() else None
        self.image_token_id = img if img is not None else image_token_id
        if img is None and image_token_id < self.vocab_size:
            raise DataError(
                f"tokenizer {path!r} has no <image> token and image_token_id={image_token_id} "
                f"collides with its ids [0, {self.vocab_size}); use an id >= {self.vocab_size}"
            )
        self.audio_token_id = None
        if audio_token_id is not None:
            own = tok.convert_tokens_to_ids("<audio>") if "<audio>" in tok.get_vocab() else None
            self.audio_token_id = own if own is not None else audio_token_id
            if own is None and audio_token_id < self.vocab_size:
                raise DataError(
                    f"tokenizer {path!r} has no <audio> token and audio_token_id={audio_token_id} "
                    f"collides with its ids [0, {self.vocab_size}); use an id >= {self.vocab_size}"
                )
            if self.audio_token_id == self.image_token_id:
                raise DataError(
                    f"tokenizer {path!r}: the audio and image placeholders are both id {self.audio_token_id}"
                )
        self.bos_id = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
        self.eos_id = tok.eos_token_id if tok.eos_token_id is not None else self.bos_id
        self.pad_id = tok.pad_token_id if tok.pad_token_id is not None else self.eos_id
        if self.bos_id is None:
            raise DataError(f"tokenizer {path!r} defines neither a BOS nor an EOS token")
        self.chat_template = getattr(tok, "chat_template", None) or None
        if self.chat_template is not None and not getattr(tok, "is_fast", False):
            raise DataError(
                f"tokenizer {path!r} is a slow (Python) tokenizer: conversation samples need the token "
                "offsets only a fast tokenizer (tokenizer.json) gives"
            )

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False))

    def encode_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        enc = self._tok(text, add_special_tokens=False, return_offsets_mapping=True)
        return list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]

    def render_chat(self, turns: list[dict], add_generation_prompt: bool) -> str:
        if self.chat_template is None:
            raise DataError(f"{self.name}: {NO_TEMPLATE}")
        return self._tok.apply_chat_template(
            turns, tokenize=False, add_generation_prompt=add_generation_prompt
        )


def load_tokenizer(
    path: str | None, vocab_size: int, image_token_id: int, audio_token_id: int | None = None
) -> Tokenizer:
    if path:
        return HFTokenizer(path, vocab_size, image_token_id, audio_token_id)
    return CharTokenizer(vocab_size=vocab_size, image_token_id=image_token_id, audio_token_id=audio_token_id)

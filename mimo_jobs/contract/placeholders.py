"""Each encoder module's placeholder token id, by its input kind and the vocabulary: what both data
providers write into the tokens, the trainer's step scatters embeddings at, and `validate` checks the
vocabulary has room for (study/runtime_rules.py). Pure."""

from __future__ import annotations


def audio_token_id(vocab_size: int) -> int:
    """The audio placeholder of both providers when the model has an audio encoder: the vocabulary's
    second-to-last entry (the image placeholder is the last)."""
    return vocab_size - 2


def placeholder_ids(kinds: list[tuple[str, str]], vocab_size: int, own: dict[str, int] | None = None) -> dict:
    """{module: placeholder token id} of a model's encoder modules, `kinds` = [(module, input kind)] in the
    model's order. The first module of each kind takes its kind's id (`own[kind]` when the tokenizer has its
    own, else image: the vocabulary's last id, audio: the second-to-last), so a model of one module per kind
    keeps the ids it always had; every further module takes the next free id down from the vocabulary's end."""
    own = {k: v for k, v in (own or {}).items() if v is not None}
    default = {"image": vocab_size - 1, "audio": audio_token_id(vocab_size)}
    out: dict[str, int] = {}
    firsts = {}
    for name, kind in kinds:
        if kind not in firsts:
            firsts[kind] = name
            out[name] = own.get(kind, default.get(kind, -1))
    taken = set(out.values()) | set(default.values())
    nxt = vocab_size - 3
    for name, _kind in kinds:
        if name in out and out[name] >= 0:
            continue
        while nxt in taken:
            nxt -= 1
        out[name] = nxt
        taken.add(nxt)
    return {name: out[name] for name, _ in kinds}

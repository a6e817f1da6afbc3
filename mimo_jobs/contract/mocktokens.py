"""The mock data's token ids (data/mock.py writes them): what the trainer's mock provider needs of a model's
vocabulary, which validate checks before a job is queued. Torch-free."""

from __future__ import annotations

PAD_ID = 0
MARK_ID = 1  # opens every repeat of a caption word
N_CLASSES = 4
WORD_LEN = 2
CLASS_BASE = 2  # class k's word is CLASS_BASE + k*WORD_LEN + [0, WORD_LEN)
TEXT_BASE = CLASS_BASE + N_CLASSES * WORD_LEN  # text-only samples use TEXT_BASE + [0, TEXT_POOL)
TEXT_POOL = 8
MIN_VOCAB = TEXT_BASE + TEXT_POOL + 1  # and the image placeholder, the last id


def vocab_problem(vocab_size: int) -> str | None:
    """Why the mock provider cannot feed a model of this vocabulary (None: it can)."""
    if vocab_size < MIN_VOCAB:
        return (
            f"the mock provider needs a vocabulary of at least {MIN_VOCAB} tokens, the model has {vocab_size}"
        )
    return None

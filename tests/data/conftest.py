"""Real energon datasets made by the tests (synthetic shards, prepared in-process; ~0.2 s each)."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def synth_blend(tmp_path_factory):
    """512 samples, 25% text-only, images 8x8 / 12x12 / 16x8 (4, 9, 8 tokens with patch 4)."""
    from mimo_jobs.data.synth import SynthConfig, synth

    root = tmp_path_factory.mktemp("synth")
    cfg = SynthConfig(
        samples=512,
        text_only_fraction=0.25,
        image_sizes=((8, 8), (12, 12), (16, 8)),
        samples_per_shard=32,
        seed=7,
    )
    with contextlib.redirect_stdout(io.StringIO()):
        res = synth(root, cfg)
    return res, cfg


# ChatML: every turn is "<|im_start|>ROLE\nCONTENT<|im_end|>\n"; the generation prompt opens an assistant turn
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<pad>", "<s>", "</s>", "<unk>", "<|im_start|>", "<|im_end|>", "<image>"]


def build_hf_tokenizer(out: Path, vocab_size: int = 120) -> Path:
    """A small BPE tokenizer trained here on the synthetic vocabulary, saved as a HuggingFace tokenizer
    directory with a chat template (no download). It fits the tiny presets' 128-entry vocabulary; the
    pre-tokenizer splits words (with their leading space), punctuation and whitespace runs, so a text's
    tokens do not depend on the text around it."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from mimo_jobs.data.synth import COLORS, QUESTIONS, SHAPES, WORDS

    tk = Tokenizer(models.BPE(unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split(
        Regex(r" ?[A-Za-z0-9]+| ?[^\sA-Za-z0-9]+|\s+"), behavior="isolated"
    )
    corpus = [
        " ".join(WORDS),
        " ".join(COLORS),
        " ".join(SHAPES),
        *QUESTIONS,
        "user assistant system color? shape?\n",
    ]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, show_progress=False)
    tk.train_from_iterator(corpus * 4, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tk,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        additional_special_tokens=SPECIALS[4:],
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def hf_tokenizer(tmp_path_factory) -> Path:
    return build_hf_tokenizer(tmp_path_factory.mktemp("hf-tok") / "tok")


@pytest.fixture(scope="session")
def instruct_data(tmp_path_factory):
    """VQA and conversation samples whose text lives in a JSON member (field_map json[...]), plus captions."""
    from mimo_jobs.data.synth import SynthConfig, synth

    cfg = SynthConfig(
        samples=16,
        text_only_fraction=0.0,
        image_sizes=((8, 8), (12, 12), (16, 8)),
        samples_per_shard=16,
        seed=5,
        vqa_samples=48,
        conversation_samples=48,
    )
    with contextlib.redirect_stdout(io.StringIO()):
        res = synth(tmp_path_factory.mktemp("instruct"), cfg)
    return res, cfg


def pytest_collection_modifyitems(config, items):
    here = str(Path(__file__).parent)
    for item in items:
        if str(item.fspath).startswith(here):
            # energon's loader asks for pinned memory; CPU torch warns that there is no accelerator
            item.add_marker(pytest.mark.filterwarnings("ignore:'pin_memory' argument is set as true"))

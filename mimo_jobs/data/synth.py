"""Synthetic energon datasets: image-caption shards (several image sizes -> different token counts),
text-only shards, instruction data (VQA, conversations) and a MetadatasetV2 blend YAML, prepared for energon
without prompts.

Layout written under DIR:
  DIR/caps/   caps-000000.tar ...  <key>.png + <key>.txt   (CaptioningSample, field_map image: png, caption: txt)
  DIR/text/   text-000000.tar ...  <key>.txt               (TextSample, field_map text: txt)
  DIR/vqa/    vqa-000000.tar ...   <key>.png + <key>.json  (VQASample, context: json[context], answers:
                                                            json[answers]: the layout of a typical VQA set)
  DIR/chat/   chat-000000.tar ...  <key>.png + <key>.json  (ConversationSample, conversation:
                                                            json[conversation]; needs a chat template)
  DIR/blend.yaml                   MetadatasetV2 over the non-empty parts, each weighted by its share of
                                   the samples (caps 1-F and text F of `samples`, then vqa and chat)
  DIR/synth.json                   what was generated (counts, sizes, seed, each key's image sizes)

Every key is globally unique (energon's prepare exits the process on duplicates). Content is a pure
function of (seed, index), so two calls with the same arguments write identical samples. Shards and
.nv-meta are written by shards.py.
"""

from __future__ import annotations

import io
import json
import random
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

from .errors import DataError
from .shards import prepare, write_shards

COLORS = {
    "red": (220, 40, 40),
    "green": (40, 180, 60),
    "blue": (40, 80, 220),
    "yellow": (230, 210, 40),
    "purple": (150, 60, 190),
    "orange": (240, 140, 30),
    "gray": (128, 128, 128),
    "cyan": (40, 200, 210),
}
SHAPES = ("square", "stripe", "dot", "cross")
WORDS = (
    "the",
    "a",
    "model",
    "reads",
    "data",
    "from",
    "many",
    "nodes",
    "and",
    "learns",
    "to",
    "see",
    "small",
    "images",
    "of",
    "color",
    "text",
    "tokens",
    "flow",
    "across",
    "ranks",
    "every",
    "step",
)

CAPTIONING = {
    "sample_type": {"__module__": "megatron.energon", "__class__": "CaptioningSample"},
    "field_map": {"image": "png", "caption": "txt"},
}
TEXT = {
    "sample_type": {"__module__": "megatron.energon", "__class__": "TextSample"},
    "field_map": {"text": "txt"},
}
VQA = {
    "sample_type": {"__module__": "megatron.energon", "__class__": "VQASample"},
    "field_map": {"image": "png", "context": "json[context]", "answers": "json[answers]"},
}
CONVERSATION = {
    "sample_type": {"__module__": "mimo_jobs.data.samples", "__class__": "ConversationSample"},
    "field_map": {"image": "png", "conversation": "json[conversation]"},
}


def parse_size(s: str) -> tuple[int, int]:
    """'8' -> (8, 8); '16x8' -> (16, 8) as (height, width)."""
    m = re.fullmatch(r"\s*(\d+)\s*(?:[xX]\s*(\d+))?\s*", str(s))
    if not m:
        raise DataError(f"image size {s!r}: write N (square) or HxW, e.g. 8 or 16x8")
    h = int(m.group(1))
    w = int(m.group(2) or h)
    if h < 1 or w < 1 or h > 4096 or w > 4096:
        raise DataError(f"image size {s!r}: sides must be between 1 and 4096 pixels")
    return h, w


MAX_SAMPLES = 1_000_000  # of every kind together: a smoke-test dataset, not a benchmark corpus


@dataclass(frozen=True)
class SynthConfig:
    samples: int = 512  # total samples (text-only + image-caption)
    text_only_fraction: float = 0.25  # share of text-only samples, also the blend weight of the text part
    image_sizes: tuple[tuple[int, int], ...] = ((8, 8), (12, 12), (16, 16))  # (H, W); tiny preset: patch 4
    samples_per_shard: int = 64
    seed: int = 0
    max_text_chars: int = 28  # text-only samples fit seq_length 32 (BOS + 28 chars + EOS)
    vqa_samples: int = 0  # VQA samples (image + question in a JSON member), beyond `samples`
    conversation_samples: int = 0  # two-turn image conversations (JSON member), beyond `samples`

    def check(self) -> None:
        if self.vqa_samples < 0 or self.conversation_samples < 0:
            raise DataError(
                f"vqa={self.vqa_samples}, conversations={self.conversation_samples}: counts must be >= 0"
            )
        if self.samples < 0 or self.total < 1:
            raise DataError(f"samples={self.samples}: need at least 1 sample of some kind")
        if not 0.0 <= self.text_only_fraction <= 1.0:
            raise DataError(f"text_only_fraction={self.text_only_fraction}: must be within [0, 1]")
        if not self.image_sizes and self.n_caps:
            raise DataError("image_sizes is empty but image-caption samples were asked for")
        if not self.image_sizes and (self.vqa_samples or self.conversation_samples):
            raise DataError("image_sizes is empty but VQA/conversation samples (with images) were asked for")
        if self.samples_per_shard < 1:
            raise DataError(f"samples_per_shard={self.samples_per_shard}: need at least 1")
        if self.total > MAX_SAMPLES:
            raise DataError(
                f"{self.total:,} samples: synthetic data is for tests and smoke runs, at most {MAX_SAMPLES:,}"
            )

    @property
    def n_text(self) -> int:
        return round(self.samples * self.text_only_fraction)

    @property
    def n_caps(self) -> int:
        return self.samples - self.n_text

    @property
    def total(self) -> int:
        return self.samples + self.vqa_samples + self.conversation_samples


@dataclass
class SynthResult:
    root: Path
    blend: Path
    caps: Path | None
    text: Path | None
    n_caps: int
    n_text: int
    caps_shards: list[str] = field(default_factory=list)
    text_shards: list[str] = field(default_factory=list)
    vqa: Path | None = None
    chat: Path | None = None
    vqa_shards: list[str] = field(default_factory=list)
    chat_shards: list[str] = field(default_factory=list)
    blend_parts: list[dict] = field(default_factory=list)  # the blend's entries: weight, path, subflavors


# ---------------------------------------------------------------- sample content (pure)


def caption_sample(
    seed: int, i: int, sizes: tuple[tuple[int, int], ...]
) -> tuple[str, tuple[int, int], str, str]:
    """(key, (h, w), color, caption) of image-caption sample i."""
    rng = random.Random(f"caps:{seed}:{i}")
    h, w = sizes[rng.randrange(len(sizes))]
    color = rng.choice(sorted(COLORS))
    shape = rng.choice(SHAPES)
    # short on purpose: BOS + the largest tiny-preset image (16 tokens) + caption + EOS fits seq_length 32
    return f"cap-{i:07d}", (h, w), color, f"{color} {shape}"


def text_sample(seed: int, i: int, max_chars: int) -> tuple[str, str]:
    rng = random.Random(f"text:{seed}:{i}")
    words: list[str] = []
    target = rng.randint(max(8, max_chars // 3), max_chars)
    while True:
        w = rng.choice(WORDS)
        if len(" ".join(words + [w])) > target:
            break
        words.append(w)
    return f"txt-{i:07d}", " ".join(words) or WORDS[0]


QUESTIONS = ("what color is it?", "what shape is it?")


def vqa_sample(
    seed: int, i: int, sizes: tuple[tuple[int, int], ...]
) -> tuple[str, tuple[int, int], str, dict]:
    """(key, (h, w), color, JSON member) of VQA sample i: a question about the image and its one answer."""
    rng = random.Random(f"vqa:{seed}:{i}")
    h, w = sizes[rng.randrange(len(sizes))]
    color, shape = rng.choice(sorted(COLORS)), rng.choice(SHAPES)
    q = rng.randrange(len(QUESTIONS))
    return f"vqa-{i:07d}", (h, w), color, {"context": QUESTIONS[q], "answers": [(color, shape)[q]]}


def conversation_sample(
    seed: int, i: int, sizes: tuple[tuple[int, int], ...]
) -> tuple[str, tuple[int, int], str, dict]:
    """(key, (h, w), color, JSON member) of conversation i: two user/assistant rounds about the image."""
    rng = random.Random(f"chat:{seed}:{i}")
    h, w = sizes[rng.randrange(len(sizes))]
    color, shape = rng.choice(sorted(COLORS)), rng.choice(SHAPES)
    turns = [
        {"role": "user", "content": "<image>\ncolor?"},
        {"role": "assistant", "content": color},
        {"role": "user", "content": "shape?"},
        {"role": "assistant", "content": shape},
    ]
    return f"chat-{i:07d}", (h, w), color, {"conversation": turns}


def render_png(h: int, w: int, color: str, seed: int, i: int) -> bytes:
    """A small PNG: the color as background with a darker pattern, deterministic per (seed, i)."""
    from PIL import Image

    rng = random.Random(f"px:{seed}:{i}")
    r, g, b = COLORS[color]
    img = Image.new("RGB", (w, h), (r, g, b))
    px = img.load()
    period = rng.randint(2, 4)
    for y in range(h):
        for x in range(w):
            if (x + y) % period == 0:
                px[x, y] = (r // 2, g // 2, b // 2)
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def blend_doc(parts: list[tuple[float, str, str]]) -> dict:
    """MetadatasetV2 train blend of (weight, relative path, kind)."""
    return {
        "__module__": "megatron.energon",
        "__class__": "MetadatasetV2",
        "splits": {
            "train": {
                "blend": [{"weight": float(w), "path": p, "subflavors": {"kind": k}} for w, p, k in parts]
            }
        },
    }


def synth(root: str | Path, cfg: SynthConfig = SynthConfig(), progress=None) -> SynthResult:
    """Write the synthetic datasets and blend under root. `progress(advance)` is called per sample."""
    cfg.check()
    root = Path(root)
    for sub in ("caps", "text", "vqa", "chat"):
        if (root / sub / ".nv-meta").exists():
            raise DataError(f"{root / sub} is already an energon dataset; choose an empty DIR or remove it")
    root.mkdir(parents=True, exist_ok=True)
    tick = progress or (lambda n=1: None)
    res = SynthResult(
        root=root, blend=root / "blend.yaml", caps=None, text=None, n_caps=cfg.n_caps, n_text=cfg.n_text
    )
    parts: list[tuple[float, str, str]] = []
    images: dict[str, list[list[int]]] = {}  # key -> [[h, w], ...]: what `data stats` must find
    if cfg.n_caps:
        samples = []
        for i in range(cfg.n_caps):
            key, (h, w), color, caption = caption_sample(cfg.seed, i, cfg.image_sizes)
            images[key] = [[h, w]]
            samples.append((key, {"png": render_png(h, w, color, cfg.seed, i), "txt": caption.encode()}))
            tick(1)
        res.caps = root / "caps"
        res.caps_shards = write_shards(res.caps, "caps", samples, cfg.samples_per_shard)
        prepare(res.caps, res.caps_shards, CAPTIONING)
        parts.append((1.0 - cfg.text_only_fraction, "./caps", "image_caption"))
    if cfg.n_text:
        samples = []
        for i in range(cfg.n_text):
            key, text = text_sample(cfg.seed, i, cfg.max_text_chars)
            images[key] = []
            samples.append((key, {"txt": text.encode()}))
            tick(1)
        res.text = root / "text"
        res.text_shards = write_shards(res.text, "text", samples, cfg.samples_per_shard)
        prepare(res.text, res.text_shards, TEXT)
        parts.append((cfg.text_only_fraction, "./text", "text"))
    for kind, n, make, sub in (
        ("vqa", cfg.vqa_samples, vqa_sample, VQA),
        ("chat", cfg.conversation_samples, conversation_sample, CONVERSATION),
    ):
        if not n:
            continue
        samples = []
        for i in range(n):
            key, (h, w), color, member = make(cfg.seed, i, cfg.image_sizes)
            images[key] = [[h, w]]
            png = render_png(h, w, color, cfg.seed, i)
            samples.append((key, {"png": png, "json": json.dumps(member).encode()}))
            tick(1)
        setattr(res, kind, root / kind)
        shards = write_shards(root / kind, kind, samples, cfg.samples_per_shard)
        setattr(res, f"{kind}_shards", shards)
        prepare(root / kind, shards, sub)
        parts.append((n / cfg.total, f"./{kind}", {"vqa": "vqa", "chat": "conversation"}[kind]))
    # caps and text share `samples` as 1-F : F; the instruction parts come on top
    scale = cfg.samples / cfg.total
    parts = [(w * scale if p in ("./caps", "./text") else w, p, k) for w, p, k in parts]
    if len(parts) > 1:
        parts = [p for p in parts if p[0] > 0]
    doc = blend_doc(parts)
    res.blend_parts = doc["splits"]["train"]["blend"]
    res.blend.write_text(yaml.safe_dump(doc, sort_keys=False))
    manifest = {
        **asdict(cfg),
        "n_caps": cfg.n_caps,
        "n_text": cfg.n_text,
        "caps_shards": res.caps_shards,
        "text_shards": res.text_shards,
        "vqa_shards": res.vqa_shards,
        "chat_shards": res.chat_shards,
        "blend": res.blend.name,
        "image_sizes_by_key": images,
    }
    (root / "synth.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return res

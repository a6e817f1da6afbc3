"""Data providers for the trainer: the mock provider, and the branch to energon.

Mock samples: an image of a random side from `data.image_sizes` (so a varying number of image tokens,
(side/(patch x downsample))^2 by the encoder family's token rule; sides never exceed the encoder's image size, so
mock images are never tiled) or no image at all (share `data.text_only_fraction`), followed by text and padding. The
text is learnable, and an image's caption can only be predicted by looking at the image:

- an image sample draws a class k in [0, N_CLASSES); its pixels are class k's fixed random patch-sized tile,
  repeated over the image, plus Gaussian noise (IMAGE_NOISE). Its text is MARK_ID then class k's word
  (WORD_LEN tokens of its own), repeated: after each MARK_ID the next token names the class, which the text
  before it cannot tell in the first repeat, so the LLM must read it from the image embeddings.
- a text-only sample counts up through TEXT_POOL tokens from a random start (wrapping round), which the LLM
  alone can learn.

With an audio module (an audio tower in `MockConfig.towers`) a share `audio_fraction` of the samples also carries one clip, a
float32 [n_mels, frames] log-mel-like array of a length from `audio_frames`: a class's fixed random mel
column repeated over the frames plus noise. Its placeholders follow the image's (the audio encoder's token
rule gives how many); a clip shows the class the caption names (the image's, or with no image its own), so
an audio-only sample's caption can only be read from the audio. The audio draws use generators of their own,
so with `audio_fraction` 0 every sample is what it was without audio.

The placeholders are per encoder module (`MockConfig.towers`, the model's modules): every image module
embeds the sample's image and fills its own placeholders (its own token rule, its own id: batch.
placeholder_ids), image modules first, then audio modules, each kind in the model's order. A model of one
module per kind has the samples it always had.

Each sample is a pure function of (seed, global sample index), and lane l's microbatch m of iteration t
holds the global samples t*gbs + m*mbs*llm_dp + l*mbs + [0, mbs): the encoder replica and the LLM lane that
read the same lane get identical samples, and the global batch of an iteration is the same whatever the
layout (so losses are comparable across node counts). The class is drawn with the text; the pixel noise
comes from the image's own generator, so `need_images=False` changes nothing else.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

import torch

from mimo_jobs.contract.mocktokens import (  # noqa: F401 - the ids are part of this module's interface
    CLASS_BASE,
    MARK_ID,
    MIN_VOCAB,
    N_CLASSES,
    PAD_ID,
    TEXT_BASE,
    TEXT_POOL,
    WORD_LEN,
)
from mimo_jobs.data.audio import AudioSpec, audio_spec_of, audio_spec_of_module
from mimo_jobs.data.batch import IGNORE_INDEX, LaneBatch, ModuleInputs, Provider, placeholder_ids
from mimo_jobs.data.images import image_module_of
from mimo_jobs.errors import MimoJobsError
from mimo_jobs.model import families
from mimo_jobs.model.arch import frame_groups
from mimo_jobs.model.resolve import arch_of
from mimo_jobs.study.runtime_rules import (
    clip_room_problem,
    image_size_problems,
    placeholder_vocab_problem,
    towers_room_problem,
)

IMAGE_NOISE = 0.5


def image_token_id(vocab_size: int) -> int:
    """The placeholder token at image positions (the last vocabulary entry)."""
    return vocab_size - 1


def class_tile(k: int, channels: int, patch: int):
    """Class k's [channels, patch, patch] tile: the same for every seed, so a run's seed picks samples only."""
    g = torch.Generator().manual_seed(_seed_of("mock-class", k))
    return torch.randn(channels, patch, patch, generator=g)


def class_mel(k: int, n_mels: int):
    """Class k's [n_mels, 1] mel column: the same for every seed."""
    g = torch.Generator().manual_seed(_seed_of("mock-audio-class", k))
    return torch.randn(n_mels, 1, generator=g)


class DataConfigError(MimoJobsError, ValueError):
    pass


def _seed_of(*parts) -> int:
    return zlib.crc32(":".join(str(p) for p in parts).encode()) & 0x7FFFFFFF


@dataclass(frozen=True)
class MockTower:
    """One encoder module as the mock data sees it: its name, its input kind and its token rule (an image
    module's family, patch and pixel shuffle, an audio module's AudioSpec)."""

    name: str
    kind: str  # image or audio
    patch_size: int = 0
    downsample: int = 1
    audio: AudioSpec | None = None
    family: str = "clip"  # an image module's family (EncoderArch.kind), whose token rule counts its tokens
    temporal: int = 1  # an image module's temporal patch size (frames per patch in time)

    def tokens(self, side: int = 0, frames: int = 0, n_mels: int = 80, video: int = 0) -> int:
        """Placeholders of a sample: an image module's for its image of `side` px (or its video of `video`
        frames: one image's worth per temporal group), an audio module's for its clip of `frames` frames."""
        if self.kind == "audio":
            return self.audio.clip_tokens((n_mels, frames)) if frames else 0
        groups = frame_groups(video, self.temporal) if video else 1
        return groups * families.vision(self.family).tokens_for(self, side, side) if side else 0


@dataclass
class MockConfig:
    seed: int
    seq_length: int
    mbs: int
    num_microbatches: int
    vocab_size: int
    channels: int
    image_sizes: tuple[int, ...]
    text_only_fraction: float
    # the model's encoder modules (placeholders in this order: image modules, then audio ones, each kind in
    # the model's order)
    towers: tuple[MockTower, ...]
    lanes: int = 1  # LLM DP lanes sharing one global batch
    audio_fraction: float = 0.0  # share of samples that also carry an audio clip
    audio_frames: tuple[int, ...] = ()  # clip lengths drawn from
    n_mels: int = 80  # Whisper's log-mel bins
    # the share of image samples whose picture is a video instead (every frame shows the sample's class), and
    # the frame counts drawn from; each image module embeds it in temporal groups
    video_fraction: float = 0.0
    video_frames: tuple[int, ...] = ()

    def __post_init__(self):
        order = {"image": 0, "audio": 1}
        self.towers = tuple(sorted(self.towers, key=lambda t: order.get(t.kind, 2)))  # stable: model order

    @classmethod
    def one_module(
        cls, *, patch_size: int, downsample: int = 1, audio: AudioSpec | None = None, **rest
    ) -> MockConfig:
        """The older one-module form: one image module `vision` of `patch_size` x `downsample` pixels per
        token, and an audio module `audio` of the token rule `audio` when given (the one place it becomes
        towers)."""
        towers = [MockTower("vision", "image", patch_size, downsample)]
        if audio is not None:
            towers.append(MockTower("audio", "audio", audio=audio))
        return cls(**rest, towers=tuple(towers))

    @property
    def tile(self) -> int:
        """The side of a class's pixel tile: the first image module's patch (0: no module reads images)."""
        images = _of(self, "image")
        return images[0].patch_size if images else 0

    @property
    def gbs(self) -> int:
        return self.mbs * self.lanes * self.num_microbatches


def check_mock_config(c: MockConfig, max_image_size: int) -> None:
    """The rules validate applies to a study (study/runtime_rules.py), in its words, then the mock's own
    bounds on a config the study file cannot state."""
    vocab = placeholder_vocab_problem(c.vocab_size, [(t.name, t.kind) for t in c.towers])
    if vocab is not None:
        raise DataConfigError(str(vocab))
    images = _of(c, "image")
    found = []
    if images:  # the rules validate applies to a study, against the first image module's pixels per token
        first = images[0]
        unit = first.patch_size * first.downsample
        found = image_size_problems(
            c.image_sizes, unit, max_image_size, c.seq_length, c.text_only_fraction, first.tokens
        )
    video = max(c.video_frames, default=0) if c.video_fraction else 0
    room = towers_room_problem(
        c.image_sizes, {t.name: _tower_tokens(t) for t in images}, c.seq_length, c.text_only_fraction, video
    )
    found += [room] if room is not None else []
    if found:
        raise DataConfigError(str(found[0]))
    if c.audio_fraction:
        _check_audio(c, max_image_size)


def _check_audio(c: MockConfig, max_image_size: int) -> None:
    if not _of(c, "audio"):
        raise DataConfigError(f"audio_fraction={c.audio_fraction}: the model has no audio encoder")
    if not 0.0 <= c.audio_fraction <= 1.0 or not c.audio_frames:
        raise DataConfigError(
            f"audio_fraction={c.audio_fraction}, audio_frames={list(c.audio_frames)}: a share within [0, 1] "
            "and at least one clip length"
        )
    try:
        most = sum(max(t.tokens(frames=f, n_mels=c.n_mels) for f in c.audio_frames) for t in _of(c, "audio"))
    except ValueError as e:
        raise DataConfigError(f"audio_frames: {e}") from None
    room = clip_room_problem(_most_image_tokens(c), most, c.seq_length)
    if room is not None:
        raise DataConfigError(str(room))


def _tower_tokens(t: MockTower):
    """(side, video frames) -> the tower's placeholders of such a picture (towers_room_problem's form)."""
    return lambda side, video: t.tokens(side=side, video=video)


def _of(c: MockConfig, kind: str) -> list[MockTower]:
    return [t for t in c.towers if t.kind == kind]


def _most_image_tokens(c: MockConfig) -> int:
    """The placeholders of the largest picture (image, or the longest video), summed over the image modules
    (each fills its own)."""
    video = max(c.video_frames, default=0) if c.video_fraction else 0
    return max(
        (sum(t.tokens(side=s, video=video) for t in _of(c, "image")) for s in c.image_sizes), default=0
    )


@dataclass
class MockSample:
    key: str
    tokens: Any  # LongTensor [seq_length]
    counts: dict  # per encoder module its placeholders (image modules first, then audio ones)
    n_real: int  # placeholders and text
    image: Any  # FloatTensor [C, side, side] or None
    clip: Any  # FloatTensor [n_mels, frames] or None
    kinds: dict = None  # per encoder module its input kind

    @property
    def n_img(self) -> int:  # image placeholders, every image module's
        return sum(n for m, n in self.counts.items() if self.kinds[m] == "image")

    @property
    def n_aud(self) -> int:  # audio placeholders
        return sum(n for m, n in self.counts.items() if self.kinds[m] == "audio")

    @property
    def lead(self) -> int:  # the placeholders before the text
        return sum(self.counts.values())


class MockProvider(Provider):
    def __init__(self, cfg: MockConfig, lanes: list[int], need_images: bool, need_text: bool):
        self.cfg = cfg
        self.lanes = list(lanes)
        self.kinds = {t.name: t.kind for t in cfg.towers}
        self.placeholders = placeholder_ids(list(self.kinds.items()), cfg.vocab_size)
        self.need_images = need_images
        self.need_text = need_text
        self.position = {lane: 0 for lane in self.lanes}  # microbatches already drawn per lane

    def global_index(self, lane: int, pos: int, j: int) -> int:
        """Global sample index of sample j of the lane's pos-th microbatch."""
        c = self.cfg
        step, mb = divmod(pos, c.num_microbatches)
        return step * c.gbs + mb * c.mbs * c.lanes + lane * c.mbs + j

    def sample(self, index: int):
        """Global sample `index`: (key, tokens, n_image_tokens (every image module's), n_real_tokens, image or
        None)."""
        s = self.draw(index)
        return s.key, s.tokens, s.n_img, s.n_real, s.image

    def _audio_draw(self, index: int) -> tuple[int, int | None]:
        """(frames, its own class or None) of the sample's clip; (0, None) without one."""
        c = self.cfg
        if not c.audio_fraction:
            return 0, None
        ga = torch.Generator().manual_seed(_seed_of(c.seed, "audio-meta", index))
        if torch.rand((), generator=ga).item() >= c.audio_fraction:
            return 0, None
        frames = c.audio_frames[int(torch.randint(len(c.audio_frames), (), generator=ga))]
        k = int(torch.randint(N_CLASSES, (), generator=ga))
        return frames, k

    def _video_draw(self, index: int) -> int:
        """Frames of the sample's video (0: its picture is an image). Own generator: with video_fraction 0
        every sample is what it was without video."""
        c = self.cfg
        if not c.video_fraction or not c.video_frames:
            return 0
        gv = torch.Generator().manual_seed(_seed_of(c.seed, "video-meta", index))
        if torch.rand((), generator=gv).item() >= c.video_fraction:
            return 0
        return c.video_frames[int(torch.randint(len(c.video_frames), (), generator=gv))]

    def draw(self, index: int) -> MockSample:
        """Global sample `index`, with its clip when it has one."""
        c = self.cfg
        g = torch.Generator().manual_seed(_seed_of(c.seed, "meta", index))
        u = torch.rand((), generator=g).item()
        side = 0
        if u >= c.text_only_fraction and c.image_sizes:
            side = c.image_sizes[int(torch.randint(len(c.image_sizes), (), generator=g))]
        frames, k = self._audio_draw(index)
        video = self._video_draw(index) if side else 0
        counts = {t.name: t.tokens(side=side, frames=frames, n_mels=c.n_mels, video=video) for t in c.towers}
        lead = sum(counts.values())
        room = c.seq_length - lead
        n_text = int(torch.randint(max(2, room // 2), room + 1, (), generator=g))
        i = torch.arange(n_text)
        if side:
            k = int(torch.randint(N_CLASSES, (), generator=g))
        if k is not None:
            j = i % (WORD_LEN + 1)
            text = torch.where(j == 0, MARK_ID, CLASS_BASE + k * WORD_LEN + j - 1)
        else:
            start = int(torch.randint(TEXT_POOL, (), generator=g))
            text = TEXT_BASE + (start + i) % TEXT_POOL
        tokens = torch.full((c.seq_length,), PAD_ID, dtype=torch.long)
        at = 0
        for name, n in counts.items():  # each module's placeholders in turn, at its own id
            tokens[at : at + n] = self.placeholders[name]
            at += n
        tokens[lead : lead + n_text] = text
        image = clip = None
        if side and self.need_images and c.tile:
            gi = torch.Generator().manual_seed(_seed_of(c.seed, "image", index))
            noise = torch.randn(c.channels, side, side, generator=gi)
            reps = side // c.tile
            image = class_tile(k, c.channels, c.tile).repeat(1, reps, reps) + IMAGE_NOISE * noise
            if video:  # the frames: the class's pattern under each frame's own noise
                gv = torch.Generator().manual_seed(_seed_of(c.seed, "video", index))
                moving = IMAGE_NOISE * torch.randn(video - 1, c.channels, side, side, generator=gv)
                rest = class_tile(k, c.channels, c.tile).repeat(1, reps, reps) + moving
                image = torch.cat([image.unsqueeze(0), rest]).unsqueeze(0)  # [1, F, C, H, W]
        if frames and self.need_images:
            ga = torch.Generator().manual_seed(_seed_of(c.seed, "audio", index))
            clip = class_mel(k, c.n_mels).repeat(1, frames) + IMAGE_NOISE * torch.randn(
                c.n_mels, frames, generator=ga
            )
        return MockSample(f"mock/{c.seed}/{index}", tokens, counts, lead + n_text, image, clip, self.kinds)

    def next(self, lane: int) -> LaneBatch:

        if lane not in self.position:
            raise KeyError(f"this provider serves lanes {self.lanes}, not lane {lane}")
        c = self.cfg
        pos = self.position[lane]
        self.position[lane] = pos + 1
        keys, toks, masks, labels, drawn = [], [], [], [], []
        for j in range(c.mbs):
            s = self.draw(self.global_index(lane, pos, j))
            t, lead = s.tokens, s.lead
            lab = torch.full_like(t, IGNORE_INDEX)
            lab[:-1] = t[1:]
            m = torch.zeros(c.seq_length)
            # a position carries loss when it holds text and predicts a real (text) token
            m[lead : max(lead, s.n_real - 1)] = 1.0
            lab[m == 0] = IGNORE_INDEX
            keys.append(s.key)
            toks.append(t)
            masks.append(m)
            labels.append(lab)
            drawn.append(s)
        pos_ids = torch.arange(c.seq_length).unsqueeze(0).expand(c.mbs, -1).contiguous()
        return LaneBatch(
            lane=lane,
            step=pos // c.num_microbatches,
            microbatch=pos % c.num_microbatches,
            sample_keys=keys,
            tokens=torch.stack(toks),
            labels=torch.stack(labels),
            loss_mask=torch.stack(masks),
            position_ids=pos_ids,
            inputs={t.name: self._module_inputs(t, drawn) for t in c.towers},
        )

    def _module_inputs(self, tower: MockTower, drawn: list[MockSample]) -> ModuleInputs:
        """One module's share of a microbatch: its placeholders per sample and, on ranks that embed, the
        sample's image (an image module) or its clip (an audio module)."""
        items = None
        if self.need_images:
            if tower.kind == "audio":
                items = [[s.clip] if s.clip is not None else None for s in drawn]
            else:
                items = [s.image for s in drawn]
        return ModuleInputs(self.placeholders[tower.name], [s.counts[tower.name] for s in drawn], items)

    def state_dict(self) -> dict:
        return {"kind": "mock", "position": dict(self.position)}

    def load_state_dict(self, state: dict) -> None:
        self.position = {int(k): int(v) for k, v in state["position"].items()}


def mock_config(run_spec, plan) -> MockConfig:
    p = arch_of(run_spec.trainer.model)
    t = run_spec.trainer
    audio = audio_spec_of(p)
    # the image encoder decides the images' sizes and tokens (beside it the model may have an audio one)
    image = image_module_of(p) or p.encoder
    c = MockConfig(
        seed=t.seed,
        seq_length=t.seq_length,
        mbs=run_spec.layout.mbs,
        num_microbatches=plan.num_microbatches,
        vocab_size=p.llm.vocab_size,
        channels=image.channels,
        image_sizes=tuple(t.data.image_sizes),
        text_only_fraction=t.data.text_only_fraction,
        lanes=run_spec.layout.llm_dp,
        # audio samples when the model has an audio module and trainer.data asks for them
        n_mels=(audio.n_mels if audio is not None and audio.n_mels else MockConfig.n_mels),
        audio_fraction=getattr(t.data, "audio_fraction", 0.0),
        audio_frames=tuple(getattr(t.data, "audio_frames", ())),
        towers=towers_of(p),
        video_fraction=getattr(t.data, "video_fraction", 0.0),
        video_frames=tuple(getattr(t.data, "video_frames", ())),
    )
    check_mock_config(c, image.image_size)
    return c


def towers_of(arch) -> tuple[MockTower, ...]:
    """The model's encoder modules as the mock data sees them (model order; the kind is the family's)."""
    out = []
    for name, e in arch.encoders.items():
        if e.modality == "audio":
            out.append(MockTower(name, "audio", audio=audio_spec_of_module(e)))
        else:
            out.append(
                MockTower(
                    name,
                    e.modality,
                    e.patch_size,
                    e.downsample,
                    family=e.kind,
                    temporal=e.temporal_patch_size,
                )
            )
    return tuple(out)


def make_provider(run_spec, plan, lanes: list[int], need_images: bool, need_text: bool) -> Provider:
    """The provider for the lanes this rank consumes (see batch.Provider)."""
    kind = run_spec.trainer.data.provider
    if kind == "mock":
        return MockProvider(mock_config(run_spec, plan), lanes, need_images, need_text)
    if kind == "energon":
        from mimo_jobs.data.energon_provider import make_energon_provider

        return make_energon_provider(run_spec, plan, lanes, need_images, need_text)
    raise DataConfigError(f"trainer.data.provider: unknown provider {kind!r} (mock or energon)")

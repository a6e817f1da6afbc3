"""The model description: pure data (no torch), one shape for every consumer (validate, predict, plan,
report's MFU, data and the trainer).

A model is an image encoder (ViT + MLP projector) feeding a GPT language model (dense or MoE), or a GPT
alone (text-only: for other programs' runs, which are priced without images). Field names
follow megatron-core's TransformerConfig where it has one; defaults reproduce the trainer's original
(GELU, LayerNorm, linear biases on dense LLMs only) so the packaged presets keep their meaning.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, fields
from typing import ClassVar

from mimo_jobs.model import registry
from mimo_jobs.model.audio_arch import AudioArch
from mimo_jobs.model.fields import (
    ArchError,
    check_choice,
    check_finite_positive,
    check_positive,
    check_sizes,
    known_fields,
)

LLM_ACTIVATIONS = ("gelu", "silu")
ENC_ACTIVATIONS = ("gelu", "quick_gelu", "gelu_tanh")
NORMS = ("LayerNorm", "RMSNorm")
ROUTER_SCORES = ("softmax", "sigmoid")
# The vocabulary tables are padded to a multiple of this (Megatron-LM's make_vocab_size_divisible_by
# default), or of VOCAB_MULTIPLE * tp when tp does not divide that, so every TP size splits them evenly.
VOCAB_MULTIPLE = 128


def padded_vocab(vocab_size: int, tp: int) -> int:
    """Rows of the embedding and output tables on a TP group of `tp` ranks (the padded rows are never a
    label; the planner counts them in per-rank memory, never in a model's parameter total)."""
    for m in (VOCAB_MULTIPLE, VOCAB_MULTIPLE * tp):
        v = -(-vocab_size // m) * m
        if v % tp == 0:
            return v
    raise AssertionError("unreachable: a multiple of VOCAB_MULTIPLE * tp divides by tp")


def frame_groups(frames: int, temporal_patch_size: int) -> int:
    """Temporal patch groups of a video of `frames` frames: groups of `temporal_patch_size`, the last padded
    with its last frame (Qwen2-VL's processor pads so); the one rule of the model, the data and the mock."""
    return -(-frames // temporal_patch_size)


@dataclass(frozen=True)
class EncoderArch:
    # the name of an image family of model/families (model/registry.py holds them: "clip", "siglip",
    # "internvit", "radio"); the trainer builds all on megatron-core's RADIO ViT
    kind: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    ffn_hidden_size: int
    patch_size: int
    image_size: int  # max side in pixels; images are padded/cropped to multiples of patch_size
    channels: int = 3
    # a learned class token attends inside the ViT (one more position); like LLaVA, it is dropped before the
    # projector, so it never reaches the LLM
    class_token: bool = True
    activation: str = "gelu"
    normalization: str = "LayerNorm"
    norm_epsilon: float = 1e-5
    # pixel shuffle: s x s neighbouring patch tokens become one token of s*s*hidden channels before the
    # projector (the projector's input width is s*s*hidden_size)
    downsample: int = 1
    pre_norm: bool = False  # a norm on the patch embeddings before the first layer (CLIP's pre_layrnorm)
    final_norm: bool = False  # a norm after the last layer (CLIP's and SigLIP's post_layernorm)
    patch_bias: bool = False  # the patch embedding has a bias (SigLIP's conv)
    # a learned per-channel scale of each layer's attention and MLP output before its residual add
    # (InternViT's lambda_1, lambda_2)
    layer_scale: bool = False
    name: str = ""
    source: str = ""
    # frames one patch spans in time (Qwen2-VL's temporal_patch_size, its 3-D patch embedding): a video's
    # frames go in groups of this many, an image is one group (its frame repeated, as Qwen2-VL's processor
    # does); 1 is the 2-D ViT of CLIP and SigLIP
    temporal_patch_size: int = 1
    # fields added after run ids were first hashed from run.yaml's trainer.model: recorded only when set
    # (`recorded`), so a description that leaves them at their default keeps its run id
    LATER: ClassVar[tuple[str, ...]] = ("layer_scale", "temporal_patch_size")

    def __post_init__(self):
        check_choice("kind", self.kind, registry.kinds("image"))
        check_positive(self, ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size"))
        check_positive(self, ("patch_size", "image_size", "channels", "downsample", "temporal_patch_size"))
        check_sizes(self)
        check_finite_positive(self, ("norm_epsilon",))
        check_choice("activation", self.activation, ENC_ACTIVATIONS)
        check_choice("normalization", self.normalization, NORMS)
        if self.hidden_size % self.num_attention_heads:
            raise ArchError(
                "num_attention_heads",
                f"hidden_size {self.hidden_size} is not divisible by {self.num_attention_heads} heads",
            )
        if self.image_size < self.patch_size:
            raise ArchError("image_size", f"{self.image_size} is smaller than one patch ({self.patch_size})")
        if self.grid % self.downsample:
            raise ArchError(
                "downsample",
                f"{self.downsample} does not divide the {self.grid}-patch side of a {self.image_size}px image "
                f"(patch {self.patch_size}); choose an image_size whose patch grid it divides",
            )

    @property
    def grid(self) -> int:
        """Patches per side of a full-size image (a stride-p convolution: image_size // p)."""
        return self.image_size // self.patch_size

    @property
    def positions(self) -> int:
        """Rows of the position table: the full-size patch grid, plus the class token's."""
        return self.grid**2 + int(self.class_token)

    def vit_tokens(self, h_px: int, w_px: int) -> int:
        """Sequence length inside the ViT for one h x w image (sides multiples of the patch)."""
        return (h_px // self.patch_size) * (w_px // self.patch_size) + int(self.class_token)

    def tokens_for(self, h_px: int, w_px: int) -> int:
        """Image tokens one h x w image gives the LLM: its family's token rule (VisionFamily.tokens_for)."""
        return registry.family(self.kind).tokens_for(self, h_px, w_px)

    def frame_groups(self, frames: int) -> int:
        """Temporal patch groups of a clip of `frames` frames (the last group padded with its last frame)."""
        return frame_groups(frames, self.temporal_patch_size)

    def video_tokens(self, frames: int, h_px: int, w_px: int) -> int:
        """Tokens a video of `frames` h x w frames gives the LLM: each temporal group of
        `temporal_patch_size` frames is one image's worth of patches."""
        return self.frame_groups(frames) * self.tokens_for(h_px, w_px)

    @property
    def patch_inputs(self) -> int:
        """Values one patch embeds: channels x temporal_patch_size x patch_size^2 (a 3-D patch)."""
        return self.channels * self.temporal_patch_size * self.patch_size**2

    @property
    def tokens_per_image(self) -> int:
        """Image tokens of a full-size (image_size x image_size) image."""
        return self.tokens_for(self.image_size, self.image_size)

    @property
    def projector_input(self) -> int:
        return self.hidden_size * self.downsample**2

    @property
    def modality(self) -> str:
        """What this encoder reads (code with per-kind behaviour dispatches on it): images."""
        return "image"

    @property
    def out_width(self) -> int:
        """The projector's input width (every encoder architecture offers it under this name)."""
        return self.projector_input

    def to_dict(self) -> dict:
        return asdict(self)

    def recorded(self) -> dict:
        """to_dict without the LATER fields at their default: what run.yaml records."""
        d = self.to_dict()
        defaults = {f.name: f.default for f in fields(self)}
        return {k: v for k, v in d.items() if k not in self.LATER or v != defaults[k]}

    @classmethod
    def from_dict(cls, d: dict) -> EncoderArch:
        return cls(**known_fields(cls, d, "encoder"))


@dataclass(frozen=True)
class LLMArch:
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    ffn_hidden_size: int
    vocab_size: int
    num_query_groups: int | None = None  # None: one KV head per query head (no GQA)
    kv_channels: int | None = None  # head_dim; None = hidden_size / num_attention_heads
    activation: str = "gelu"
    gated_linear_unit: bool = False  # SwiGLU when activation is silu: fc1 holds gate and up (2 x ffn)
    normalization: str = "LayerNorm"
    norm_epsilon: float = 1e-5
    qk_layernorm: bool = False  # a norm over each head's query and key (head_dim weights each)
    rotary_base: float = 10000.0
    # None: the trainer's original rule, linear biases on dense LLMs only (MoE experts carry none)
    add_qkv_bias: bool | None = None
    add_bias_linear: bool | None = None
    tie_word_embeddings: bool = False
    num_experts: int = 0  # 0 = dense
    moe_router_topk: int = 2
    moe_ffn_hidden_size: int | None = None  # None = ffn_hidden_size
    moe_shared_expert_intermediate_size: int | None = None  # total width of the shared experts; None = none
    moe_shared_expert_gate: bool = False  # a sigmoid gate (1 x hidden) scales the shared experts (Qwen2-MoE)
    moe_layer_pattern: tuple[int, ...] | None = None  # per layer 1 = MoE, 0 = dense; None = all MoE
    moe_router_score_function: str = "softmax"
    # True: softmax over all experts, then top-k without renormalising (Qwen2-MoE's norm_topk_prob=False)
    moe_router_pre_softmax: bool = False
    name: str = ""
    source: str = ""

    def __post_init__(self):
        check_positive(
            self, ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size", "vocab_size")
        )
        check_sizes(self)
        check_finite_positive(self, ("norm_epsilon", "rotary_base"))
        if self.add_bias_linear is None:
            object.__setattr__(self, "add_bias_linear", not self.num_experts)
        if self.add_qkv_bias is None:
            object.__setattr__(self, "add_qkv_bias", self.add_bias_linear)
        if self.moe_layer_pattern is not None:
            object.__setattr__(self, "moe_layer_pattern", tuple(int(x) for x in self.moe_layer_pattern))
        check_choice("activation", self.activation, LLM_ACTIVATIONS)
        check_choice("normalization", self.normalization, NORMS)
        check_choice("moe_router_score_function", self.moe_router_score_function, ROUTER_SCORES)
        self._check_attention()
        self._check_moe()

    def _check_attention(self) -> None:
        g, a = self.num_query_groups, self.num_attention_heads
        if g is not None and (g <= 0 or a % g):
            raise ArchError("num_query_groups", f"{g} does not divide num_attention_heads {a}")
        if self.kv_channels is None and self.hidden_size % a:
            raise ArchError(
                "num_attention_heads",
                f"hidden_size {self.hidden_size} is not divisible by {a} heads (set kv_channels)",
            )
        if self.kv_channels is not None and self.kv_channels <= 0:
            raise ArchError("kv_channels", f"must be a positive integer, got {self.kv_channels!r}")

    def _check_moe(self) -> None:
        if self.num_experts < 0:
            raise ArchError("num_experts", f"must be 0 (dense) or positive, got {self.num_experts}")
        if not self.num_experts:
            return
        if not 0 < self.moe_router_topk <= self.num_experts:
            raise ArchError(
                "moe_router_topk", f"{self.moe_router_topk} must be between 1 and {self.num_experts} experts"
            )
        pat = self.moe_layer_pattern
        if pat is not None and (len(pat) != self.num_layers or set(pat) - {0, 1}):
            raise ArchError(
                "moe_layer_pattern",
                f"needs {self.num_layers} entries of 0 (dense) or 1 (MoE), got {list(pat)}",
            )

    @property
    def head_dim(self) -> int:
        return self.kv_channels or self.hidden_size // self.num_attention_heads

    @property
    def query_groups(self) -> int:
        return self.num_query_groups or self.num_attention_heads

    @property
    def expert_ffn(self) -> int:
        return self.moe_ffn_hidden_size or self.ffn_hidden_size

    def is_moe_layer(self, i: int) -> bool:
        if not self.num_experts:
            return False
        return self.moe_layer_pattern is None or bool(self.moe_layer_pattern[i])

    @property
    def moe_layers(self) -> int:
        """How many layers is_moe_layer counts (without a walk over the layers: the planner asks per layout)."""
        if not self.num_experts:
            return 0
        if self.moe_layer_pattern is None:
            return self.num_layers
        return sum(bool(x) for x in self.moe_layer_pattern[: self.num_layers])

    def to_dict(self) -> dict:
        d = asdict(self)
        if d["moe_layer_pattern"] is not None:
            d["moe_layer_pattern"] = list(d["moe_layer_pattern"])
        return d

    @classmethod
    def from_dict(cls, d: dict) -> LLMArch:
        return cls(**known_fields(cls, d, "llm"))


# A module's name in a study (trainer.model.encoders, a point's encoders, run names, the store): letters,
# digits and `_`, a letter first. `encoder:` is the one module of this name.
MODULE_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,31}\Z")
VISION = "vision"


def module_name_problem(name) -> str | None:
    """Why `name` cannot name an encoder module (None: it can); the one owner of the naming rule."""
    if isinstance(name, str) and MODULE_NAME_RE.match(name) and name != "llm":
        return None
    return (
        f"{name!r} cannot name an encoder: use letters, digits and _, a letter first, at most 32 "
        "characters, not 'llm' (e.g. vision, audio, vision_hr)"
    )


def encoder_arch_from_dict(d: dict):
    """An encoder architecture's fields read back as the class its `kind` names: the kind of an audio family
    as AudioArch (model/audio_arch.py), anything else as an image encoder (EncoderArch names what is wrong)."""
    kind = d.get("kind") if isinstance(d, dict) else None
    return (AudioArch if kind in registry.kinds("audio") else EncoderArch).from_dict(d)


@dataclass(frozen=True, init=False)
class ModelArch:
    """Encoders (in order, each under its module name) feeding one LLM; no encoder: a text-only model.

    `ModelArch(name, encoder, llm)` is the one-encoder model (its encoder is the module `vision`);
    `ModelArch(name, None, llm, encoders={...})` names each module."""

    name: str
    named_encoders: tuple  # ((module name, encoder architecture), ...) in rank order
    llm: LLMArch
    description: str = ""

    def __init__(
        self,
        name: str,
        encoder=None,
        llm: LLMArch | None = None,
        description: str = "",
        encoders=None,
        named_encoders=None,
    ):
        if llm is None:
            raise TypeError("ModelArch needs its llm")
        named = dict(named_encoders or ()) | dict(encoders or {})
        if encoder is not None:
            if VISION in named:
                raise ArchError(
                    f"encoders.{VISION}",
                    f"two modules named {VISION!r}: `encoder:` is the module {VISION!r}; give it once",
                )
            named = {VISION: encoder, **named}
        for n in named:
            bad = module_name_problem(n)
            if bad:
                raise ArchError(f"encoders.{n}", bad)
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "named_encoders", tuple(named.items()))
        object.__setattr__(self, "llm", llm)
        object.__setattr__(self, "description", description)

    @property
    def encoders(self) -> dict:
        """Module name -> encoder architecture, in rank order (a fresh dict: the model stays frozen)."""
        return dict(self.named_encoders)

    @property
    def encoder(self):
        """The single encoder, for the code that runs one (None: text-only). Several: ArchError naming them."""
        if not self.named_encoders:
            return None
        if len(self.named_encoders) > 1:
            raise ArchError(
                "encoders",
                f"{len(self.named_encoders)} encoders ({', '.join(self.encoders)}); this part of mimo-jobs "
                "reads one encoder, not several",
            )
        return self.named_encoders[0][1]

    @property
    def single_vision(self) -> bool:
        """One encoder, named `vision`: what `encoder:` describes (run ids and names as they always were)."""
        return len(self.named_encoders) <= 1 and all(n == VISION for n, _ in self.named_encoders)

    @property
    def text_only(self) -> bool:
        """No image encoder: no encoder FLOPs, parameters or ranks, and no image tokens in a sample."""
        return not self.named_encoders

    def to_dict(self) -> dict:
        if self.single_vision:
            enc = self.encoder
            return {
                "name": self.name,
                "encoder": None if enc is None else enc.to_dict(),
                "llm": self.llm.to_dict(),
                "description": self.description,
            }
        return {
            "name": self.name,
            "encoders": {n: a.to_dict() for n, a in self.named_encoders},
            "llm": self.llm.to_dict(),
            "description": self.description,
        }

    @classmethod
    def from_dict(cls, d: dict) -> ModelArch:
        enc = d.get("encoder")
        encs = d.get("encoders") or {}
        return cls(
            name=d.get("name", ""),
            encoder=None if enc is None else encoder_arch_from_dict(enc),
            llm=LLMArch.from_dict(d["llm"]),
            description=d.get("description", ""),
            encoders={n: encoder_arch_from_dict(a) for n, a in encs.items()},
        )


# The names the first version used; kept so the trainer and data modules read either.
EncoderPreset = EncoderArch
LLMPreset = LLMArch
ModelPreset = ModelArch

"""The Whisper audio encoder as a model family: its HuggingFace config fields both ways, its tensor names
against the trainer's module (trainer/model/audio_encoder.py), its token rule and its input features.

Read from a `WhisperConfig` config.json (`WhisperModel`, `WhisperForConditionalGeneration`, ... or a saved
`WhisperEncoder`): only the encoder's fields (encoder_layers, encoder_attention_heads, encoder_ffn_dim,
d_model, num_mel_bins, max_source_positions, activation_function); the decoder is not part of the
encoder. transformers' WhisperEncoder computes `embed_scale` from `scale_embedding` but never applies it
(modeling_whisper.py), so that field changes nothing here and is written back as false.

Tensor layout (megatron-core 0.19's SelfAttention splits linear_qkv per head, as hf_weights.py's ViT):

  linear_qkv.weight   per head a: [q rows of a; k rows of a; v rows of a] from q_proj, k_proj, v_proj
  linear_qkv.bias     the same, with zeros for k: Whisper's k_proj has no bias (export drops the k rows)
  conv1, conv2        torch Conv1d [out, in, 3] as they are, whole on every TP rank
  embed_positions     [max_source_positions, d_model], whole on every TP rank
"""

from __future__ import annotations

from dataclasses import dataclass

from mimo_jobs.model.arch import ArchError
from mimo_jobs.model.audio_arch import AudioArch
from mimo_jobs.model.families.base import Family, register
from mimo_jobs.model.hf_weights import HFLayout, Piece, Target

FAMILY = "whisper"
MODEL_TYPE = "whisper"
# transformers' ACT2FN names this family's encoder may use, as the trainer's activations
ACTIVATIONS = {"gelu": "gelu"}
# The model classes whose config.json describes a Whisper encoder (a full model or the encoder alone)
ARCHITECTURES = (
    "WhisperModel",
    "WhisperForConditionalGeneration",
    "WhisperForAudioClassification",
    "WhisperEncoder",
)
_FIELDS = {  # AudioArch field -> WhisperConfig key
    "num_layers": "encoder_layers",
    "num_attention_heads": "encoder_attention_heads",
    "ffn_hidden_size": "encoder_ffn_dim",
    "hidden_size": "d_model",
    "num_mel_bins": "num_mel_bins",
    "max_source_positions": "max_source_positions",
}


# --------------------------------------------------------------------------------------------- config


def audio_fields(cfg: dict) -> dict:
    """AudioArch fields of a Whisper config.json (a dict), refusing another family or activation by name."""
    if not isinstance(cfg, dict):
        raise ArchError("", f"a HuggingFace config is a JSON object, got {type(cfg).__name__}")
    if cfg.get("model_type") != MODEL_TYPE:
        raise ArchError(
            "model_type", f"{cfg.get('model_type')!r} is not a Whisper config (model_type {MODEL_TYPE!r})"
        )
    out: dict = {"kind": FAMILY}
    for field, key in _FIELDS.items():
        if cfg.get(key) is None:
            raise ArchError(key, "missing from the HuggingFace config")
        out[field] = cfg[key]
    act = cfg.get("activation_function", "gelu")
    if act not in ACTIVATIONS:
        raise ArchError(
            "activation_function",
            f"{act!r} is not an activation the trainer's audio encoder has; it has {', '.join(ACTIVATIONS)}",
        )
    out["activation"] = ACTIVATIONS[act]
    if "pooling" in cfg:  # not Whisper's: what an export of this project writes (audio_config)
        pooling = cfg["pooling"]
        if not isinstance(pooling, int) or isinstance(pooling, bool) or pooling < 1:
            raise ArchError("pooling", f"{pooling!r} is not a whole number of frames of at least 1")
        out["pooling"] = pooling
    return out


def audio_arch(cfg: dict, name: str = "", source: str = "", pooling: int = 1) -> AudioArch:
    """The AudioArch a Whisper config.json describes, pooled by the run's `pooling` (the encoder's weights
    do not depend on it; an exported config's own `pooling` says what the run that wrote it used)."""
    return AudioArch(**(audio_fields(cfg) | {"pooling": pooling}), name=name, source=source)


def audio_config(a: AudioArch, dtype: str = "float32") -> dict:
    """A config.json for the encoder alone (`WhisperEncoder.from_pretrained` reads it; audio_fields reads it
    back to the same fields). The decoder's fields keep WhisperConfig's defaults: no decoder is written.
    `pooling`, which Whisper has not, is kept as a key of its own (transformers keeps a config's unknown keys
    as attributes): the encoder's output is average-pooled over time by it, so a model that reads the export
    gets the trainer's token count per clip from the config (AudioArch.tokens_for_frames)."""
    if a.kind != FAMILY:
        raise ArchError("kind", f"{a.kind!r} is not a Whisper encoder")
    if a.norm_epsilon != 1e-5:
        raise ArchError("norm_epsilon", f"Whisper's LayerNorms use 1e-05, this description {a.norm_epsilon}")
    cfg = {"architectures": ["WhisperEncoder"], "model_type": MODEL_TYPE}
    cfg |= {key: getattr(a, field) for field, key in _FIELDS.items()}
    act = next(k for k, v in ACTIVATIONS.items() if v == a.activation)
    return cfg | {
        "activation_function": act,
        "scale_embedding": False,
        "torch_dtype": dtype,
        "pooling": a.pooling,
    }


def encoder_prefix(names) -> str:
    """Where the encoder's tensors are among HF tensor `names`: "" (a saved WhisperEncoder), "encoder."
    (WhisperModel) or "model.encoder." (WhisperForConditionalGeneration)."""
    tail = "conv1.weight"
    found = sorted(n[: -len(tail)] for n in names if n.endswith(tail) and "decoder" not in n)
    if len(found) != 1:
        raise ArchError("", f"{len(found)} Whisper encoders ({tail} under {found or 'no prefix'})")
    return found[0]


# ------------------------------------------------------------------------------------------- weights


def audio_layout(a: AudioArch, prefix: str = "", into: str = "") -> HFLayout:
    """The encoder's targets: the module's parameter names (after `into`, the module's own prefix inside a
    larger model) against the HF tensors under `prefix` (see encoder_prefix)."""
    targets: dict[str, Target] = {}
    shapes: dict[str, tuple[int, ...]] = {}

    def tensor(name: str, shape) -> str:
        shapes[prefix + name] = tuple(shape)
        return prefix + name

    def add(name: str, shape, pieces, split=None) -> None:
        t = Target(into + name, tuple(shape), tuple(pieces), split)
        assert sum(p.rows for p in t.pieces) == t.shape[0], name
        targets[t.name] = t

    def same(name: str, hf: str, shape, split=None) -> None:
        add(name, shape, [Piece(tensor(hf, shape), shape[0])], split)

    h, n = a.hidden_size, a.num_mel_bins
    for conv, c_in in (("conv1", n), ("conv2", h)):
        same(f"{conv}.weight", f"{conv}.weight", (h, c_in, 3))
        same(f"{conv}.bias", f"{conv}.bias", (h,))
    same("embed_positions", "embed_positions.weight", (a.max_source_positions, h))
    for i in range(a.num_layers):
        _layer(a, f"layers.{i}.", f"decoder.layers.{i}.", tensor, add, same)
    same("ln_post.weight", "layer_norm.weight", (h,))
    same("ln_post.bias", "layer_norm.bias", (h,))
    return HFLayout(targets, shapes, FAMILY)


def _layer(a: AudioArch, hf: str, mc: str, tensor, add, same) -> None:
    h, f, heads, hd = a.hidden_size, a.ffn_hidden_size, a.num_attention_heads, a.head_dim
    same(mc + "input_layernorm.weight", hf + "self_attn_layer_norm.weight", (h,))
    same(mc + "input_layernorm.bias", hf + "self_attn_layer_norm.bias", (h,))
    att = mc + "self_attention."
    for kind in ("weight", "bias"):
        cols = (h,) if kind == "weight" else ()
        q, v = (tensor(f"{hf}self_attn.{x}_proj.{kind}", (h, *cols)) for x in "qv")
        k = tensor(f"{hf}self_attn.k_proj.{kind}", (h, *cols)) if kind == "weight" else None
        pieces = [Piece(t, hd, 0 if t is None else i * hd) for i in range(heads) for t in (q, k, v)]
        add(f"{att}linear_qkv.{kind}", (3 * h, *cols), pieces, split=0)
    same(att + "linear_proj.weight", hf + "self_attn.out_proj.weight", (h, h), split=1)
    same(att + "linear_proj.bias", hf + "self_attn.out_proj.bias", (h,))
    same(mc + "pre_mlp_layernorm.weight", hf + "final_layer_norm.weight", (h,))
    same(mc + "pre_mlp_layernorm.bias", hf + "final_layer_norm.bias", (h,))
    same(mc + "mlp.linear_fc1.weight", hf + "fc1.weight", (f, h), split=0)
    same(mc + "mlp.linear_fc1.bias", hf + "fc1.bias", (f,), split=0)
    same(mc + "mlp.linear_fc2.weight", hf + "fc2.weight", (h, f), split=1)
    same(mc + "mlp.linear_fc2.bias", hf + "fc2.bias", (h,))


# ------------------------------------------------------------------------------------ tokens, features


def tokens_for_frames(a: AudioArch, mel_frames: int) -> int:
    """Audio tokens a clip of `mel_frames` log-mel frames gives the LLM (AudioArch owns the rule)."""
    return a.tokens_for_frames(mel_frames)


@dataclass(frozen=True)
class MelFeatures:
    """The log-mel input the encoder was trained on, as transformers' WhisperFeatureExtractor computes it
    by default: 16 kHz audio, a 400-sample (25 ms) window every 160 samples (10 ms), n_mels bins, clips
    padded or cut to 30 s = 3000 frames. `extractor_kwargs` builds that extractor for another n_mels."""

    n_mels: int = 80
    sampling_rate: int = 16000
    hop_length: int = 160
    n_fft: int = 400
    chunk_seconds: int = 30

    @property
    def chunk_frames(self) -> int:
        return self.frames_for_samples(self.chunk_seconds * self.sampling_rate)

    def frames_for_samples(self, samples: int) -> int:
        """Frames of an unpadded clip of `samples` samples: the centred STFT gives samples // hop + 1 and
        WhisperFeatureExtractor drops the last."""
        if samples < 0:
            raise ArchError("samples", f"must be 0 or more, got {samples}")
        return samples // self.hop_length

    def extractor_kwargs(self) -> dict:
        return {
            "feature_size": self.n_mels,
            "sampling_rate": self.sampling_rate,
            "hop_length": self.hop_length,
            "n_fft": self.n_fft,
            "chunk_length": self.chunk_seconds,
        }


def features_of(a: AudioArch) -> MelFeatures:
    """The input features an encoder takes (its mel bins; Whisper's other defaults)."""
    return MelFeatures(n_mels=a.num_mel_bins)


# ------------------------------------------------------------------------------------------- registry


@register
class Whisper(Family):
    """The registry's entry for this module's functions (families/base.py's Family)."""

    name = FAMILY
    title = "Whisper (encoder)"
    modality = "audio"
    architectures = ARCHITECTURES
    model_types = (MODEL_TYPE,)
    features = (
        "the encoder's fields (`encoder_layers`, `encoder_attention_heads`, `encoder_ffn_dim`, `d_model`, "
        "`num_mel_bins`, `max_source_positions`); the decoder is not read"
    )

    def fields(self, cfg: dict) -> dict:
        return audio_fields(cfg)

    def hf_config(self, arch, dtype: str = "float32") -> dict:
        return audio_config(arch, dtype)

    def tokens_for_frames(self, a: AudioArch, mel_frames: int) -> int:
        return tokens_for_frames(a, mel_frames)

    def arch(self, cfg: dict, name: str = "", source: str = "", pooling: int = 1) -> AudioArch:
        return audio_arch(cfg, name, source, pooling)

    def encoder_prefix(self, names) -> str:
        return encoder_prefix(names)

    def layout(self, a: AudioArch, prefix: str = "", into: str = "") -> HFLayout:
        return audio_layout(a, prefix, into)

    def doc_rows(self) -> list[tuple[str, str, str]]:
        """(trainer parameter, HuggingFace tensor, layout) as audio_layout maps them (docs/weights.md)."""
        layer, lay = "`layers.i.", "`decoder.layers.i."
        return [
            ("`conv1`, `conv2`", "`conv1`, `conv2`", "as is, whole on every TP rank"),
            (
                "`embed_positions`",
                "`embed_positions.weight`",
                "as is (the sinusoidal table), whole on every rank",
            ),
            (f"{lay}input_layernorm`", f"{layer}self_attn_layer_norm`", "as is"),
            (
                f"{lay}self_attention.linear_qkv`",
                f"{layer}self_attn.q_proj`, `k_proj`, `v_proj`",
                "per head: [q; k; v] rows; the bias's k rows are zeros (k_proj has no bias; export drops them)",
            ),
            (f"{lay}self_attention.linear_proj`", f"{layer}self_attn.out_proj`", "as is (TP splits columns)"),
            (f"{lay}pre_mlp_layernorm`", f"{layer}final_layer_norm`", "as is"),
            (f"{lay}mlp.linear_fc1`", f"{layer}fc1`", "as is (TP splits rows)"),
            (f"{lay}mlp.linear_fc2`", f"{layer}fc2`", "as is (TP splits columns)"),
            ("`ln_post`", "`layer_norm`", "as is"),
        ]

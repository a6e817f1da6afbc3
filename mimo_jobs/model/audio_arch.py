"""The audio encoder's description: pure data (no torch), the audio counterpart of arch.py's EncoderArch.

A Whisper-class encoder (transformers' `WhisperEncoder`, modeling_whisper.py): two 1-D convolutions over a
log-mel spectrogram [num_mel_bins, frames] (conv1 kernel 3 stride 1 padding 1, conv2 kernel 3 stride 2
padding 1, GELU after each), a sinusoidal position table of `max_source_positions` rows held as a
parameter (`embed_positions`), pre-norm transformer layers (LayerNorm, attention with q/v biases and an
unbiased k, a GELU MLP with biases), then, as Qwen2-Audio's audio tower does (modeling_qwen2_audio.py), an
optional average pool of stride `pooling` over time, then the final LayerNorm. Every output row is one
audio token the LLM receives; the projector's input width is `hidden_size`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from mimo_jobs.model import registry
from mimo_jobs.model.fields import (
    ArchError,
    check_choice,
    check_finite_positive,
    check_positive,
    check_sizes,
    known_fields,
)

AUDIO_ACTIVATIONS = ("gelu",)


@dataclass(frozen=True)
class Conv:
    """One 1-D convolution over time: its output length is floor((n + 2 * padding - kernel) / stride) + 1."""

    kernel: int
    stride: int
    padding: int

    def out_frames(self, n: int) -> int:
        return (n + 2 * self.padding - self.kernel) // self.stride + 1


# Whisper's two convolutions (transformers' WhisperEncoder: conv1 and conv2), in order
CONVS = (Conv(kernel=3, stride=1, padding=1), Conv(kernel=3, stride=2, padding=1))


def conv_frames(mel_frames: int) -> int:
    """Time steps after both convolutions: ceil(n / 2) for Whisper's."""
    n = mel_frames
    for c in CONVS:
        n = c.out_frames(n)
    return n


def input_stride() -> int:
    """Mel frames per position of the table (the product of the convolutions' strides: 2)."""
    s = 1
    for c in CONVS:
        s *= c.stride
    return s


@dataclass(frozen=True)
class AudioArch:
    kind: str  # the name of an audio family of model/families (model/registry.py): "whisper"
    num_layers: int
    hidden_size: int  # Whisper's d_model
    num_attention_heads: int
    ffn_hidden_size: int
    num_mel_bins: int = 80
    # rows of the position table: time steps after the convolutions (Whisper: 1500, i.e. 3000 mel frames)
    max_source_positions: int = 1500
    # average pool of this stride (and width) over time after the last layer, before the final norm
    # (Qwen2-Audio: 2); 1 = none
    pooling: int = 1
    activation: str = "gelu"
    norm_epsilon: float = 1e-5  # torch's LayerNorm default, which WhisperEncoder's norms keep
    name: str = ""
    source: str = ""

    def __post_init__(self):
        check_choice("kind", self.kind, registry.kinds("audio"))
        check_positive(self, ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size"))
        check_positive(self, ("num_mel_bins", "max_source_positions", "pooling"))
        check_sizes(self)
        check_finite_positive(self, ("norm_epsilon",))
        check_choice("activation", self.activation, AUDIO_ACTIVATIONS)
        if self.hidden_size % self.num_attention_heads:
            raise ArchError(
                "num_attention_heads",
                f"hidden_size {self.hidden_size} is not divisible by {self.num_attention_heads} heads",
            )
        if self.hidden_size % 2 or self.hidden_size < 4:
            raise ArchError(
                "hidden_size",
                f"{self.hidden_size} does not fit the sinusoidal position table, which needs an even width of "
                f"at least 4 (sin and cos halves of 2 or more timescales)",
            )
        if self.pooling > self.max_source_positions:
            raise ArchError(
                "pooling",
                f"{self.pooling} is wider than the {self.max_source_positions} positions of a full clip; "
                f"choose at most {self.max_source_positions}",
            )

    @property
    def modality(self) -> str:
        return "audio"

    @property
    def out_width(self) -> int:
        """The projector's input width: one token is one hidden_size row."""
        return self.hidden_size

    @property
    def max_frames(self) -> int:
        """The longest clip in mel frames: the position table's rows times the convolutions' stride."""
        return self.max_source_positions * input_stride()

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def positions_for_frames(self, mel_frames: int) -> int:
        """Sequence length inside the transformer for a clip of `mel_frames` (checked as tokens_for_frames
        checks it): the rows of the position table it uses, from the first."""
        self._check_frames(mel_frames)
        return conv_frames(int(mel_frames))

    def tokens_for_frames(self, mel_frames: int) -> int:
        """The one rule of how many tokens a clip of `mel_frames` log-mel frames hands the LLM: the time steps
        after the convolutions (stride 2: ceil(n / 2)), then floor(that / pooling) after the pool. A clip
        longer than max_frames, or too short to give one token, is refused (ArchError)."""
        n = self.positions_for_frames(mel_frames) // self.pooling
        if n < 1:
            raise ArchError(
                "pooling",
                f"a clip of {mel_frames} mel frames gives {conv_frames(mel_frames)} time steps, fewer than "
                f"the pooling stride {self.pooling}: no audio token; give clips of at least "
                f"{self.min_frames} frames",
            )
        return n

    @property
    def min_frames(self) -> int:
        """The shortest clip that gives one token."""
        return input_stride() * (self.pooling - 1) + 1

    def _check_frames(self, mel_frames: int) -> None:
        # any integer type (a numpy count from a data loader too), not a bool or a float
        if isinstance(mel_frames, bool) or not hasattr(mel_frames, "__index__") or mel_frames < 1:
            raise ArchError("mel_frames", f"must be a positive integer, got {mel_frames!r}")
        if mel_frames > self.max_frames:
            raise ArchError(
                "max_source_positions",
                f"a clip of {mel_frames} mel frames is longer than the encoder takes: {self.max_frames} "
                f"frames ({self.max_source_positions} positions x stride {input_stride()}); cut it into "
                f"clips of at most {self.max_frames} frames",
            )

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> AudioArch:
        return cls(**known_fields(cls, d, "audio encoder"))


def audio_params(a: AudioArch, held: bool = False) -> int:
    """The encoder's parameters (transformers' WhisperEncoder counts the same, its frozen position table
    included). `held`: as the trainer holds them, whose fused QKV bias also has the k rows Whisper's
    k_proj lacks (zeros from HF weights; a k bias shifts every score of a query alike, which softmax
    ignores, so the rows change no output and export drops them)."""
    h, f, n = a.hidden_size, a.ffn_hidden_size, a.num_mel_bins
    convs = (h * n * 3 + h) + (h * h * 3 + h)
    positions = a.max_source_positions * h
    attention = 4 * h * h + 3 * h  # q, k, v, out weights; q, v, out biases
    mlp = 2 * h * f + f + h
    norms = 2 * 2 * h
    layer = attention + mlp + norms + (h if held else 0)
    return convs + positions + a.num_layers * layer + 2 * h

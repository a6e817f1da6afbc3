"""What every model description shares: the error that names a field, and the checks of its fields (used
by arch.py's architectures and audio_arch.py's)."""

from __future__ import annotations

from dataclasses import MISSING, fields

from mimo_jobs.errors import MimoJobsError


class ArchError(MimoJobsError, ValueError):
    """A model description that cannot be built; `field` is its dotted path inside trainer.model (callers
    prefix it with where the description sits)."""

    def __init__(self, field: str, msg: str):
        super().__init__(msg, where=field or None)
        self.field = field

    def under(self, prefix: str) -> ArchError:
        """The same error with its field placed under `prefix` (e.g. "trainer.model.llm")."""
        return ArchError(f"{prefix}.{self.field}" if self.field else prefix, str(self))


def check_choice(field: str, value, choices) -> None:
    if value not in choices:
        raise ArchError(field, f"{value!r} is not one of {', '.join(map(str, choices))}")


def check_positive(obj, names) -> None:
    for n in names:
        v = getattr(obj, n)
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise ArchError(n, f"must be a positive integer, got {v!r}")


# The largest value each size field of a description may take. A description is data someone hands over, and
# planning walks some fields one step at a time (layers, experts): 10**9 layers would never answer, and widths
# of 10**30 give byte counts no report can hold. Each bound is far above the largest public model's value, so
# no real model is refused: the deepest public LLMs have 126 layers (Llama 3.1 405B's config.json) and
# Megatron-LM's 1T-parameter GPT example 128; the widest hidden size is that example's 25,600 (PaLM 540B:
# 18,432), the widest FFN PaLM's 73,728; heads and KV groups at most 160; head_dim at most 256 (Gemma);
# the largest vocabulary 256,000 (Gemma); the most routed experts 256 (DeepSeek-V3); images of at most a
# few thousand pixels a side, in 3 channels, pixel-shuffled 2x2 to 4x4; Whisper's 128 mel bins and 1,500
# positions. A bound is roughly 8x the largest of these or more.
SIZE_LIMITS: dict[str, int] = {
    "num_layers": 1_024,
    "hidden_size": 1 << 18,
    "ffn_hidden_size": 1 << 20,
    "moe_ffn_hidden_size": 1 << 20,
    "moe_shared_expert_intermediate_size": 1 << 20,
    "num_attention_heads": 4_096,
    "num_query_groups": 4_096,
    "kv_channels": 1 << 14,
    "vocab_size": 1 << 24,
    "num_experts": 1 << 14,
    "moe_router_topk": 1 << 14,
    "image_size": 1 << 16,
    "patch_size": 1 << 16,
    "channels": 1 << 10,
    "downsample": 1 << 8,
    "temporal_patch_size": 1 << 8,  # Qwen2-VL uses 2
    "num_mel_bins": 1 << 12,
    "max_source_positions": 1 << 20,
    "pooling": 1 << 20,
}


def check_sizes(obj) -> None:
    """Every size field of `obj` named in SIZE_LIMITS at or below its bound (a field that is not an integer is
    left to the other checks)."""
    for n, most in SIZE_LIMITS.items():
        v = getattr(obj, n, None)
        if isinstance(v, int) and not isinstance(v, bool) and v > most:
            raise ArchError(n, f"{v:,} is beyond any model this plans or trains; at most {most:,}")


def check_finite_positive(obj, names) -> None:
    """Float fields a model cannot run without: finite and above 0 (a NaN epsilon or a negative rotary base
    would make every iteration NaN, found only after the job ran)."""
    import math

    for n in names:
        v = getattr(obj, n)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise ArchError(n, f"must be a finite number above 0, got {v!r}")


def known_fields(cls, d: dict, where: str) -> dict:
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(d) - names)
    if unknown:
        raise ArchError(unknown[0], f"unknown {where} field; known: {', '.join(sorted(names))}")
    required = [f.name for f in fields(cls) if f.default is MISSING and f.name not in d]
    if required:
        raise ArchError(required[0], f"missing (a required {where} field)")
    return d

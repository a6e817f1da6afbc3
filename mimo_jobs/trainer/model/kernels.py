"""Which layer implementation and which fused kernels a rank uses: decided once, from "on GPU" and what is
installed, and stated in the run's first log line.

`layer_backend` and `fusions` are pure; `installed()` is the one place that probes the environment.
Requirements are megatron-core 0.19's (restated from its sources):
  Transformer Engine layers    megatron.core.extensions.transformer_engine.HAVE_TE; also the RoPE fusion
                               (rope_utils.fused_apply_rotary_pos_emb comes from TE)
  gradient accumulation fusion the fused_weight_gradient_mlp_cuda extension (tensor_parallel/layers.py
                               refuses the flag without it: the LLM's output layer is a local linear)
  masked softmax fusion        the scaled_masked_softmax_cuda, scaled_upper_triang_masked_softmax_cuda and
                               scaled_softmax_cuda kernels (fusions/fused_softmax.py imports the one its
                               mask type and shape take at the first forward: all three must be there)
  bias-activation fusion       jit-fused on any GPU, for SwiGLU only here: megatron's GELU kernels are the
                               tanh approximation (see bias_activation_fusion)
  bias-dropout fusion          jit-fused on any GPU
  cross-entropy fusion         the native implementation on CPU and GPU (it honours pg_collection)
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from megatron.core.extensions import transformer_engine as mte

from mimo_jobs.model.attention import SDPA, keeps_scores

TE = "te"
LOCAL = "local"
# the fused softmax kernels megatron-core's FusedScaleMaskSoftmax imports: causal, masked, unmasked
SOFTMAX_KERNELS = (
    "scaled_upper_triang_masked_softmax_cuda",
    "scaled_masked_softmax_cuda",
    "scaled_softmax_cuda",
)


@dataclass(frozen=True)
class Installed:
    """What the environment offers beyond torch and megatron-core."""

    te: bool = False
    grad_accum_ext: bool = False  # fused_weight_gradient_mlp_cuda
    softmax_ext: bool = False  # the three fused softmax kernels (SOFTMAX_KERNELS)


@dataclass(frozen=True)
class Kernels:
    """The rank's layer backend and fused kernels (TransformerConfig field -> on)."""

    backend: str = LOCAL
    fusions: tuple[tuple[str, bool], ...] = ()
    attention: str = SDPA  # the local layers' core attention (trainer.attention; model/attention.py)

    @property
    def on(self) -> dict[str, bool]:
        return dict(self.fusions)

    @property
    def grouped_gemm(self) -> bool:
        """TE's grouped GEMM for the experts (the local backend runs them one by one)."""
        return self.backend == TE

    @property
    def keeps_scores(self) -> bool:
        """The core attention keeps every s x s score matrix (megatron-core's unfused DotProductAttention)."""
        return keeps_scores(self.backend, self.attention)

    def describe(self) -> str:
        on = [k for k, v in self.fusions if v]
        att = f" | attention {self.attention}" if self.backend == LOCAL else ""
        return f"layers {self.backend}{att} | fused {','.join(on) if on else 'none'}"


def layer_backend(on_gpu: bool, have: Installed) -> str:
    """Transformer Engine layers on a GPU with TE installed, megatron-core's local layers otherwise."""
    return TE if on_gpu and have.te else LOCAL


def fusions(on_gpu: bool, have: Installed) -> dict[str, bool]:
    """The fused kernels a run can use (TransformerConfig fields); all off on CPU. The bias-activation
    fusion is further limited per config by `bias_activation_fusion`."""
    return {
        "bias_activation_fusion": on_gpu,
        "bias_dropout_fusion": on_gpu,
        "masked_softmax_fusion": on_gpu and have.softmax_ext,
        "apply_rope_fusion": on_gpu and have.te,
        "gradient_accumulation_fusion": on_gpu and have.grad_accum_ext,
        "cross_entropy_loss_fusion": True,
    }


def bias_activation_fusion(
    on: bool,
    gated_linear_unit: bool,
    activation: str = "gelu",
    grouped_experts: bool = False,
) -> bool:
    """megatron-core's MLP fuses gated SiLU (SwiGLU) exactly. Its GELU kernels, with a bias
    (fusions/fused_bias_gelu.py) and gated (fused_bias_geglu.py), compute the tanh approximation, not the exact
    GELU ("gelu") the projectors, ViTs, Whisper and InternViT use (their references: F.gelu, HF "gelu"): exact
    GELU stays unfused, as any other activation (quick-GELU, tanh-GELU, plain SiLU). Transformer Engine's
    grouped experts (TEGroupedMLP, megatron/core/transformer/moe/experts.py) fuse only SwiGLU and gated
    quick-GELU and raise on any other fused activation."""
    if grouped_experts:
        return on and gated_linear_unit and activation in ("silu", "quick_gelu")
    return on and activation == "silu" and gated_linear_unit


def kernels_for(on_gpu: bool, have: Installed, attention: str = SDPA) -> Kernels:
    """`attention`: trainer.attention, the local layers' core attention (Transformer Engine's layers run
    their own)."""
    return Kernels(layer_backend(on_gpu, have), tuple(fusions(on_gpu, have).items()), attention)


CPU_KERNELS = kernels_for(False, Installed())


def installed() -> Installed:
    """Probe the environment (megatron-core's TE extension imports without TE and says so in HAVE_TE)."""

    def has(mod: str) -> bool:
        return importlib.util.find_spec(mod) is not None

    return Installed(
        te=bool(mte.HAVE_TE),
        grad_accum_ext=has("fused_weight_gradient_mlp_cuda"),
        softmax_ext=all(has(k) for k in SOFTMAX_KERNELS),
    )

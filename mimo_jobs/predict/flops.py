"""Training FLOPs of the MIMO model: the one FLOPs model of the package (MFU in reports and the trainer's
log line, and the planner's compute time).

Megatron-LM's `num_floating_point_operations` (megatron/training/training.py; Narayanan et al. 2021,
"Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", appendix): 2 FLOPs per
multiply-add, forward + backward = 3x forward. Per LLM token and layer, forward:
  attention projections 2h(h + 2 g d) + 2h^2  (q, k, v with g query groups of d = h/a, and o)
  causal attention core 2 * 2 s h / 2          (QK^T and AV over the s keys, half of them under the mask)
  MLP                   2 * m * h f            (m = 2 matrices: the trainer's MLP is plain GELU, not SwiGLU)
  MoE                   2 h E (router) + k * 2 * 2 h f_e (routed experts) + 2 * 2 h f_s (shared experts)
plus the logits 2 h V per token. The encoder: per image token, its ViT layers (bidirectional: the core is
not halved) over the tokens of its image, the patch embedding 2 C p^2 h_e and the projector
2 (h_e h_l + h_l^2).
"""

from __future__ import annotations

from dataclasses import dataclass

from mimo_jobs.study.presets import EncoderPreset, LLMPreset, ModelPreset

MLP_MATRICES = 2  # models.py builds megatron-core's default MLP (gated_linear_unit=False): fc1, GELU, fc2


@dataclass(frozen=True)
class SampleFlops:
    """Training FLOPs (forward + backward) of one sample, per module."""

    encoder: float
    llm: float

    @property
    def total(self) -> float:
        return self.encoder + self.llm


def llm_layer_forward_flops(p: LLMPreset, seq: int, causal_halved: bool = True) -> float:
    """Forward FLOPs of one LLM transformer layer for one token of a `seq`-token sequence."""
    h = p.hidden_size
    g = p.num_query_groups or p.num_attention_heads
    d = h // p.num_attention_heads
    proj = 2 * h * (h + 2 * g * d) + 2 * h * h
    core = 4 * seq * h / (2 if causal_halved else 1)
    if p.num_experts:
        fe = p.moe_ffn_hidden_size or p.ffn_hidden_size
        mlp = 2 * h * p.num_experts + p.moe_router_topk * 2 * MLP_MATRICES * h * fe
    else:
        mlp = 2 * MLP_MATRICES * h * p.ffn_hidden_size
    return proj + core + mlp


def llm_flops_per_token(p: LLMPreset, seq: int, causal_halved: bool = True) -> float:
    """Training FLOPs per LLM token: 3 x (layers + logits)."""
    return 3 * (
        p.num_layers * llm_layer_forward_flops(p, seq, causal_halved) + 2 * p.hidden_size * p.vocab_size
    )


def encoder_flops_per_token(e: EncoderPreset, llm_hidden: int, tokens_per_image: float) -> float:
    """Training FLOPs per image token of the ViT + projector, the image having `tokens_per_image` tokens."""
    h = e.hidden_size
    layer = 2 * h * 3 * h + 2 * h * h + 4 * tokens_per_image * h + 2 * MLP_MATRICES * h * e.ffn_hidden_size
    patch = 2 * e.channels * e.patch_size**2 * h
    projector = 2 * (h * llm_hidden + llm_hidden * llm_hidden)
    return 3 * (e.num_layers * layer + patch + projector)


def full_image_tokens(e: EncoderPreset) -> int:
    return (e.image_size // e.patch_size) ** 2


def flops_per_sample(
    preset: ModelPreset,
    seq_length: int,
    image_tokens: float,
    tokens_per_image: float | None = None,
    causal_halved: bool = True,
) -> SampleFlops:
    """One sample: `seq_length` LLM tokens, `image_tokens` encoder tokens in images of `tokens_per_image`
    tokens each (default: one image holding them all)."""
    per_image = image_tokens if tokens_per_image is None else tokens_per_image
    enc = image_tokens * encoder_flops_per_token(preset.encoder, preset.llm.hidden_size, per_image)
    llm = seq_length * llm_flops_per_token(preset.llm, seq_length, causal_halved)
    return SampleFlops(enc, llm)

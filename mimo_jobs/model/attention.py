"""Which core attention the local layers run, and whether it keeps the score matrix for backward: the one
rule the trainer (trainer/model/kernels.py builds the layers by it) and the planner (predict/activations.py
prices them by it) share.

`trainer.attention` chooses for megatron-core's local layers (the CPU, and a GPU without Transformer
Engine): `sdpa`, torch's fused scaled_dot_product_attention (trainer/model/sdpa.py), which keeps the output
and the fp32 log-sum-exp per query row; or `unfused`, megatron-core's DotProductAttention, which computes and
keeps every s x s score matrix. Transformer Engine's layers always run its fused attention. Which kernel
the step-time model prices each as: attention_kernel.
"""

from __future__ import annotations

from typing import Literal, get_args

Attention = Literal["sdpa", "unfused"]
SDPA, UNFUSED = get_args(Attention)


def attention_kernel(layers: str, attention: str) -> str:
    """The kernel the step-time model prices the core attention as (predict/opdata.py ATTENTION_KERNELS):
    Transformer Engine's layers run cuDNN's fused attention; the local layers torch's SDPA (its flash
    backend, FlashAttention-2, on a GPU) or megatron-core's unfused DotProductAttention."""
    if layers == "local":
        return "unfused" if attention == UNFUSED else "flash2"
    return "cudnn"


def keeps_scores(layers: str, attention: str) -> bool:
    """Whether a run on `layers` ("te" or "local") with `attention` keeps the s x s scores for backward."""
    return layers == "local" and attention == UNFUSED


def expands_groups(layers: str, attention: str) -> bool:
    """Whether the core attention copies K and V from the query groups to every head (grouped-query
    attention): megatron-core's DotProductAttention does; TE's and torch's fused attention read the groups."""
    return keeps_scores(layers, attention)


def keeps_mask(layers: str, attention: str) -> bool:
    """Whether the attention keeps the boolean s x s mask the layers are given for backward: megatron-core's
    unfused core does (its masked_fill), torch's SDPA does not (the trainer's causal mask becomes
    is_causal, an all-False one no mask: trainer/model/sdpa.py). Transformer Engine's layers are priced as
    keeping it, as before SDPA existed (not measured here: no TE on the CPU)."""
    return not (layers == "local" and attention == SDPA)

"""Bytes autograd keeps for backward per microbatch (the activations), per module and pipeline stage.

Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models": per layer
s b h (34 + 5 a s / h) bytes in 16-bit with dropout, i.e. 16 tensors of h per token (layer-norm inputs, the
QKV input, Q, K, V, the projection input, the MLP input, the 4h MLP intermediates) + two 1-byte dropout
masks, and 5 a s per token for the attention scores. Tensor parallelism divides all but the layer-norm and
linear inputs by t; sequence parallelism divides those too; selective recompute drops the score term; full
recompute keeps the layer input only (plus one layer during its recompute). The trainer's models differ from
the paper's in what is stored, and this module counts what they store (checked byte for byte against the
trainer's SavedTensorMeter in tests/predict): no dropout (p = 0: no masks), fp32 layer-norm statistics,
RoPE's cos/sin tables, the fused QKV storage (Q and K are rotated copies, V a view), a plain GELU MLP of
width f; MoE layers price each routed token (top-k copies of h, 3 tensors of f_e per copy) and the
router's fp32/int64 bookkeeping; the last stage keeps fp32 logits for the cross entropy. On GPUs the
fused (flash) attention keeps no s x s scores, only fp32 softmax statistics.
"""

from __future__ import annotations

from .run import RunShape

LN_STATS = 16  # two layer norms x (mean, rstd) in fp32, per token
ROUTER_INT64_PER_K = 28  # int64 indices (3 per routed copy) + an fp32 probability, per routed copy
ROUTER_PER_EXPERT = 9  # fp32 scores + fp32 probabilities + a bool routing map, per token and expert


def _attention(h: int, kv: int, heads: int, keys: int, tp: int, d: int, recompute: str, fused: bool) -> float:
    """Per token: Q and K after RoPE, the QKV storage, the projection input, and the scores."""
    shard = d * (h + kv + (h + 2 * kv) + h)
    if fused:
        shard += 4 * heads  # softmax statistics
    elif recompute == "none":
        shard += d * heads * keys
    return shard / tp


def llm_layer_bytes_per_token(rs: RunShape, fused: bool) -> float:
    p, lay, d = rs.preset.llm, rs.layout, rs.dtype_bytes
    h, tp, heads = p.hidden_size, lay.llm_tp, p.num_attention_heads
    head = h // heads
    kv = (p.num_query_groups or heads) * head
    replicated = d * (4 * h + 4 * head) + LN_STATS  # LN inputs, QKV and MLP inputs, RoPE cos/sin
    shard = _attention(h, kv, heads, rs.seq_length, tp, d, rs.recompute, fused)
    if p.num_experts:
        k, fe = p.moe_router_topk, p.moe_ffn_hidden_size or p.ffn_hidden_size
        routed = ROUTER_INT64_PER_K * k + ROUTER_PER_EXPERT * p.num_experts + k * (d * h + 3 * d * fe + 4)
        shard += routed / (tp if rs.sequence_parallel else 1) / lay.llm_etp
    else:
        shard += 2 * d * p.ffn_hidden_size / tp
    if rs.sequence_parallel:
        replicated /= tp
    return replicated + shard


def llm_bytes(rs: RunShape, stage: int, fused: bool) -> int:
    """One microbatch on LLM pipeline stage `stage`."""
    p, lay, d = rs.preset.llm, rs.layout, rs.dtype_bytes
    s, b, tp = rs.seq_length, lay.mbs, lay.llm_tp
    tokens = s * b
    layers = p.num_layers // lay.llm_pp
    per_layer = llm_layer_bytes_per_token(rs, fused)
    sp = tp if rs.sequence_parallel else 1
    if rs.recompute == "full":
        body = tokens * (layers * d * p.hidden_size / sp + per_layer)
    else:
        body = tokens * layers * per_layer
    extra = s * s  # the boolean causal mask each stage builds
    if stage == 0:
        extra += 8 * tokens  # the token ids the embedding keeps
    if stage == lay.llm_pp - 1:
        # final norm input + stats, output-layer input, fp32 logits, the loss's mask and labels
        extra += tokens * ((2 * d * p.hidden_size + 8) / sp + 4 * p.vocab_size / tp + 9)
    return int(body + extra)


def encoder_bytes(rs: RunShape, fused: bool) -> int:
    """One encoder microbatch: its samples' images at full size (the upper bound)."""
    e, lay, d = rs.preset.encoder, rs.layout, rs.dtype_bytes
    n = rs.image_tokens_max
    tokens = n * rs.encoder_samples_per_microbatch
    tp, h, hl = lay.enc_tp, e.hidden_size, rs.preset.llm.hidden_size
    replicated = d * 4 * h + LN_STATS
    shard = d * (3 * h + h) + d * 2 * e.ffn_hidden_size
    if fused:
        shard += 4 * e.num_attention_heads
    elif rs.recompute == "none":
        shard += d * e.num_attention_heads * n
    per_layer = replicated + shard / tp
    if rs.recompute == "full":
        body = tokens * (e.num_layers * d * h + per_layer)
    else:
        body = tokens * e.num_layers * per_layer
    patch_and_projector = tokens * d * (e.channels * e.patch_size**2 + h + 2 * hl / tp)
    masks = n * n * rs.encoder_samples_per_microbatch
    return int(body + patch_and_projector + masks)


def embedding_bytes(rs: RunShape, samples: int) -> int:
    """Image embeddings of `samples` samples crossing the bridge (one direction)."""
    return int(samples * rs.image_tokens_max * rs.preset.llm.hidden_size * rs.dtype_bytes)

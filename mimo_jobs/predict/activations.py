"""Bytes autograd keeps for backward per microbatch (the activations), per module and pipeline stage.

Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models": per layer
s b h (34 + 5 a s / h) bytes in 16-bit with dropout, i.e. 16 tensors of h per token (layer-norm inputs, the
QKV input, Q, K, V, the projection input, the MLP input, the 4h MLP intermediates) + two 1-byte dropout
masks, and 5 a s per token for the attention scores. Tensor parallelism divides all but the layer-norm and
linear inputs by t; sequence parallelism divides those too; selective recompute drops the score term; full
recompute keeps the layer input only (plus one layer during its recompute); each module is priced with its
own setting (trainer.recompute per module). The trainer's models differ from the paper's in what is
stored, and this module counts what they store (checked byte for byte against the
trainer's SavedTensorMeter in tests/predict): no dropout (p = 0: no masks), fp32 layer-norm statistics,
RoPE's cos/sin tables, the fused QKV storage (Q and K are rotated copies, V a view), the MLP (a plain
GELU MLP keeps 2 tensors of width f; a gated one keeps fc1's 2f, the activation's f and the product's f);
QK-norm keeps its per-head inputs and statistics; MoE layers price each routed token (top-k copies of h,
3 tensors of f_e per copy, 2 more when gated), the shared experts like a dense MLP, and the router's
fp32/int64 bookkeeping; dense and MoE layers as moe_layer_pattern says; the last stage keeps fp32 logits
(padded vocabulary) for the cross entropy. An image module's ViT runs over downsample^2 patches per LLM
image token plus the class token; an audio module over its mel frames (audio_bytes). Transformer Engine's
fused (flash) attention and torch's SDPA on the local layers (trainer.attention: sdpa, the default) keep
no s x s scores, only fp32 softmax statistics, and read the query groups as they are; megatron-core's unfused local attention (trainer.attention: unfused, on the
CPU or a GPU without Transformer Engine: hardware.GPU.layers) keeps the scores' probabilities, in 16-bit
precision an fp32 copy of them too (score_bytes), K and V copied to every head, and the boolean mask.
model/attention.py holds which keeps what.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from mimo_jobs.model.arch import LLMArch, padded_vocab
from mimo_jobs.model.attention import expands_groups, keeps_mask, keeps_scores
from mimo_jobs.study.topology import module_ranges

from .pipesplit import chunk_layers, stage_layers
from .run import RunShape

LN_STATS = 16  # two layer norms x (mean, rstd) in fp32, per token
RMS_STATS = 8  # two RMSNorms x rstd in fp32, per token
ROUTER_INT64_PER_K = 28  # int64 indices (3 per routed copy) + an fp32 probability, per routed copy
ROUTER_PER_EXPERT = 9  # fp32 scores + fp32 probabilities + a bool routing map, per token and expert
# Dropless routing is not balanced: the fullest EP rank receives more routed copies than the mean (the CPU
# runs of tests/predict/test_predict_vs_trainer.py saw +18% on one rank of two). Memory prices the fullest
# rank with this allowance whenever EP > 1, so a verdict errs on the safe side (docs/predict.md).
MOE_IMBALANCE = 1.2


def mlp_tensors(gated: bool, fused_swiglu: bool = False) -> int:
    """Width-f tensors one MLP keeps per token: fc1's output and the activation's (gated: fc1's two halves,
    the activation of the gate and the product). megatron-core's fused SwiGLU (fusions/fused_bias_swiglu.py,
    SwiGLUFunction: save_for_backward(input) only, the gate's activation recomputed in its backward) keeps
    fc1's two halves and the product fc2 reads: 3. GPU runs fuse it (bias_activation_fusion: the packaged
    trainer's trainer/model/kernels.py on any GPU, Megatron-LM's --bias-swiglu-fusion default, NeMo's and
    Megatron-Bridge's Llama configs); the CPU's local layers do not."""
    if gated:
        return 3 if fused_swiglu else 4
    return 2


def fuses_swiglu(rs: RunShape, layers: str) -> bool:
    """A gated SiLU MLP on Transformer Engine layers (a GPU run) runs megatron-core's fused SwiGLU, unless
    the run says it does not (RunShape.fused_swiglu)."""
    p = rs.preset.llm
    return rs.fused_swiglu and layers == "te" and p.gated_linear_unit and p.activation == "silu"


def score_bytes(d: int) -> int:
    """Bytes the unfused attention keeps per score (megatron-core 0.19.2's local DotProductAttention with
    torch's softmax, fusions/fused_softmax.py `forward_torch_softmax`): the probabilities the context bmm
    keeps in the run's dtype, and, for 16-bit inputs, the fp32 softmax output too (the config's
    attention_softmax_in_fp32, on by default, softmaxes an fp32 copy and casts the result back). No dropout
    mask: the trainer's attention dropout is 0."""
    return d + (4 if d < 4 else 0)


def mask_bytes(rs: RunShape, layers: str, n: int) -> int:
    """The boolean n x n mask a sequence's attention keeps for backward (model/attention.py keeps_mask)."""
    return n * n if keeps_mask(layers, rs.attention) else 0


def _attention(rs: RunShape, layers: str, q: int, kv: int, heads: int, keys: int, tp: int) -> float:
    """Per token: Q and K after RoPE, the QKV storage, the projection input (which a fused core's output
    is), and the scores or their softmax statistics (q = heads x head_dim channels, kv = query groups x
    head_dim)."""
    d = rs.dtype_bytes
    shard = d * (q + kv + (q + 2 * kv) + q)
    if expands_groups(layers, rs.attention) and kv < q:
        shard += d * 2 * q  # the unfused core expands K and V from the query groups to every head
    shard += _core(rs, layers, heads, keys, rs.recompute.llm)
    return shard / tp


def _core(rs: RunShape, layers: str, heads: int, keys: int, recompute: str) -> float:
    """Per position, beside Q, K, V and the output: a fused core's fp32 log-sum-exp per head, or the
    unfused core's scores unless recomputed (model/attention.py says which core keeps them)."""
    if not keeps_scores(layers, rs.attention):
        return 4 * heads
    return score_bytes(rs.dtype_bytes) * heads * keys if recompute == "none" else 0


def _stats(p: LLMArch) -> int:
    return RMS_STATS if p.normalization == "RMSNorm" else LN_STATS


def llm_layer_bytes_per_token(rs: RunShape, layers: str, moe: bool | None = None) -> float:
    """One layer, per token (`moe`: an MoE layer; None: as the model's first MoE layer, if any), on
    `layers` ("te" or "local": hardware.GPU.layers)."""
    p, lay, d = rs.preset.llm, rs.layout, rs.dtype_bytes
    h, tp, heads, head = p.hidden_size, lay.llm_tp, p.num_attention_heads, p.head_dim
    q, kv = heads * head, p.query_groups * head
    # the unfused (local, CPU) RMSNorm is torch's composite one: it also keeps its normalised input
    rms = layers != "te" and p.normalization == "RMSNorm"
    replicated = d * ((4 + 2 * rms) * h + 4 * head) + _stats(p)  # norm inputs, QKV/MLP inputs, RoPE cos/sin
    shard = _attention(rs, layers, q, kv, heads, rs.seq_length, tp)
    if p.qk_layernorm:  # the per-head q and k inputs (and normalised copies) and their fp32 statistics
        shard += (d * (q + kv) * (1 + rms) + 4 * (heads + p.query_groups)) / tp
    m = mlp_tensors(p.gated_linear_unit, fuses_swiglu(rs, layers))
    if moe if moe is not None else bool(p.num_experts):
        k, fe = p.moe_router_topk, p.expert_ffn
        per_copy = d * h + (3 + 2 * p.gated_linear_unit) * d * fe + 4
        routed = ROUTER_INT64_PER_K * k + ROUTER_PER_EXPERT * p.num_experts + k * per_copy
        imbalance = MOE_IMBALANCE if lay.llm_ep > 1 else 1.0
        shard += imbalance * routed / (tp if rs.sequence_parallel else 1) / lay.llm_etp
        if p.moe_shared_expert_intermediate_size:
            shard += m * d * p.moe_shared_expert_intermediate_size / tp
    else:
        shard += m * d * p.ffn_hidden_size / tp
    if rs.sequence_parallel:
        replicated /= tp
    return replicated + shard


@dataclass(frozen=True)
class StageActivations:
    """What one LLM pipeline stage keeps: `chunks`, bytes per microbatch of each of its model chunks (a stage
    runs `virtual_stages` chunks of its layers, as pipesplit.py assigns them), `extra` bytes per microbatch
    outside the layers (mask, token ids, logits), and `workspace` bytes held once whatever the microbatches
    in flight: under full recompute, the one layer being recomputed for its backward."""

    chunks: tuple[float, ...]
    extra: float
    workspace: float

    @property
    def chunk(self) -> float:
        """The mean chunk: every chunk's where the layers split evenly."""
        return sum(self.chunks) / len(self.chunks)


def _stage_chunks(rs: RunShape, stage: int) -> list[list[int]]:
    """The global layer indices of each model chunk of `stage` (pipesplit.py); where megatron-core would
    refuse the split, the even share num_layers // pp cut into virtual_stages equal chunks."""
    p, lay, vp = rs.preset.llm, rs.layout, max(1, rs.virtual_stages)
    chunks = chunk_layers(p.num_layers, lay.llm_pp, vp, rs.pipeline_split)
    if chunks is not None:
        return [list(c) for c in chunks[stage]]
    return [stage_layers(p.num_layers, lay.llm_pp, vp, rs.pipeline_split, stage)]


def llm_stage(rs: RunShape, stage: int, layers: str) -> StageActivations:
    """One microbatch on LLM pipeline stage `stage`, split as the schedule holds it."""
    p, lay, d = rs.preset.llm, rs.layout, rs.dtype_bytes
    s, b, tp = rs.seq_length, lay.mbs, lay.llm_tp
    tokens = s * b / lay.llm_cp  # context parallelism: each rank keeps its 1/cp of every sequence
    groups = _stage_chunks(rs, stage)
    sp = tp if rs.sequence_parallel else 1
    # a layer's bytes depend only on whether it is an MoE layer: each kind is counted once
    kinds = {
        k: llm_layer_bytes_per_token(rs, layers, k) for k in {p.is_moe_layer(i) for g in groups for i in g}
    }
    per = {i: kinds[p.is_moe_layer(i)] for g in groups for i in g}
    workspace = 0.0
    if rs.recompute.llm == "full":
        bodies = [tokens * len(g) * d * p.hidden_size / sp for g in groups]  # each layer's input
        workspace = tokens * max(per.values(), default=0.0)
    else:
        bodies = [tokens * sum(per[i] for i in g) for g in groups]
    if len(groups) == 1 and rs.virtual_stages > 1:  # the even share, in equal chunks
        bodies = [bodies[0] / rs.virtual_stages] * rs.virtual_stages
    extra = mask_bytes(rs, layers, s) / lay.llm_cp  # the causal mask each stage builds (its queries' rows)
    if stage == 0:
        extra += 8 * tokens  # the token ids the embedding keeps
    if stage == lay.llm_pp - 1:
        # final norm input + stats, output-layer input, fp32 logits, the loss's mask and labels
        vocab = padded_vocab(p.vocab_size, tp)
        rms = layers != "te" and p.normalization == "RMSNorm"
        extra += tokens * (((2 + rms) * d * p.hidden_size + _stats(p) // 2) / sp + 4 * vocab / tp + 9)
    return StageActivations(tuple(bodies), extra, workspace)


def inflight_chunks(pp: int, vp: int, microbatches: int, stage: int) -> int:
    """Model chunks whose activations stage `stage` holds at its peak under megatron-core's 1F1B schedule
    (pipeline_parallel/schedules.py): without interleaving, the pp - stage - 1 warm-up forwards and the one in
    flight; interleaved with vp chunks per stage, (pp - stage - 1) * 2 + (vp - 1) * pp warm-up chunk forwards
    and the one in flight, at most every chunk of every microbatch."""
    if vp <= 1:
        return max(1, min(microbatches, pp - stage))
    return max(1, min(microbatches * vp, (pp - stage - 1) * 2 + (vp - 1) * pp + 1))


def inflight_chunk_bytes(pp: int, vp: int, microbatches: int, stage: int, chunks: tuple) -> float:
    """Activation bytes stage `stage` holds at its peak, `chunks` the bytes of one microbatch of each of its
    model chunks: inflight_chunks times the chunk where the chunks are equal; else the schedule's order
    played through (interleaved_peak)."""
    if len(set(chunks)) <= 1:
        return inflight_chunks(pp, vp, microbatches, stage) * (chunks[0] if chunks else 0.0)
    return interleaved_peak(pp, vp, microbatches, stage, tuple(chunks))


@functools.lru_cache(maxsize=1024)
def interleaved_peak(pp: int, vp: int, microbatches: int, stage: int, chunks: tuple) -> float:
    """The most bytes held at once on stage `stage` of megatron-core 0.19.2's interleaved 1F1B
    (pipeline_parallel/schedules.py, forward_backward_pipelining_with_interleaving, with
    microbatch_group_size_per_vp_stage = pp, its default): forward k runs the chunk of get_schedule_table's
    k-th entry (groups of pp microbatches through chunk 0, then chunk 1, ...), backward k the mirrored chunk
    (vp - 1 - that chunk); the stage runs inflight_chunks - 1 warm-up forwards, then forward k + warm-up
    before backward k, then the remaining backwards. The peak is right after a forward."""
    table = []
    for low in range(0, microbatches, pp):
        group = range(low, microbatches if low + pp >= microbatches else low + pp)
        table += [c for c in range(vp) for _ in group]
    warmup = inflight_chunks(pp, vp, microbatches, stage) - 1
    held = peak = sum(chunks[c] for c in table[: warmup + 1])
    peak = held
    for k in range(len(table) - warmup - 1):
        held -= chunks[vp - 1 - table[k]]
        held += chunks[table[k + warmup + 1]]
        peak = max(peak, held)
    return peak


def llm_bytes(rs: RunShape, stage: int, layers: str) -> int:
    """One microbatch on LLM pipeline stage `stage` (every chunk of it), with full recompute's workspace."""
    a = llm_stage(rs, stage, layers)
    return int(sum(a.chunks) + a.extra + a.workspace)


def module_bytes(rs: RunShape, i: int, layers: str) -> int:
    """One microbatch of encoder module `i` (rs.modules[i]) on one of its ranks: its samples per microbatch
    (topology.module_ranges) at their most tokens, by its architecture's modality."""
    name, arch = rs.preset.named_encoders[i]
    mix, mr = rs.modules[i], module_ranges(rs.layout)[i]
    formula = audio_bytes if arch.modality == "audio" else image_bytes
    return formula(rs, arch, mix, mr.samples_per_encoder_microbatch, mr.tp, layers)


def image_bytes(rs: RunShape, e, mix, samples: int, tp: int, layers: str) -> int:
    """One image microbatch of `samples` samples, each at its most image tokens (mix.tokens_max, the upper
    bound): the ViT's layers over downsample^2 patches per token plus the class token, the patch inputs and
    the projector's."""
    d = rs.dtype_bytes
    out_tokens = mix.tokens_max * samples  # what the projector sees
    patches = mix.tokens_max * e.downsample**2
    n = patches + int(e.class_token)  # the ViT's sequence
    tokens = n * samples
    h, hl = e.hidden_size, rs.preset.llm.hidden_size
    replicated = d * 4 * h + LN_STATS
    shard = d * (3 * h + h) + d * 2 * e.ffn_hidden_size
    shard += _core(rs, layers, e.num_attention_heads, n, rs.recompute.encoder)
    per_layer = replicated + shard / tp
    if rs.recompute.encoder == "full":
        body = tokens * (e.num_layers * d * h + per_layer)
    else:
        body = tokens * e.num_layers * per_layer
    patch_inputs = patches * samples * d * e.patch_inputs
    patch_and_projector = patch_inputs + out_tokens * d * (e.projector_input + 2 * hl / tp)
    masks = mask_bytes(rs, layers, n) * samples
    return int(body + patch_and_projector + masks)


def audio_bytes(rs: RunShape, a, mix, samples: int, tp: int, layers: str) -> int:
    """One audio microbatch of `samples` samples, each at its most audio tokens (mix.tokens_max, in whole
    clips of mix.frames frames), as image_bytes counts a ViT's: per layer and position the norm inputs and
    fp32 statistics, the QKV input, Q, K, V, the projection input, the MLP's two tensors of width f, and the
    scores unless fused or recomputed; before the layers the spectrogram, conv1's output and its GELU's
    (conv2's input), conv2's output and its GELU's; after them the pool, the final norm and the projector's
    inputs."""
    d, h, hl = rs.dtype_bytes, a.hidden_size, rs.preset.llm.hidden_size
    clips = mix.max_items * samples
    frames = mix.frames
    n = a.positions_for_frames(frames) if frames else 0  # positions per clip inside the transformer
    positions = clips * n
    replicated = d * 4 * h + LN_STATS
    shard = d * (3 * h + h) + d * 2 * a.ffn_hidden_size
    if not keeps_scores(layers, rs.attention):
        shard += 4 * a.num_attention_heads
    elif rs.recompute.encoder == "none":
        shard += d * a.num_attention_heads * n
    per_layer = replicated + shard / tp
    if rs.recompute.encoder == "full":
        body = positions * (a.num_layers * d * h + per_layer)
    else:
        body = positions * a.num_layers * per_layer
    convs = clips * frames * d * (a.num_mel_bins + 2 * h) + positions * d * 2 * h
    out_tokens = clips * (n // a.pooling)
    after = positions * d * h * (a.pooling > 1) + out_tokens * (d * h + LN_STATS // 2)
    projector = out_tokens * d * (a.out_width + 2 * hl / tp)
    masks = clips * mask_bytes(rs, layers, n)
    return int(body + convs + after + projector + masks)


def bridge_bytes(rs: RunShape, mix, samples: int) -> int:
    """One module's embeddings of `samples` samples crossing its bridge (one direction), each at its most
    tokens."""
    return int(samples * mix.tokens_max * rs.preset.llm.hidden_size * rs.dtype_bytes)


def embedding_bytes(rs: RunShape, samples: int) -> int:
    """Every module's embeddings of `samples` samples reaching the LLM's first stage (one direction)."""
    return int(samples * rs.image_tokens_max * rs.preset.llm.hidden_size * rs.dtype_bytes)

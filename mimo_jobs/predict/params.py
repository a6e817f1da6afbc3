"""The parameter tensors one rank holds after TP/EP/PP sharding, in megatron-core's order, as numel counts.

Mirrors what models.py builds (megatron-core 0.16.1, local and Transformer Engine specs hold the same
tensors): LayerNorm with weight and bias; linear biases unless the LLM is MoE (add_bias_linear=False);
column-parallel weights and biases split over TP, row-parallel weights split and their biases replicated;
the router replicated; experts split over EP (whole experts) and ETP; the embedding on the first pipeline
stage and the final norm + untied output layer on the last. The order matters to the distributed
optimizer's shards (memory.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from mimo_jobs.study.presets import ModelPreset


@dataclass(frozen=True)
class Tensor:
    numel: int
    expert: bool = False  # held in the expert-parallel gradient buffer (EP > 1)


def _layer(h: int, qkv_out: int, ffn: int, tp: int, bias: bool) -> list[Tensor]:
    """A dense transformer layer: norms, attention (o before qkv, as registered), MLP."""
    out = [Tensor(h), Tensor(h), Tensor(h * h // tp)]
    out += [Tensor(h)] if bias else []
    out += [Tensor(qkv_out * h // tp)] + ([Tensor(qkv_out // tp)] if bias else [])
    out += [Tensor(h), Tensor(h)]
    return out + _mlp(h, ffn, tp, bias)


def _mlp(h: int, ffn: int, tp: int, bias: bool) -> list[Tensor]:
    out = [Tensor(ffn * h // tp)] + ([Tensor(ffn // tp)] if bias else [])
    return out + [Tensor(h * ffn // tp)] + ([Tensor(h)] if bias else [])


def encoder_tensors(preset: ModelPreset, tp: int) -> list[Tensor]:
    """ViT (position table, patch embedding, layers) + projector on one encoder TP rank."""
    e, hl = preset.encoder, preset.llm.hidden_size
    h = e.hidden_size
    out = [Tensor((e.image_size // e.patch_size) ** 2 * h), Tensor(h // tp * e.channels * e.patch_size**2)]
    for _ in range(e.num_layers):
        out += _layer(h, 3 * h, e.ffn_hidden_size, tp, True)
    out += [Tensor(hl * h // tp), Tensor(hl // tp), Tensor(hl * hl // tp), Tensor(hl)]
    return out


def llm_tensors(preset: ModelPreset, tp: int, ep: int, etp: int, pp: int, stage: int) -> list[Tensor]:
    """One LLM pipeline stage on one TP/EP rank."""
    p = preset.llm
    h, bias = p.hidden_size, not p.num_experts
    g = p.num_query_groups or p.num_attention_heads
    qkv_out = h + 2 * g * (h // p.num_attention_heads)
    out = [Tensor(p.vocab_size * h // tp)] if stage == 0 else []
    for _ in range(p.num_layers // pp):
        if not p.num_experts:
            out += _layer(h, qkv_out, p.ffn_hidden_size, tp, bias)
            continue
        out += _layer(h, qkv_out, 0, tp, bias)[:-2]  # attention and norms; the MoE block follows
        fe = p.moe_ffn_hidden_size or p.ffn_hidden_size
        out.append(Tensor(p.num_experts * h))
        # with EP=1 megatron-core leaves experts in the dense gradient buffer (their allreduce flag stays True)
        out += [Tensor(fe * h // etp, ep > 1), Tensor(h * fe // etp, ep > 1)] * (p.num_experts // ep)
    if stage == pp - 1:
        out += [Tensor(h), Tensor(h), Tensor(p.vocab_size * h // tp)]
    return out

"""Parameters: the model's totals (unpadded, as HuggingFace transformers counts them) and the tensors one
rank holds after TP/EP/PP sharding (megatron-core's registration order, as numel counts).

The rank lists mirror what the trainer builds (trainer/model/models.py on megatron-core 0.19; the local
and Transformer Engine specs hold the same tensors). A module's own parameters come before its children's
(torch's named_parameters order), so the ViT lists its class token and position rows before the patch
embedding, and a gated shared expert its gate before its MLP. Norms hold a weight (RMSNorm) or a weight and
a bias (LayerNorm); column-parallel weights and biases are split over TP, row-parallel weights are split and
their biases replicated; a gated MLP's fc1 holds gate and up (2 x width); the router, the final norm and
the QK-norms (head_dim each) are whole; experts are split over EP (whole experts) and ETP; the embedding
sits on the first pipeline stage, the final norm and the output layer on the last (a tied output layer is
the embedding itself with one stage, a copy on the last stage with several). The vocabulary tables hold
arch.padded_vocab rows. The order matters to the distributed optimizer's shards (memory.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from mimo_jobs.model.arch import EncoderArch, LLMArch, ModelArch, padded_vocab
from mimo_jobs.model.audio_arch import CONVS, AudioArch, audio_params
from mimo_jobs.model.splits import experts_apart
from mimo_jobs.textsafe import visible

from .pipesplit import EVEN, PipelineSplit, stage_layers


@dataclass(frozen=True)
class Tensor:
    numel: int
    expert: bool = False  # held in the expert gradient buffer (model/splits.experts_apart)
    frozen: bool = False  # never trained (no gradient, no optimizer state): the audio position table


def _norm(h: int, kind: str) -> list[Tensor]:
    return [Tensor(h)] if kind == "RMSNorm" else [Tensor(h), Tensor(h)]


def _mlp(h: int, ffn: int, tp: int, bias: bool, gated: bool, expert: bool = False) -> list[Tensor]:
    up = ffn * (2 if gated else 1)
    out = [Tensor(up * h // tp, expert)] + ([Tensor(up // tp, expert)] if bias else [])
    return out + [Tensor(h * ffn // tp, expert)] + ([Tensor(h, expert)] if bias else [])


def _attention(
    h: int, heads: int, groups: int, d: int, tp: int, norm: str, o_bias: bool, qkv_bias: bool, qk_norm: bool
):
    """o before qkv (as registered), then the per-head q and k norms."""
    q, kv = heads * d, groups * d
    out = [Tensor(q * h // tp)] + ([Tensor(h)] if o_bias else [])
    out += [Tensor((q + 2 * kv) * h // tp)] + ([Tensor((q + 2 * kv) // tp)] if qkv_bias else [])
    return out + (_norm(d, norm) * 2 if qk_norm else [])


def _llm_attention(p: LLMArch, tp: int) -> list[Tensor]:
    return _norm(p.hidden_size, p.normalization) + _attention(
        p.hidden_size,
        p.num_attention_heads,
        p.query_groups,
        p.head_dim,
        tp,
        p.normalization,
        p.add_bias_linear,
        p.add_qkv_bias,
        p.qk_layernorm,
    )


def _moe_block(p: LLMArch, tp: int, ep: int, etp: int) -> list[Tensor]:
    h = p.hidden_size
    out = [Tensor(p.num_experts * h)] + ([Tensor(p.num_experts)] if p.add_bias_linear else [])
    # experts sit in the dense gradient buffer only while the expert grid equals the dense one
    apart = experts_apart(ep, etp, tp)
    out += _mlp(h, p.expert_ffn, etp, p.add_bias_linear, p.gated_linear_unit, apart) * (p.num_experts // ep)
    if p.moe_shared_expert_intermediate_size:
        out += [Tensor(h)] if p.moe_shared_expert_gate else []
        out += _mlp(h, p.moe_shared_expert_intermediate_size, tp, False, p.gated_linear_unit)
    return out


def llm_layer_tensors(p: LLMArch, i: int, tp: int, ep: int, etp: int) -> list[Tensor]:
    """Layer `i` (its index in the whole model: dense or MoE by moe_layer_pattern) on one TP/EP rank."""
    out = _llm_attention(p, tp) + _norm(p.hidden_size, p.normalization)
    if p.is_moe_layer(i):
        return out + _moe_block(p, tp, ep, etp)
    return out + _mlp(p.hidden_size, p.ffn_hidden_size, tp, p.add_bias_linear, p.gated_linear_unit)


def llm_tensors(
    preset: ModelArch,
    tp: int,
    ep: int,
    etp: int,
    pp: int,
    stage: int,
    vp: int = 1,
    split: PipelineSplit = EVEN,
) -> list[Tensor]:
    """One LLM pipeline stage on one TP/EP rank: its layers as megatron-core splits them (pipesplit.py)."""
    return [t for part in llm_parts(preset, tp, ep, etp, pp, stage, vp, split) for t in part]


def llm_parts(
    preset: ModelArch,
    tp: int,
    ep: int,
    etp: int,
    pp: int,
    stage: int,
    vp: int = 1,
    split: PipelineSplit = EVEN,
) -> list[list[Tensor]]:
    """llm_tensors in parts, in order: the embedding (first stage), each layer, the final norm and the output
    layer (last stage). A layer's tensors depend only on whether it is an MoE layer: the layers of one kind
    are one list, repeated (what reads them reads each kind once)."""
    p = preset.llm
    h, vocab = p.hidden_size, padded_vocab(p.vocab_size, tp)
    parts = [[Tensor(vocab * h // tp)]] if stage == 0 else []
    kinds: dict[bool, list[Tensor]] = {}
    for i in stage_layers(p.num_layers, pp, vp, split, stage):
        moe = p.is_moe_layer(i)
        if moe not in kinds:
            kinds[moe] = llm_layer_tensors(p, i, tp, ep, etp)
        parts.append(kinds[moe])
    if stage == pp - 1:
        tail = _norm(h, p.normalization)
        if not (p.tie_word_embeddings and pp == 1):
            tail.append(Tensor(vocab * h // tp))
        parts.append(tail)
    return parts


def vit_tensors(e: EncoderArch, tp: int) -> list[Tensor]:
    """The ViT on one TP rank: class token, position rows, patch embedding, outer norms, layers."""
    h = e.hidden_size
    out = [Tensor(h)] if e.class_token else []
    out.append(Tensor(e.grid**2 * h))
    out += [Tensor(h)] if e.class_token else []  # the class token's position row
    out += [Tensor(h // tp * e.patch_inputs)] + ([Tensor(h // tp)] if e.patch_bias else [])
    out += _norm(h, e.normalization) if e.pre_norm else []
    out += _norm(h, e.normalization) if e.final_norm else []
    for _ in range(e.num_layers):
        out += _norm(h, e.normalization)
        out += _attention(
            h,
            e.num_attention_heads,
            e.num_attention_heads,
            h // e.num_attention_heads,
            tp,
            e.normalization,
            True,
            True,
            False,
        )
        out += _norm(h, e.normalization) + _mlp(h, e.ffn_hidden_size, tp, True, False)
        out += [Tensor(h), Tensor(h)] if e.layer_scale else []  # the attention's and the MLP's scale
    return out


def projector_of(hin: int, hl: int, tp: int) -> list[Tensor]:
    """The projector MLP of input width `hin` into an LLM of width `hl` on one TP rank."""
    return [Tensor(hl * hin // tp), Tensor(hl // tp), Tensor(hl * hl // tp), Tensor(hl)]


def audio_tensors(a: AudioArch, tp: int) -> list[Tensor]:
    """The audio encoder on one TP rank, as trainer/model/audio_encoder.py registers it: the frozen position
    table (the module's own parameter), conv1 and conv2 whole on every rank, the layers (the ViT's layer:
    LayerNorm, attention with a fused QKV bias, a GELU MLP with biases), the final LayerNorm."""
    h, (c1, c2) = a.hidden_size, CONVS
    out = [Tensor(a.max_source_positions * h, frozen=True)]
    out += [Tensor(h * a.num_mel_bins * c1.kernel), Tensor(h), Tensor(h * h * c2.kernel), Tensor(h)]
    for _ in range(a.num_layers):
        out += _norm(h, "LayerNorm")
        out += _attention(
            h, a.num_attention_heads, a.num_attention_heads, a.head_dim, tp, "", True, True, False
        )
        out += _norm(h, "LayerNorm") + _mlp(h, a.ffn_hidden_size, tp, True, False)
    return out + _norm(h, "LayerNorm")


def module_tensors(arch, llm_hidden: int, tp: int) -> list[Tensor]:
    """One encoder module (its encoder and projector) on one TP rank, by its architecture's modality."""
    if arch.modality == "audio":
        return audio_tensors(arch, tp) + projector_of(arch.out_width, llm_hidden, tp)
    return vit_tensors(arch, tp) + projector_of(arch.out_width, llm_hidden, tp)


def encoder_tensors(preset: ModelArch, tp: int) -> list[Tensor]:
    """Every encoder module's tensors (encoder + projector, module_tensors) on one TP rank of each, in rank
    order (none for a text-only model)."""
    hl = preset.llm.hidden_size
    return [t for _, a in preset.named_encoders for t in module_tensors(a, hl, tp)]


# ------------------------------------------------------------------------------------ model totals


def vit_params(e: EncoderArch) -> int:
    """The vision tower's parameters (HuggingFace's CLIPVisionModel / SiglipVisionModel without SigLIP's
    attention-pooling head, which a VLM does not use)."""
    return sum(t.numel for t in vit_tensors(e, 1))


def encoder_params(preset: ModelArch) -> int:
    """What the encoder modules train: each one's encoder and projector (0 for a text-only model)."""
    return sum(t.numel for t in encoder_tensors(preset, 1))


def llm_params(p: LLMArch) -> int:
    """Every LLM parameter, the vocabulary unpadded (as transformers' num_parameters counts it)."""
    layers = sum(sum(t.numel for t in llm_layer_tensors(p, i, 1, 1, 1)) for i in range(p.num_layers))
    tables = (1 if p.tie_word_embeddings else 2) * p.vocab_size * p.hidden_size
    return layers + tables + sum(t.numel for t in _norm(p.hidden_size, p.normalization))


def llm_active_params(p: LLMArch) -> int:
    """Parameters one token passes through: all but the experts it is not routed to."""
    if not p.num_experts:
        return llm_params(p)
    expert = _mlp(p.hidden_size, p.expert_ffn, 1, p.add_bias_linear, p.gated_linear_unit)
    idle = p.moe_layers * (p.num_experts - p.moe_router_topk) * sum(t.numel for t in expert)
    return llm_params(p) - idle


def _billions(n: int) -> str:
    if n >= 10e9:
        return f"{n / 1e9:.1f}B"
    if n >= 1e9:
        return f"{n / 1e9:.2f}B"
    return f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n:,}"


def module_params(arch, llm_hidden: int) -> int:
    """One encoder module's parameters as HuggingFace counts its encoder, plus its projector (an audio
    encoder's without the k bias rows the trainer's fused QKV also holds)."""
    proj = sum(t.numel for t in projector_of(arch.out_width, llm_hidden, 1))
    return (audio_params(arch) if arch.modality == "audio" else vit_params(arch)) + proj


def model_summary(preset: ModelArch) -> list[str]:
    """One line per module naming it with its parameters, e.g. "llm qwen3-30b-a3b: 30.5B total, 3.3B
    active", each encoder module under its name in the study ("encoder vision (image) siglip: 400M";
    totals unpadded, the encoder's with its projector; a text-only model says it has none)."""
    # a description's names are whatever a study or --model said: shown with their control characters and
    # bidi overrides made visible, never written raw to a terminal
    p = preset.llm
    llm = f"llm {visible(p.name or preset.name)}: {_billions(llm_params(p))} total"
    if p.num_experts:
        llm += f", {_billions(llm_active_params(p))} active"
    if not preset.named_encoders:
        return ["encoder: none (text-only)", llm]
    return [
        f"encoder {visible(n)} ({a.modality}) {visible(a.name or a.kind)}: "
        f"{_billions(module_params(a, p.hidden_size))}"
        for n, a in preset.named_encoders
    ] + [llm]


def model_json(preset: ModelArch) -> dict:
    """`predict --json`'s model section: each module's name and unpadded parameter totals: `encoders`, one
    entry per encoder module under its name in the study (none for a text-only model), and `llm`.
    `encoder` is what older readers take: the one image encoder of a model of one (null otherwise)."""
    p = preset.llm
    hl = p.hidden_size
    encs = [
        {
            "module": n,
            "modality": a.modality,
            "name": a.name or a.kind,
            "params": module_params(a, hl),
        }
        for n, a in preset.named_encoders
    ]
    (n, a), e = (preset.named_encoders[0], encs[0]) if len(encs) == 1 else ((None, None), None)
    one = (
        None
        if e is None or e["modality"] != "image"
        else {"name": a.name or preset.name, "params": e["params"]}
    )
    return {
        "name": preset.name,
        "encoder": one,
        "encoders": encs,
        "llm": {
            "name": p.name or preset.name,
            "params": llm_params(p),
            "active_params": llm_active_params(p),
        },
    }

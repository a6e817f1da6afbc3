"""HuggingFace safetensors tensors <-> the trainer's megatron-core parameters: names and layouts (pure: no
torch, no I/O; trainer/checkpoint/hf_load.py reads with it, hf_export.py writes with it).

Every trainer parameter is a `Target`: its canonical name (the name `models.param_shards` gives it: global
layer index, global expert index), its full shape, and the HF tensors it is made of as `Piece`s stacked
along its first dimension. The layouts, as megatron-core 0.19 builds them (megatron/core/transformer/
attention.py splits linear_qkv per query group; mlp.py chunks a gated fc1 into two halves):

  linear_qkv    per query group g: [q heads of g; k of g; v of g] rows (the ViT: one group per head)
  linear_fc1    [gate; up] when gated (SwiGLU); a TP rank holds [its gate rows; its up rows]
  experts       one SequentialMLP expert per HF expert, experts.experts.<global index>.linear_fc1/fc2
  word tables   the vocabulary padded to padded_vocab(vocab, tp) rows; the padding rows are zeros
  ViT           the patch conv [h, C, p, p] is the embedder's [h, C*p*p] (the trainer flattens a patch
                channel-major, as the conv's weight is laid out); CLIP's position table [1 + grid^2, h]
                is the class token's row (class_position) followed by the patch rows (position_embeddings)

`split`, `parts` and `expert` restate how megatron-core shards each parameter over tensor/expert
parallelism (the `tensor_model_parallel`, `partition_dim` and `partition_stride` attributes it sets);
the loader takes them from the built module, export from here, and the tests check the two agree.
"""

from __future__ import annotations

from dataclasses import dataclass

from mimo_jobs.model.arch import ArchError, EncoderArch, LLMArch, padded_vocab
from mimo_jobs.model.cuts import strided_blocks
from mimo_jobs.model.hf import LLM_FAMILIES

# Which HF families name their experts how: (router, expert prefix, gate, up, down) under a layer's prefix
_MIXTRAL_NAMES = ("block_sparse_moe.gate", "block_sparse_moe.experts", "w1", "w3", "w2")
_QWEN_NAMES = ("mlp.gate", "mlp.experts", "gate_proj", "up_proj", "down_proj")
# TE's fused layer norm + linear (GPU runs) holds the norm inside the next linear: the same tensor
TE_ALIASES = (
    ("self_attention.linear_qkv.layer_norm_", "input_layernorm."),
    ("mlp.linear_fc1.layer_norm_", "pre_mlp_layernorm."),
)


@dataclass(frozen=True)
class Piece:
    """Rows of a target that come from one HF tensor (rows [start, start + rows) of its first dimension),
    or zeros (hf None: the vocabulary padding). `whole`: the HF tensor is read whole and reshaped to the
    target's rows (CLIP's class embedding [h] is the class token [1, h])."""

    hf: str | None
    rows: int
    start: int = 0
    whole: bool = False


@dataclass(frozen=True)
class Target:
    """One trainer parameter in full: `pieces` stack along the first dimension of `view` (the parameter's
    shape unless given: the ViT position table [1, n, h] stacks as [n, h])."""

    name: str
    shape: tuple[int, ...]
    pieces: tuple[Piece, ...]
    split: int | None = None  # the dimension tensor parallelism splits (None: whole on every rank)
    parts: int = (
        1  # megatron's partition_stride: `parts` equal blocks along `split`, a rank holds a slice of each
    )
    expert: bool = False  # split over expert tensor parallelism, one expert per parameter
    view: tuple[int, ...] | None = None

    @property
    def rows_shape(self) -> tuple[int, ...]:
        return self.view or self.shape


@dataclass(frozen=True)
class HFLayout:
    """A module's targets by canonical name, and the HF tensors they read with their shapes."""

    targets: dict[str, Target]
    hf_shapes: dict[str, tuple[int, ...]]
    family: str


def canonical_alias(cname: str) -> str:
    """The canonical name of a parameter under the local-layer naming (TE's fused norm -> the norm)."""
    for te, local in TE_ALIASES:
        if te in cname:
            return cname.replace(te, local)
    return cname


class _Builder:
    def __init__(self, family: str):
        self.targets: dict[str, Target] = {}
        self.hf: dict[str, tuple[int, ...]] = {}
        self.family = family

    def tensor(self, name: str, shape: tuple[int, ...]) -> str:
        self.hf[name] = tuple(shape)
        return name

    def add(self, name: str, shape, pieces, split=None, parts=1, expert=False, view=None) -> None:
        t = Target(name, tuple(shape), tuple(pieces), split, parts, expert, tuple(view) if view else None)
        assert sum(p.rows for p in t.pieces) == t.rows_shape[0], name
        self.targets[name] = t

    def same(self, name: str, hf: str, shape, split=None, expert=False) -> None:
        """A parameter that is one HF tensor as it is."""
        self.add(name, shape, [Piece(self.tensor(hf, shape), shape[0])], split, 1, expert)

    def layout(self) -> HFLayout:
        return HFLayout(self.targets, self.hf, self.family)


# ----------------------------------------------------------------------------------------------- LLM


def llm_layout(p: LLMArch, family: str, tp: int) -> HFLayout:
    """The LLM's targets as a TP group of `tp` ranks builds them (the vocabulary padding depends on tp),
    for an HF checkpoint of `family` (a model_type of model/hf.py's LLM_FAMILIES)."""
    if family not in LLM_FAMILIES.values():
        raise ArchError("architectures", f"{family!r} is not one of {', '.join(LLM_FAMILIES.values())}")
    b = _Builder(family)
    h, vocab = p.hidden_size, p.vocab_size
    vp = padded_vocab(vocab, tp)
    pad = [Piece(None, vp - vocab)] if vp > vocab else []
    b.add(
        "embedding.word_embeddings.weight",
        (vp, h),
        [Piece(b.tensor("model.embed_tokens.weight", (vocab, h)), vocab), *pad],
        split=0,
    )
    for i in range(p.num_layers):
        _llm_layer(b, p, i)
    b.same("decoder.final_layernorm.weight", "model.norm.weight", (h,))
    if not p.tie_word_embeddings:
        b.add(
            "output_layer.weight",
            (vp, h),
            [Piece(b.tensor("lm_head.weight", (vocab, h)), vocab), *pad],
            split=0,
        )
    return b.layout()


def _llm_layer(b: _Builder, p: LLMArch, i: int) -> None:
    hf, mc = f"model.layers.{i}.", f"decoder.layers.{i}."
    h, hd, ng = p.hidden_size, p.head_dim, p.query_groups
    qpg = p.num_attention_heads // ng
    b.same(mc + "input_layernorm.weight", hf + "input_layernorm.weight", (h,))
    att = mc + "self_attention."
    for kind in ("weight", "bias") if p.add_qkv_bias else ("weight",):
        cols = (h,) if kind == "weight" else ()
        q = b.tensor(f"{hf}self_attn.q_proj.{kind}", (ng * qpg * hd, *cols))
        k = b.tensor(f"{hf}self_attn.k_proj.{kind}", (ng * hd, *cols))
        v = b.tensor(f"{hf}self_attn.v_proj.{kind}", (ng * hd, *cols))
        pieces = []
        for g in range(ng):
            pieces += [Piece(q, qpg * hd, g * qpg * hd), Piece(k, hd, g * hd), Piece(v, hd, g * hd)]
        b.add(f"{att}linear_qkv.{kind}", ((qpg + 2) * ng * hd, *cols), pieces, split=0)
    if p.qk_layernorm:
        b.same(att + "q_layernorm.weight", hf + "self_attn.q_norm.weight", (hd,))
        b.same(att + "k_layernorm.weight", hf + "self_attn.k_norm.weight", (hd,))
    b.same(
        att + "linear_proj.weight", hf + "self_attn.o_proj.weight", (h, p.num_attention_heads * hd), split=1
    )
    if p.add_bias_linear:
        b.same(att + "linear_proj.bias", hf + "self_attn.o_proj.bias", (h,))
    b.same(mc + "pre_mlp_layernorm.weight", hf + "post_attention_layernorm.weight", (h,))
    if not p.is_moe_layer(i):
        _gated_mlp(b, p, hf + "mlp.", mc + "mlp.", p.ffn_hidden_size, _QWEN_NAMES[2:], p.add_bias_linear)
        return
    router, experts, *names = _MIXTRAL_NAMES if b.family == "mixtral" else _QWEN_NAMES
    b.same(mc + "mlp.router.weight", f"{hf}{router}.weight", (p.num_experts, h))
    for e in range(p.num_experts):
        hf_e, mc_e = f"{hf}{experts}.{e}.", f"{mc}mlp.experts.experts.{e}."
        _gated_mlp(b, p, hf_e, mc_e, p.expert_ffn, names, False, expert=True)
    shared = p.moe_shared_expert_intermediate_size
    if shared:
        _gated_mlp(
            b, p, hf + "mlp.shared_expert.", mc + "mlp.shared_experts.", shared, _QWEN_NAMES[2:], False
        )
        if p.moe_shared_expert_gate:
            b.same(mc + "mlp.shared_experts.gate_weight", hf + "mlp.shared_expert_gate.weight", (1, h))


def _gated_mlp(b: _Builder, p: LLMArch, hf: str, mc: str, ffn: int, names, bias: bool, expert=False) -> None:
    gate, up, down = names
    h = p.hidden_size
    for kind in ("weight", "bias") if bias else ("weight",):
        cols = (h,) if kind == "weight" else ()
        g = b.tensor(f"{hf}{gate}.{kind}", (ffn, *cols))
        u = b.tensor(f"{hf}{up}.{kind}", (ffn, *cols))
        b.add(f"{mc}linear_fc1.{kind}", (2 * ffn, *cols), [Piece(g, ffn), Piece(u, ffn)], 0, 2, expert)
    b.same(f"{mc}linear_fc2.weight", f"{hf}{down}.weight", (h, ffn), split=1, expert=expert)
    if bias:
        b.same(f"{mc}linear_fc2.bias", f"{hf}{down}.bias", (h,))


# ------------------------------------------------------------------------------------------- encoder

ENCODER_MODEL_TYPES = {"clip": "clip_vision_model", "siglip": "siglip_vision_model"}


def encoder_layout(e: EncoderArch, prefix: str = "") -> HFLayout:
    """The ViT's targets (the projector has no HF counterpart) for the vision tower whose tensor names
    start with `prefix` ("" for a CLIP/SigLIP vision model, "vision_model." inside a full CLIP/SigLIP)."""
    if e.kind not in ENCODER_MODEL_TYPES:
        raise ArchError("kind", f"{e.kind!r} has no HuggingFace layout here (clip and siglip have)")
    b = _Builder(ENCODER_MODEL_TYPES[e.kind])
    h, c, ps = e.hidden_size, e.channels, e.patch_size
    emb = prefix + "embeddings."
    patch = b.tensor(emb + "patch_embedding.weight", (h, c, ps, ps))
    b.add("vit.embedder.weight", (h, c * ps * ps), [Piece(patch, h)], split=0)
    if e.patch_bias:
        b.same("vit.embedder.bias", emb + "patch_embedding.bias", (h,), split=0)
    n, cls = e.grid**2, int(e.class_token)
    pos = b.tensor(emb + "position_embedding.weight", (n + cls, h))
    if e.class_token:
        b.add("vit.class_token", (1, h), [Piece(b.tensor(emb + "class_embedding", (h,)), 1, whole=True)])
        b.add("vit.class_position", (1, h), [Piece(pos, 1, 0)])
    b.add("vit.position_embeddings", (1, n, h), [Piece(pos, n, cls)], view=(n, h))
    norms = (("ln_pre", "pre_layrnorm", e.pre_norm), ("ln_post", "post_layernorm", e.final_norm))
    for mc, hf, on in norms:
        if on:
            _norm(b, e, f"vit.{mc}.", prefix + hf + ".")
    for i in range(e.num_layers):
        _vit_layer(b, e, f"{prefix}encoder.layers.{i}.", f"vit.decoder.layers.{i}.")
    return b.layout()


def _norm(b: _Builder, e: EncoderArch, mc: str, hf: str) -> None:
    b.same(mc + "weight", hf + "weight", (e.hidden_size,))
    if e.normalization == "LayerNorm":
        b.same(mc + "bias", hf + "bias", (e.hidden_size,))


def _vit_layer(b: _Builder, e: EncoderArch, hf: str, mc: str) -> None:
    h, heads = e.hidden_size, e.num_attention_heads
    hd = h // heads
    _norm(b, e, mc + "input_layernorm.", hf + "layer_norm1.")
    for kind in ("weight", "bias"):
        cols = (h,) if kind == "weight" else ()
        q, k, v = (b.tensor(f"{hf}self_attn.{x}_proj.{kind}", (h, *cols)) for x in "qkv")
        pieces = [Piece(t, hd, a * hd) for a in range(heads) for t in (q, k, v)]
        b.add(f"{mc}self_attention.linear_qkv.{kind}", (3 * h, *cols), pieces, split=0)
    b.same(mc + "self_attention.linear_proj.weight", hf + "self_attn.out_proj.weight", (h, h), split=1)
    b.same(mc + "self_attention.linear_proj.bias", hf + "self_attn.out_proj.bias", (h,))
    _norm(b, e, mc + "pre_mlp_layernorm.", hf + "layer_norm2.")
    f = e.ffn_hidden_size
    b.same(mc + "mlp.linear_fc1.weight", hf + "mlp.fc1.weight", (f, h), split=0)
    b.same(mc + "mlp.linear_fc1.bias", hf + "mlp.fc1.bias", (f,), split=0)
    b.same(mc + "mlp.linear_fc2.weight", hf + "mlp.fc2.weight", (h, f), split=1)
    b.same(mc + "mlp.linear_fc2.bias", hf + "mlp.fc2.bias", (h,))


def projector_layout(e: EncoderArch, llm_hidden: int) -> HFLayout:
    """The MLP projector (encoder -> LLM width), which no HF vision model has: exported under its own
    megatron-core names so a later run can keep it."""
    b = _Builder("projector")
    n = "projector.encoder."
    b.same(n + "linear_fc1.weight", n + "linear_fc1.weight", (llm_hidden, e.projector_input), split=0)
    b.same(n + "linear_fc1.bias", n + "linear_fc1.bias", (llm_hidden,), split=0)
    b.same(n + "linear_fc2.weight", n + "linear_fc2.weight", (llm_hidden, llm_hidden), split=1)
    b.same(n + "linear_fc2.bias", n + "linear_fc2.bias", (llm_hidden,))
    return b.layout()


# ------------------------------------------------------------------------------------ rows of a shard


def shard_rows(t: Target, dim: int | None, rank: int, size: int, parts: int):
    """(row ranges of the rows view, column range or None) that TP rank `rank` of `size` holds."""
    rows = t.rows_shape[0]
    if dim is None or size == 1:
        return [(0, rows)], None
    if dim == 0:
        return [(s, s + n) for s, n in strided_blocks(rows, parts, rank, size)], None
    if dim == 1 and parts == 1:
        ((s, n),) = strided_blocks(t.rows_shape[1], 1, rank, size)
        return [(0, rows)], (s, s + n)
    raise ValueError(f"{t.name}: a split along dimension {dim} is not laid out here")


def piece_reads(t: Target, lo: int, hi: int):
    """The reads that give rows [lo, hi) of the target: (piece, first row in the piece, last row + 1)."""
    out, at = [], 0
    for pc in t.pieces:
        a, b = max(lo, at), min(hi, at + pc.rows)
        if a < b:
            out.append((pc, a - at, b - at))
        at += pc.rows
    return out


# ------------------------------------------------------------------------------ config.json for export


def llm_family(p: LLMArch) -> str:
    """The HF family an LLM description is written as (refusing what none of them expresses)."""
    if p.moe_router_score_function != "softmax":
        raise ArchError("moe_router_score_function", "sigmoid routing has no HuggingFace family here")
    if p.activation != "silu" or not p.gated_linear_unit or p.normalization != "RMSNorm":
        raise ArchError("activation", "the HuggingFace families here are SwiGLU + RMSNorm models")
    qwen2_bias = p.add_qkv_bias and not p.add_bias_linear
    if p.num_experts:
        if p.moe_shared_expert_intermediate_size or qwen2_bias:
            return "qwen2_moe"
        if p.qk_layernorm:
            return "qwen3_moe"
        return "mixtral"
    if p.qk_layernorm:
        return "qwen3"
    return "qwen2" if qwen2_bias else "llama"


def llm_config(p: LLMArch, dtype: str = "float32") -> dict:
    """An HF config.json for the description (model/hf.py's llm_fields reads it back to the same fields)."""
    fam = llm_family(p)
    arch = next(a for a, f in LLM_FAMILIES.items() if f == fam)
    cfg = {
        "architectures": [arch],
        "model_type": fam,
        "hidden_size": p.hidden_size,
        "intermediate_size": p.ffn_hidden_size,
        "num_hidden_layers": p.num_layers,
        "num_attention_heads": p.num_attention_heads,
        "num_key_value_heads": p.query_groups,
        "head_dim": p.head_dim,
        "vocab_size": p.vocab_size,
        "hidden_act": "silu",
        "rms_norm_eps": p.norm_epsilon,
        "rope_theta": p.rotary_base,
        "tie_word_embeddings": p.tie_word_embeddings,
        "torch_dtype": dtype,
    }
    if fam in ("llama", "qwen3", "qwen3_moe", "mixtral"):
        if p.add_qkv_bias != p.add_bias_linear:
            raise ArchError("add_qkv_bias", f"{fam} biases the attention and the MLP together or not at all")
        cfg["attention_bias"] = p.add_qkv_bias
        if fam == "llama":
            cfg["mlp_bias"] = p.add_bias_linear
    elif not (p.add_qkv_bias and not p.add_bias_linear):
        raise ArchError("add_qkv_bias", f"{fam} has biased q, k, v projections and nothing else biased")
    if fam in ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe"):
        cfg["use_sliding_window"] = False
    if fam == "mixtral":
        cfg |= {"num_local_experts": p.num_experts, "intermediate_size": p.expert_ffn}
        cfg |= {"num_experts_per_tok": p.moe_router_topk, "sliding_window": None}
        if p.moe_router_pre_softmax or p.moe_layer_pattern is not None:
            raise ArchError(
                "moe_router_pre_softmax", "Mixtral renormalises its top-k and has no dense layers"
            )
    elif p.num_experts:
        cfg |= {
            "num_experts": p.num_experts,
            "num_experts_per_tok": p.moe_router_topk,
            "moe_intermediate_size": p.expert_ffn,
            "norm_topk_prob": not p.moe_router_pre_softmax,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [i for i in range(p.num_layers) if not p.is_moe_layer(i)],
        }
        if fam == "qwen2_moe":
            if p.moe_shared_expert_intermediate_size and not p.moe_shared_expert_gate:
                raise ArchError("moe_shared_expert_gate", "Qwen2-MoE's shared expert is always gated")
            cfg["shared_expert_intermediate_size"] = p.moe_shared_expert_intermediate_size or 0
    return cfg


_ENC_ACT_OUT = {"quick_gelu": "quick_gelu", "gelu_tanh": "gelu_pytorch_tanh", "gelu": "gelu"}


def encoder_config(e: EncoderArch, dtype: str = "float32") -> dict:
    """An HF vision config.json for a CLIP/SigLIP description (read back to the same fields)."""
    if e.kind not in ENCODER_MODEL_TYPES:
        raise ArchError("kind", f"{e.kind!r} has no HuggingFace vision model here (clip and siglip have)")
    clip = e.kind == "clip"
    want = dict(
        class_token=clip, pre_norm=clip, final_norm=True, patch_bias=not clip, normalization="LayerNorm"
    )
    for f, v in want.items():
        if getattr(e, f) != v:
            raise ArchError(
                f, f"a HuggingFace {e.kind} vision model has {f}={v}, this description {getattr(e, f)}"
            )
    cfg = {
        "architectures": ["CLIPVisionModel" if clip else "SiglipVisionModel"],
        "model_type": ENCODER_MODEL_TYPES[e.kind],
        "hidden_size": e.hidden_size,
        "intermediate_size": e.ffn_hidden_size,
        "num_hidden_layers": e.num_layers,
        "num_attention_heads": e.num_attention_heads,
        "patch_size": e.patch_size,
        "image_size": e.image_size,
        "num_channels": e.channels,
        "hidden_act": _ENC_ACT_OUT[e.activation],
        "layer_norm_eps": e.norm_epsilon,
        "torch_dtype": dtype,
    }
    if not clip:
        cfg["vision_use_head"] = False  # the attention-pooling head is not part of the trainer's ViT
    return cfg

"""The language-model families' common part: a GPT decoder (SwiGLU, RMSNorm, RoPE; dense or MoE) read from
and written to HuggingFace configs, and its weight names generated from each family's `hf` table. Field
meanings follow transformers' configuration classes (configuration_llama.py, configuration_qwen2_moe.py,
...). Every field the trainer cannot build is refused by name rather than priced as something else.

The layouts, as megatron-core 0.19 builds them (megatron/core/transformer/attention.py splits linear_qkv per
query group; mlp.py chunks a gated fc1 into two halves):

  linear_qkv    per query group g: [q heads of g; k of g; v of g] rows
  linear_fc1    [gate; up] (SwiGLU); a TP rank holds [its gate rows; its up rows] (model/cuts.py)
  experts       one SequentialMLP expert per HF expert, experts.experts.<global index>.linear_fc1/fc2
  word tables   the vocabulary padded to padded_vocab(vocab, tp) rows; the padding rows are zeros
"""

from __future__ import annotations

from typing import ClassVar

from mimo_jobs.model.arch import ArchError, LLMArch, padded_vocab
from mimo_jobs.model.families.base import REGISTRY, Family, req
from mimo_jobs.model.hf_weights import Builder, HFLayout, Piece

# The names most families share (`hf` tables override roles)
NAMES = {
    "embed": "model.embed_tokens.weight",
    "head": "lm_head.weight",
    "final_norm": "model.norm.weight",
    "layer": "model.layers.{i}.",
    "norm1": "input_layernorm",
    "q": "self_attn.q_proj",
    "k": "self_attn.k_proj",
    "v": "self_attn.v_proj",
    "q_norm": "self_attn.q_norm",
    "k_norm": "self_attn.k_norm",
    "proj": "self_attn.o_proj",
    "norm2": "post_attention_layernorm",
    "mlp": "mlp.",
    "gate": "gate_proj",
    "up": "up_proj",
    "down": "down_proj",
    "router": "mlp.gate",
    "experts": "mlp.experts.{e}.",
    "expert_gate": "gate_proj",
    "expert_up": "up_proj",
    "expert_down": "down_proj",
    "shared": "mlp.shared_expert.",
    "shared_gate": "mlp.shared_expert_gate",
}


class DecoderFamily(Family):
    """A causal-LM family; its differences from the others are the class attributes."""

    modality: ClassVar[str] = "text"
    architecture: ClassVar[str]  # the `architectures` entry an export writes
    hf: ClassVar[dict[str, str]] = NAMES
    qk_norm: ClassVar[bool] = False  # a norm over each head's q and k (Qwen3)
    qkv_bias_only: ClassVar[bool] = False  # biased q, k, v and nothing else (Qwen2)
    sliding_default: ClassVar[bool] = False  # sliding_window is on unless use_sliding_window says otherwise
    moe: ClassVar[bool] = False
    norm_topk_default: ClassVar[bool] = False  # norm_topk_prob when the config does not say
    shared_expert: ClassVar[bool] = False  # a gated shared expert (Qwen2-MoE)
    bias_fields: ClassVar[tuple[str, ...]] = ("attention_bias",)  # the bias switches its config.json has
    full_attention: ClassVar[dict] = {}  # what an export writes to say: no sliding window
    dense_layers: ClassVar[bool] = True  # may have dense MLP layers (an MoE family's mlp_only_layers)

    @property
    def model_types(self) -> tuple[str, ...]:  # type: ignore[override]
        return (self.name,)

    @property
    def architectures(self) -> tuple[str, ...]:  # type: ignore[override]
        return (self.architecture,)

    # ------------------------------------------------------------------------------------ config.json

    def fields(self, cfg: dict) -> dict:
        """LLMArch fields of a causal-LM config.json."""
        if cfg.get("kv_lora_rank"):
            raise ArchError("kv_lora_rank", "multi-head latent attention (MLA) is not built by the trainer")
        self._refuse_sliding_window(cfg)
        act = cfg.get("hidden_act", "silu")
        if act != "silu":
            raise ArchError(
                "hidden_act", f"{act!r}: the trainer builds these families' gated MLP with SiLU only"
            )
        heads = int(req(cfg, "num_attention_heads"))
        hidden = int(req(cfg, "hidden_size"))
        head_dim = cfg.get("head_dim")
        out = {
            "num_layers": int(req(cfg, "num_hidden_layers")),
            "hidden_size": hidden,
            "num_attention_heads": heads,
            "num_query_groups": int(cfg.get("num_key_value_heads") or heads),
            "kv_channels": int(head_dim) if head_dim and int(head_dim) * heads != hidden else None,
            "ffn_hidden_size": int(req(cfg, "intermediate_size")),
            "vocab_size": int(req(cfg, "vocab_size")),
            "activation": "silu",
            "gated_linear_unit": True,
            "normalization": "RMSNorm",
            "norm_epsilon": float(cfg.get("rms_norm_eps", 1e-6)),
            "qk_layernorm": self.qk_norm,
            "rotary_base": _rope_theta(cfg),
            "tie_word_embeddings": bool(cfg.get("tie_word_embeddings", False)),
            **self._biases(cfg),
        }
        if self.moe:
            out |= self.moe_fields(cfg)
        return out

    def _refuse_sliding_window(self, cfg: dict) -> None:
        sw = cfg.get("sliding_window")
        # Qwen2/Qwen3 carry a sliding_window size but only use it with use_sliding_window (off in released
        # models)
        enabled = cfg.get("use_sliding_window", self.sliding_default) and sw is not None
        layer_types = cfg.get("layer_types") or []
        if enabled or "sliding_attention" in layer_types:
            raise ArchError(
                "sliding_window",
                f"sliding-window attention (sliding_window={sw}) is not built by the trainer; set "
                "use_sliding_window false (or sliding_window null) in the config to train with full attention",
            )

    def _biases(self, cfg: dict) -> dict:
        if self.qkv_bias_only:
            # Qwen2's attention: biased q, k, v projections, an unbiased output projection and MLP
            return {"add_qkv_bias": True, "add_bias_linear": False}
        attn, mlp = bool(cfg.get("attention_bias", False)), bool(cfg.get("mlp_bias", False))
        if attn != mlp:
            field = "attention_bias" if attn else "mlp_bias"
            raise ArchError(
                field,
                "attention_bias and mlp_bias differ: megatron-core's add_bias_linear biases the attention "
                "output and the MLP together, so this mix cannot be built",
            )
        return {"add_qkv_bias": attn, "add_bias_linear": attn}

    def moe_fields(self, cfg: dict) -> dict:
        """The MoE fields (Qwen-MoE's names; Mixtral overrides)."""
        layers = int(req(cfg, "num_hidden_layers"))
        # transformers 5 writes Qwen3-MoE's num_experts as num_local_experts (its attribute map); published
        # config.json files say num_experts
        experts = cfg.get("num_experts") or cfg.get("num_local_experts")
        out = {
            "num_experts": int(experts if experts is not None else req(cfg, "num_experts")),
            "moe_router_topk": int(req(cfg, "num_experts_per_tok")),
            "moe_ffn_hidden_size": int(req(cfg, "moe_intermediate_size")),
            # norm_topk_prob false: softmax over all experts, top-k kept without renormalising
            "moe_router_pre_softmax": not cfg.get("norm_topk_prob", self.norm_topk_default),
        }
        step = int(cfg.get("decoder_sparse_step", 1) or 1)
        dense = set(cfg.get("mlp_only_layers") or [])
        pattern = tuple(0 if i in dense or (i + 1) % step else 1 for i in range(layers))
        if 0 in pattern:
            out["moe_layer_pattern"] = pattern
        shared = cfg.get("shared_expert_intermediate_size") or 0
        if self.shared_expert and shared:
            out["moe_shared_expert_intermediate_size"] = int(shared)
            out["moe_shared_expert_gate"] = True
        return out

    def hf_config(self, p: LLMArch, dtype: str = "float32") -> dict:
        """An HF config.json of this family for the description (`fields` reads it back to the same fields)."""
        cfg = {
            "architectures": [self.architecture],
            "model_type": self.name,
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
        if self.bias_fields:
            if p.add_qkv_bias != p.add_bias_linear:
                raise ArchError(
                    "add_qkv_bias", f"{self.name} biases the attention and the MLP together or not at all"
                )
            cfg |= {f: p.add_qkv_bias for f in self.bias_fields}
        elif not (p.add_qkv_bias and not p.add_bias_linear):
            raise ArchError(
                "add_qkv_bias", f"{self.name} has biased q, k, v projections and nothing else biased"
            )
        cfg |= self.full_attention
        if self.moe:
            cfg |= self.moe_config(p)
        return cfg

    def moe_config(self, p: LLMArch) -> dict:
        out = {
            "num_experts": p.num_experts,
            "num_experts_per_tok": p.moe_router_topk,
            "moe_intermediate_size": p.expert_ffn,
            "norm_topk_prob": not p.moe_router_pre_softmax,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [i for i in range(p.num_layers) if not p.is_moe_layer(i)],
        }
        if self.shared_expert:
            if p.moe_shared_expert_intermediate_size and not p.moe_shared_expert_gate:
                raise ArchError("moe_shared_expert_gate", "Qwen2-MoE's shared expert is always gated")
            out["shared_expert_intermediate_size"] = p.moe_shared_expert_intermediate_size or 0
        return out

    # ---------------------------------------------------------------------------------------- names

    def layout(self, p: LLMArch, tp: int) -> HFLayout:
        """The LLM's targets as a TP group of `tp` ranks builds them (the vocabulary padding depends on tp)."""
        n = self.hf
        b = Builder(self.name)
        h, vocab = p.hidden_size, p.vocab_size
        vp = padded_vocab(vocab, tp)
        pad = [Piece(None, vp - vocab)] if vp > vocab else []
        emb = [Piece(b.tensor(n["embed"], (vocab, h)), vocab), *pad]
        b.add("embedding.word_embeddings.weight", (vp, h), emb, split=0)
        for i in range(p.num_layers):
            self._layer(b, p, i)
        b.same("decoder.final_layernorm.weight", n["final_norm"], (h,))
        if not p.tie_word_embeddings:
            head = [Piece(b.tensor(n["head"], (vocab, h)), vocab), *pad]
            b.add("output_layer.weight", (vp, h), head, split=0)
        return b.layout()

    def _layer(self, b: Builder, p: LLMArch, i: int) -> None:
        n = self.hf
        hf, mc = n["layer"].format(i=i), f"decoder.layers.{i}."
        h, hd, ng = p.hidden_size, p.head_dim, p.query_groups
        qpg = p.num_attention_heads // ng
        b.same(mc + "input_layernorm.weight", f"{hf}{n['norm1']}.weight", (h,))
        att = mc + "self_attention."
        for kind in ("weight", "bias") if p.add_qkv_bias else ("weight",):
            cols = (h,) if kind == "weight" else ()
            q = b.tensor(f"{hf}{n['q']}.{kind}", (ng * qpg * hd, *cols))
            k = b.tensor(f"{hf}{n['k']}.{kind}", (ng * hd, *cols))
            v = b.tensor(f"{hf}{n['v']}.{kind}", (ng * hd, *cols))
            pieces = []
            for g in range(ng):
                pieces += [Piece(q, qpg * hd, g * qpg * hd), Piece(k, hd, g * hd), Piece(v, hd, g * hd)]
            b.add(f"{att}linear_qkv.{kind}", ((qpg + 2) * ng * hd, *cols), pieces, split=0)
        if p.qk_layernorm:
            b.same(att + "q_layernorm.weight", f"{hf}{n['q_norm']}.weight", (hd,))
            b.same(att + "k_layernorm.weight", f"{hf}{n['k_norm']}.weight", (hd,))
        b.same(
            att + "linear_proj.weight", f"{hf}{n['proj']}.weight", (h, p.num_attention_heads * hd), split=1
        )
        if p.add_bias_linear:
            b.same(att + "linear_proj.bias", f"{hf}{n['proj']}.bias", (h,))
        b.same(mc + "pre_mlp_layernorm.weight", f"{hf}{n['norm2']}.weight", (h,))
        dense = (n["gate"], n["up"], n["down"])
        if not p.is_moe_layer(i):
            _gated_mlp(b, p, hf + n["mlp"], mc + "mlp.", p.ffn_hidden_size, dense, p.add_bias_linear)
            return
        b.same(mc + "mlp.router.weight", f"{hf}{n['router']}.weight", (p.num_experts, h))
        names = (n["expert_gate"], n["expert_up"], n["expert_down"])
        for e in range(p.num_experts):
            hf_e, mc_e = hf + n["experts"].format(e=e), f"{mc}mlp.experts.experts.{e}."
            _gated_mlp(b, p, hf_e, mc_e, p.expert_ffn, names, False, expert=True)
        shared = p.moe_shared_expert_intermediate_size
        if shared:
            _gated_mlp(b, p, hf + n["shared"], mc + "mlp.shared_experts.", shared, dense, False)
            if p.moe_shared_expert_gate:
                b.same(mc + "mlp.shared_experts.gate_weight", f"{hf}{n['shared_gate']}.weight", (1, h))

    def doc_rows(self) -> list[tuple[str, str, str]]:
        """(trainer parameter, HuggingFace tensor, layout) of each name of the `hf` table (docs/weights.md)."""
        n = self.hf
        layer, lay = n["layer"].replace("{i}", "i"), "decoder.layers.i."
        mlp = f"{layer}{n['mlp']}"
        rows = [
            (
                "`embedding.word_embeddings.weight`",
                f"`{n['embed']}`",
                "rows padded to `padded_vocab(vocab, tp)` with zeros",
            ),
            ("`output_layer.weight`", f"`{n['head']}`", "padded like the embedding; absent when tied"),
            (f"`{lay}input_layernorm.weight`", f"`{layer}{n['norm1']}.weight`", "as is"),
            (
                f"`{lay}self_attention.linear_qkv.weight` / `.bias`",
                f"`{layer}{n['q']}`, `{n['k']}`, `{n['v']}`",
                "per query group g: [q heads of g; k of g; v of g]",
            ),
        ]
        if self.qk_norm:
            rows.append(
                (
                    f"`{lay}self_attention.q_layernorm.weight`, `k_layernorm`",
                    f"`{layer}{n['q_norm']}`, `{n['k_norm']}`",
                    "as is",
                )
            )
        rows += [
            (
                f"`{lay}self_attention.linear_proj.weight`",
                f"`{layer}{n['proj']}.weight`",
                "as is (TP splits columns)",
            ),
            (f"`{lay}pre_mlp_layernorm.weight`", f"`{layer}{n['norm2']}.weight`", "as is"),
        ]
        fc1 = "[gate; up]; a TP rank holds [its gate rows; its up rows]"
        if self.dense_layers:
            rows += [
                (f"`{lay}mlp.linear_fc1.weight`", f"`{mlp}{n['gate']}`, `{mlp}{n['up']}`", fc1),
                (f"`{lay}mlp.linear_fc2.weight`", f"`{mlp}{n['down']}.weight`", "as is"),
            ]
        if self.moe:
            experts = layer + n["experts"].replace("{e}", "e")
            rows += [
                (f"`{lay}mlp.router.weight`", f"`{layer}{n['router']}.weight`", "as is"),
                (
                    f"`{lay}mlp.experts.experts.e.linear_fc1` / `linear_fc2`",
                    f"`{experts}{n['expert_gate']}`, `{n['expert_up']}`, `{n['expert_down']}`",
                    "like the dense MLP",
                ),
            ]
        if self.shared_expert:
            rows.append(
                (
                    f"`{lay}mlp.shared_experts.linear_fc1` / `linear_fc2`, `.gate_weight`",
                    f"`{layer}{n['shared']}*`, `{layer}{n['shared_gate']}.weight`",
                    "like the dense MLP",
                )
            )
        rows.append(("`decoder.final_layernorm.weight`", f"`{n['final_norm']}`", "as is"))
        return rows


def _gated_mlp(b: Builder, p: LLMArch, hf: str, mc: str, ffn: int, names, bias: bool, expert=False) -> None:
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


def _rope_theta(cfg: dict) -> float:
    """RoPE base: top-level `rope_theta` (config.json as published) or transformers 5's `rope_parameters`."""
    rp = cfg.get("rope_parameters") or {}
    scaling = cfg.get("rope_scaling") or (rp if rp.get("rope_type", "default") != "default" else None)
    if scaling and scaling.get("rope_type", scaling.get("type", "default")) != "default":
        kind = scaling.get("rope_type", scaling.get("type"))
        raise ArchError("rope_scaling", f"RoPE scaling of type {kind!r} is not built by the trainer")
    return float(cfg.get("rope_theta", rp.get("rope_theta", 10000.0)))


def export_family(p: LLMArch) -> DecoderFamily:
    """The family an LLM description is written as (refusing what none of them expresses): a Mistral model
    comes back as Llama, the same network."""
    if p.moe_router_score_function != "softmax":
        raise ArchError("moe_router_score_function", "sigmoid routing has no HuggingFace family here")
    if p.activation != "silu" or not p.gated_linear_unit or p.normalization != "RMSNorm":
        raise ArchError("activation", "the HuggingFace families here are SwiGLU + RMSNorm models")
    qwen2_bias = p.add_qkv_bias and not p.add_bias_linear
    if p.num_experts:
        if p.moe_shared_expert_intermediate_size or qwen2_bias:
            name = "qwen2_moe"
        elif p.qk_layernorm:
            name = "qwen3_moe"
        else:
            name = "mixtral"
    elif p.qk_layernorm:
        name = "qwen3"
    else:
        name = "qwen2" if qwen2_bias else "llama"
    fam = REGISTRY[name]
    assert isinstance(fam, DecoderFamily)
    return fam

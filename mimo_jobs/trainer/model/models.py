"""The two modules: a ViT encoder + MLP projector, and a GPT language model (dense or MoE).

Both are megatron-core 0.19 modules built with an explicit ProcessGroupCollection from the model
description (mimo_jobs/model/arch.py: EncoderArch, LLMArch). The layer backend (Transformer Engine or
megatron-core's local layers) and the fused kernels come from kernels.py, decided once per rank. Weights
come from `canonical_init_`, which derives every parameter from (seed, parameter name, full shape) and then
takes this rank's TP/EP shard, so every layout (and the one-process reference) starts from bit-identical
weights, whichever backend built the layers.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from megatron.core.activations import quick_gelu
from megatron.core.extensions.transformer_engine import TEColumnParallelLinear, TENorm, TERowParallelLinear
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_layer_specs
from megatron.core.models.gpt.gpt_model import GPTModel
from megatron.core.models.vision.multimodal_projector import MultimodalProjector
from megatron.core.models.vision.radio import RADIOViTModel
from megatron.core.models.vision.vit_layer_specs import (
    get_vit_layer_with_local_spec,
    get_vit_layer_with_transformer_engine_spec,
)
from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
from megatron.core.transformer.identity_op import IdentityOp
from megatron.core.transformer.mlp import MLPSubmodules
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.torch_norm import WrappedTorchNorm
from megatron.core.transformer.transformer_block import TransformerBlockSubmodules
from megatron.core.transformer.transformer_config import TransformerConfig

from mimo_jobs.model.arch import ModelArch, padded_vocab
from mimo_jobs.model.attention import SDPA
from mimo_jobs.model.cuts import strided_blocks
from mimo_jobs.model.hf_weights import canonical_alias
from mimo_jobs.model.splits import experts_apart
from mimo_jobs.trainer.model.kernels import CPU_KERNELS, TE, Kernels, bias_activation_fusion
from mimo_jobs.trainer.model.sdpa import SDPAttention

INIT_STD = 0.02


def gelu_tanh(x):
    """GELU with the tanh approximation (SigLIP's gelu_pytorch_tanh)."""
    return F.gelu(x, approximate="tanh")


ACTIVATIONS = {"gelu": F.gelu, "silu": F.silu, "quick_gelu": quick_gelu, "gelu_tanh": gelu_tanh}


@dataclass(frozen=True)
class Precision:
    use_gpu: bool
    bf16: bool
    kernels: Kernels = CPU_KERNELS

    @property
    def dtype(self):
        return torch.bfloat16 if self.bf16 else torch.float32

    @property
    def te(self) -> bool:
        return self.kernels.backend == TE


def _base_kwargs(
    prec: Precision,
    add_bias_linear: bool = True,
    activation: str = "gelu",
    gated: bool = False,
    grouped_experts: bool = False,
) -> dict:
    on = prec.kernels.on
    return {
        "params_dtype": prec.dtype,
        "pipeline_dtype": prec.dtype,
        "bf16": prec.bf16,
        "hidden_dropout": 0.0,
        "attention_dropout": 0.0,
        "use_cpu_initialization": not prec.use_gpu,
        "calculate_per_token_loss": True,
        # the native fused cross entropy is the one that honours pg_collection (the vocab-parallel one
        # reads the TP group off parallel_state)
        "cross_entropy_loss_fusion": on.get("cross_entropy_loss_fusion", True),
        "cross_entropy_fusion_impl": "native",
        "gradient_accumulation_fusion": on.get("gradient_accumulation_fusion", False),
        "bias_activation_fusion": bias_activation_fusion(
            on.get("bias_activation_fusion", False), gated, activation, grouped_experts
        ),
        "masked_softmax_fusion": on.get("masked_softmax_fusion", False),
        "bias_dropout_fusion": on.get("bias_dropout_fusion", False),
        "apply_rope_fusion": on.get("apply_rope_fusion", False),
        "persist_layer_norm": False,  # apex's persistent LayerNorm kernel: not used by either backend
        "add_bias_linear": add_bias_linear,
        "gated_linear_unit": gated,
        "activation_func": ACTIVATIONS[activation],
    }


def recompute_kwargs(recompute: str) -> dict:
    """One module's trainer.recompute setting (spec.RecomputeSpec.of gives it per module) as megatron-core's
    TransformerConfig fields, for that module's config only: `selective` recomputes the core
    attention (the activations that grow with the sequence squared), `full` recomputes each transformer
    layer from its input (uniform method, one layer per checkpoint)."""
    if recompute == "selective":
        return {"recompute_granularity": "selective", "recompute_modules": ["core_attn"]}
    if recompute == "full":
        return {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1}
    return {}


def unsupported(arch: ModelArch, lay) -> str | None:
    """Why the trainer cannot build this model at this layout (None: it can): the rules validate applies
    (study/expand.split_problems over model/splits.py), the first in validate's words. The trainer's own
    guard for a run.yaml that skipped validate."""
    from mimo_jobs.study.expand import split_problems

    found = split_problems(arch, lay)
    if found:
        _, msg, fit = found[0]
        return f"trainer.model: {msg} ({fit})"
    return None


def _moe_kwargs(p, tp: int, ep: int, etp: int, prec: Precision) -> dict:
    return {
        "num_moe_experts": p.num_experts,
        "moe_router_topk": p.moe_router_topk,
        "moe_ffn_hidden_size": p.expert_ffn,
        "moe_shared_expert_intermediate_size": p.moe_shared_expert_intermediate_size,
        "moe_shared_expert_gate": bool(getattr(p, "moe_shared_expert_gate", False)),
        # dense first layers: megatron-core reads a list as one 0/1 entry per layer
        "moe_layer_freq": list(p.moe_layer_pattern) if p.moe_layer_pattern is not None else 1,
        "moe_router_score_function": p.moe_router_score_function,
        "moe_router_pre_softmax": p.moe_router_pre_softmax,
        "expert_model_parallel_size": ep,
        "expert_tensor_parallel_size": etp,
        "moe_token_dispatcher_type": "alltoall",
        "moe_grouped_gemm": prec.kernels.grouped_gemm,
        "moe_router_load_balancing_type": "aux_loss",
        "moe_aux_loss_coeff": 1e-2,
        "moe_permute_fusion": False,
        "moe_router_fusion": False,
        "sequence_parallel": tp > 1,
    }


def llm_config(
    arch: ModelArch, tp: int, ep: int, etp: int, prec: Precision, recompute: str = "none", pp: int = 1
):
    p = arch.llm
    gated = p.gated_linear_unit
    # SequentialMLP with biases modifies a view in place (autograd error): MoE LLMs have no linear biases
    # (the description's default; validate refuses biases on an MoE LLM)
    grouped = bool(p.num_experts) and prec.kernels.grouped_gemm
    kw = _base_kwargs(prec, p.add_bias_linear, p.activation, gated, grouped) | recompute_kwargs(recompute)
    if p.num_experts:
        kw.update(_moe_kwargs(p, tp, ep, etp, prec))
    return TransformerConfig(
        num_layers=p.num_layers,
        hidden_size=p.hidden_size,
        num_attention_heads=p.num_attention_heads,
        num_query_groups=p.num_query_groups,
        kv_channels=p.kv_channels,
        ffn_hidden_size=p.ffn_hidden_size,
        add_qkv_bias=p.add_qkv_bias,
        normalization=p.normalization,
        layernorm_epsilon=p.norm_epsilon,
        qk_layernorm=p.qk_layernorm,
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        **kw,
    )


def encoder_configs(arch: ModelArch, tp: int, prec: Precision, recompute: str = "none"):
    e, llm = arch.encoder, arch.llm
    vit = TransformerConfig(
        num_layers=e.num_layers,
        hidden_size=e.hidden_size,
        num_attention_heads=e.num_attention_heads,
        ffn_hidden_size=e.ffn_hidden_size,
        tensor_model_parallel_size=tp,
        normalization=e.normalization,
        layernorm_epsilon=e.norm_epsilon,
        **(_base_kwargs(prec, True, e.activation) | recompute_kwargs(recompute)),
    )
    return vit, projector_config(llm.hidden_size, tp, prec)


def projector_config(llm_hidden: int, tp: int, prec: Precision) -> TransformerConfig:
    """Every encoder's projector: its output width (the encoder's out_width; an image encoder's times
    downsample^2 after the pixel shuffle) -> LLM width, MLP(in -> llm_h -> llm_h) with GELU, TP-split like
    the encoder."""
    return TransformerConfig(
        num_layers=1,
        hidden_size=llm_hidden,
        num_attention_heads=tp,
        ffn_hidden_size=llm_hidden,
        tensor_model_parallel_size=tp,
        **_base_kwargs(prec),
    )


class SPNorm:
    """The description's norm (LayerNorm or RMSNorm) for sequence-parallel MoE with TP>1 on the local
    backend: the local spec's WrappedTorchNorm refuses sequence_parallel, and SP norms need their params
    tagged so finalize_model_grads all-reduces their grads over TP (TE's TENorm does both itself)."""

    tag_sequence_parallel = True

    def __new__(cls, config, hidden_size: int, eps: float = 1e-5, **_):
        kind = torch.nn.RMSNorm if config.normalization == "RMSNorm" else torch.nn.LayerNorm
        norm = kind(hidden_size, eps=eps, dtype=config.params_dtype)
        for p in norm.parameters():
            p.sequence_parallel = config.sequence_parallel and cls.tag_sequence_parallel
        return norm


class QKNorm(SPNorm):
    """The per-head query/key norm under sequence parallelism: its input is the rank's own heads, not a
    sequence shard, so it is not tagged (finalize_model_grads sums q/k-norm grads over TP by name)."""

    tag_sequence_parallel = False


def llm_layer_spec(cfg, prec: Precision, stage: int = 0):
    """The block spec of this pipeline stage's layers: dense or MoE per layer (the description's
    moe_layer_pattern, as cfg.moe_layer_freq), the rank's backend, SP norms for local sequence parallel."""
    layers = get_gpt_decoder_layer_specs(cfg, prec.te, normalization=cfg.normalization)
    local = cfg.num_layers // cfg.pipeline_model_parallel_size
    layers = layers[stage * local : (stage + 1) * local]
    for spec in {id(s): s for s in layers}.values():
        with_core_attention_(spec, prec)
    final_norm = TENorm if prec.te else WrappedTorchNorm
    if not prec.te and cfg.sequence_parallel:
        for spec in {id(s): s for s in layers}.values():  # the dense and MoE specs, each changed once
            spec.submodules.input_layernorm = SPNorm
            spec.submodules.pre_mlp_layernorm = SPNorm
            att = spec.submodules.self_attention.submodules
            if att.q_layernorm is not IdentityOp:
                att.q_layernorm = att.k_layernorm = QKNorm
        final_norm = SPNorm
    return TransformerBlockSubmodules(layer_specs=layers, layer_norm=final_norm)


def build_llm(
    arch: ModelArch,
    cfg,
    pgc,
    prec: Precision,
    seq_length: int,
    first: bool = True,
    last: bool = True,
    stage: int = 0,
):
    """The LLM, or its pipeline stage `stage`: `first` holds the embedding, `last` the output layer and the
    loss; each stage builds num_layers / pp layers."""
    p = arch.llm
    gpt = GPTModel(
        config=cfg,
        transformer_layer_spec=llm_layer_spec(cfg, prec, stage),
        vocab_size=padded_vocab(p.vocab_size, cfg.tensor_model_parallel_size),
        max_sequence_length=seq_length,
        position_embedding_type="rope",
        rotary_base=int(p.rotary_base) if float(p.rotary_base).is_integer() else p.rotary_base,
        # tied only with one pipeline stage (unsupported() refuses the rest): nothing to sync across stages
        share_embeddings_and_output_weights=p.tie_word_embeddings,
        pre_process=first,
        post_process=last,
        pg_collection=pgc,
    )
    use_expert_groups_(gpt, cfg)
    return in_params_dtype(gpt, prec)


def use_expert_groups_(gpt, cfg) -> None:
    """Mark every routed-expert parameter allreduce=False, so DDP reduces its gradient over the expert-DP
    group and the optimizer holds it in its expert part, whenever the expert grid differs from the dense one.

    megatron-core 0.16.1 did so only with EP > 1. With EP = 1 and ETP != TP (the default ETP 1 under TP 2)
    the experts are replicated over the TP ranks, each of which routes only its own sequence-parallel
    shard of the tokens: left in the dense buffer, their partial gradients are reduced over DP alone, the
    TP copies drift apart and the grad norm undercounts. megatron-core 0.19 applies this same rule to its own
    layers (expert_model_parallel_size > 1 or expert_tensor_parallel_size != tensor_model_parallel_size), and
    marking them here keeps the rule in one place with the predictor's (model/splits.experts_apart):
    https://github.com/NVIDIA/Megatron-LM/pull/5916"""
    etp, tp = cfg.expert_tensor_parallel_size, cfg.tensor_model_parallel_size
    if not cfg.num_moe_experts or not experts_apart(cfg.expert_model_parallel_size, etp, tp):
        return
    from megatron.core.transformer.moe.moe_layer import MoELayer

    for m in gpt.modules():
        if isinstance(m, MoELayer):
            for p in m.experts.parameters():  # routed experts only: not the router, not a shared expert
                p.allreduce = False


def build_encoder(arch: ModelArch, vit_cfg, proj_cfg, pgc, prec: Precision):
    return in_params_dtype(Encoder(arch, vit_cfg, proj_cfg, pgc, prec), prec)


def in_params_dtype(module, prec: Precision):
    """Every floating parameter in the run's dtype, as megatron-core's Float16Module casts a bf16 model:
    the local backend's norms (WrappedTorchNorm) ignore params_dtype and would stay fp32."""
    if prec.bf16:
        module.to(dtype=prec.dtype)
    return module


def with_core_attention_(layer_spec, prec: Precision):
    """A local layer spec's core attention as trainer.attention chooses (Kernels.attention): torch's SDPA
    (sdpa.SDPAttention) or megatron-core's unfused DotProductAttention, which the local specs name.
    Transformer Engine's specs keep their own. Returns the spec, changed in place."""
    if not prec.te and prec.kernels.attention == SDPA:
        layer_spec.submodules.self_attention.submodules.core_attention = SDPAttention
    return layer_spec


def encoder_layer_specs(prec: Precision):
    """(ViT layer spec, projector MLP submodules, norm) of the rank's backend."""
    if prec.te:
        return (
            get_vit_layer_with_transformer_engine_spec(),
            MLPSubmodules(linear_fc1=TEColumnParallelLinear, linear_fc2=TERowParallelLinear),
            TENorm,
        )
    return (
        with_core_attention_(get_vit_layer_with_local_spec(), prec),
        MLPSubmodules(linear_fc1=ColumnParallelLinear, linear_fc2=RowParallelLinear),
        WrappedTorchNorm,
    )


class VarResViT(RADIOViTModel):
    """RADIO's ViT without CPE: its position table is windowed to any image size (a multiple of the patch),
    so images of different sizes give different token counts. CLIP's, SigLIP's and InternViT's ViTs are the
    same network: an optional class token with its own position row (CLIP, InternViT), an optional norm
    before the first layer (CLIP's pre_layrnorm) and after the last (post_layernorm), and an optional layer
    scale (InternViT: add_layer_scale_)."""

    def __init__(self, cfg, spec, e, norm, pgc):
        super().__init__(
            cfg,
            spec,
            ln_pre_impl=norm if e.pre_norm else None,
            ln_post_impl=norm if e.final_norm else None,
            add_class_token=e.class_token,
            class_token_len=1,
            patch_dim=e.patch_size,
            img_h=e.image_size,
            img_w=e.image_size,
            max_img_h=e.image_size,
            max_img_w=e.image_size,
            has_cpe=False,
            embedder_bias=e.patch_bias,
            pg_collection=pgc,
        )
        self.temporal = e.temporal_patch_size
        # the class token's position row (RADIO gives the class token none; CLIP's table has one)
        self.class_position = (
            torch.nn.Parameter(torch.zeros(1, cfg.hidden_size, dtype=cfg.params_dtype))
            if e.class_token
            else None
        )
        if e.layer_scale:
            for layer in self.decoder.layers:
                add_layer_scale_(layer.self_attention, cfg)
                add_layer_scale_(layer.mlp, cfg)

    def forward(self, x, attention_mask=None):
        """[b, C, H, W] images or [b, T, C, H, W] clips (T a multiple of the temporal patch size) -> [b, n, h]:
        n = (T/t)(H/p)(W/p) patch tokens (t frames by p x p pixels each, in time, row, column order), after
        the class token when there is one. Every temporal group takes the same position rows."""
        p, t = self.patch_dim, self.temporal
        if x.dim() == 4:
            x = x.unsqueeze(1)
        b, frames, c, hh, ww = x.shape
        g, py, px = frames // t, hh // p, ww // p
        # a patch's values in (channel, time, row, column) order: Qwen2-VL's 3-D patch layout
        x = (
            x.reshape(b, g, t, c, py, p, px, p)
            .permute(0, 1, 4, 6, 3, 2, 5, 7)
            .reshape(b, g * py * px, c * t * p * p)
        )
        x, _ = self.embedder(x)
        pos = self._get_pos_embeddings(b, (py, px))
        x = x + (pos.repeat(1, g, 1) if g > 1 else pos)
        if self.add_class_token:
            cls = (self.class_token + self.class_position).expand(b, -1, -1)
            x = torch.cat([cls, x], dim=1)
        if self.ln_pre is not None:
            x = self.ln_pre(x)
        n = x.shape[1]
        if attention_mask is None:
            # bidirectional attention; an explicit mask also avoids mcore's device="cuda" default mask
            attention_mask = torch.zeros(1, 1, n, n, dtype=torch.bool, device=x.device)
        x = self.decoder(x.transpose(0, 1).contiguous(), attention_mask=attention_mask)
        x = x.transpose(0, 1).contiguous()
        return self.ln_post(x) if self.ln_post is not None else x


def _scaled_output(module, _args, out):
    """A layer's attention or MLP output (output, bias) times the module's layer scale, the bias folded in
    (megatron-core's bias-dropout-add takes a None bias)."""
    y, bias = out
    if bias is not None:
        y = y + bias
    return y * module.layer_scale, None


def add_layer_scale_(module, cfg) -> None:
    """A learned per-channel scale of `module`'s output, applied before the residual add (InternViT's
    lambda_1 / lambda_2: transformers' InternVLVisionLayer). megatron-core's TransformerLayer has none, so
    the scale is a parameter of the attention / MLP module (`<module>.layer_scale`, [h], whole on every TP
    rank: the output it scales is already reduced over TP) and a forward hook applies it."""
    module.layer_scale = torch.nn.Parameter(torch.ones(cfg.hidden_size, dtype=cfg.params_dtype))
    module.register_forward_hook(_scaled_output)


def pixel_shuffle(y, py: int, px: int, s: int):
    """[b, py*px, h] patch tokens (row-major) -> [b, (py/s)(px/s), s*s*h]: each s x s block of neighbouring
    patches becomes one token holding their s*s feature vectors (row-major inside the block)."""
    b, _, h = y.shape
    y = y.reshape(b, py // s, s, px // s, s, h).permute(0, 1, 3, 2, 4, 5)
    return y.reshape(b, (py // s) * (px // s), s * s * h)


class Encoder(MegatronModule):
    """ViT + pixel shuffle + MLP projector: a list of images -> flat image embeddings [sum N_i, llm_hidden]."""

    def __init__(self, arch: ModelArch, vit_cfg, proj_cfg, pgc, prec: Precision):
        super().__init__(config=vit_cfg)
        e = arch.encoder
        spec, proj_sub, norm = encoder_layer_specs(prec)
        self.patch = e.patch_size
        self.downsample = e.downsample
        self.class_token = e.class_token
        self.temporal = e.temporal_patch_size
        self.vit = VarResViT(vit_cfg, spec, e, norm, pgc)
        # RADIO builds its patch embedder without tp_group (radio.py:129): rebuild it on our TP group.
        self.vit.embedder = ColumnParallelLinear(
            input_size=e.patch_inputs,
            output_size=e.hidden_size,
            bias=e.patch_bias,
            config=vit_cfg,
            gather_output=True,
            init_method=lambda t: torch.nn.init.normal_(t, 0, 1),
            tp_group=pgc.tp,
        )
        self.projector = MultimodalProjector(
            proj_cfg, proj_sub, "mlp", input_size=e.projector_input, tp_group=pgc.tp
        )
        self.out_hidden = proj_cfg.hidden_size
        self.dtype = prec.dtype

    def forward(self, images: list):
        """images: [C, H, W] images or [T, C, H, W] videos' frames (H, W multiples of patch x downsample).
        Returns [sum_i N_i, H_llm] in input order, N_i = EncoderArch.tokens_for(H, W) for an image and
        EncoderArch.video_tokens(T, H, W) for a video. Inputs of one shape run as one batch."""
        if not images:
            return None
        clips = [self._clip(im) for im in images]
        order: dict[tuple, list[int]] = {}
        for i, clip in enumerate(clips):
            order.setdefault(tuple(clip.shape), []).append(i)
        outs: list = [None] * len(images)
        step = self.patch * self.downsample
        for shape, idx in order.items():
            if shape[-2] % step or shape[-1] % step:
                raise ValueError(
                    f"an image of {shape[-2]}x{shape[-1]} px does not divide into {step}x{step} px blocks "
                    f"(patch_size {self.patch} x downsample {self.downsample}); the data must give sides "
                    f"that are multiples of {step}"
                )
            x = torch.stack([clips[i] for i in idx]).to(self.dtype)
            y = self.vit(x)  # [b, n (+1 class token), h_enc]
            if self.class_token:  # it attends inside the ViT; the LLM gets the patch tokens only
                y = y[:, 1:]
            if self.downsample > 1:
                g, py, px = shape[0] // self.temporal, shape[-2] // self.patch, shape[-1] // self.patch
                y = pixel_shuffle(y.reshape(len(idx) * g, py * px, -1), py, px, self.downsample)
                y = y.reshape(len(idx), g * y.shape[1], -1)
            for j, i in enumerate(idx):
                outs[i] = y[j]
        flat = torch.cat(outs, dim=0).unsqueeze(1)  # [sum N, 1, h_in]: MLP works on [s, b, h]
        return self.projector(flat).squeeze(1)

    def _clip(self, x):
        """An input as [T, C, H, W] frames, T a multiple of the temporal patch size: an image repeated (one
        temporal group), a video's frames with its last frame repeated to fill the last group (as Qwen2-VL's
        processor pads)."""
        t = self.temporal
        if x.dim() == 3:
            return x.unsqueeze(0).expand(t, *x.shape) if t > 1 else x.unsqueeze(0)
        short = -x.shape[0] % t
        return torch.cat([x, x[-1:].expand(short, *x.shape[1:])]) if short else x


# ----------------------------------------------------------------------------------------------- init

_EXPERT_RE = re.compile(r"local_experts\.(\d+)\.")
_LAYER_RE = re.compile(r"(?<![a-z_])layers\.(\d+)\.")
# TE's grouped GEMM holds local expert i of one linear as parameters weight<i> / bias<i>
_GROUPED_RE = re.compile(r"experts\.(linear_fc[12])\.(weight|bias)(\d+)$")
# megatron-core's grouped linears by layer type, and the dimension each splits over expert TP. TE records
# partition_dim 0 on all of them when megatron handles expert comms itself (parallel_mode None), so the
# layer type, not the attribute, says which dimension is split.
_GROUPED_PARTITION_DIM = {"TEColumnParallelGroupedLinear": 0, "TERowParallelGroupedLinear": 1}
# TE layers that hold the next norm inside a linear (TELayerNormColumnParallelLinear's layer_norm_weight)
_FUSED_NORM_RE = re.compile(r"\.layer_norm_(weight|bias)$")
TE_NAMES, LOCAL_NAMES = "te", "local"


@dataclass(frozen=True)
class ParamShard:
    """One parameter as canonical_init_ sees it: its canonical name and how this rank's shard is cut."""

    cname: str
    expert: bool
    dim: int | None  # the split dimension (None: this rank holds the full tensor)
    rank: int
    size: int
    # megatron-core's partition_stride: the full tensor is `parts` equal blocks along `dim` and a rank holds
    # its slice of each (a gated MLP's fc1 is [gate; up], a rank's shard [gate shard; up shard])
    parts: int = 1


def _grouped_partition_dim(module) -> int | None:
    for cls in type(module).__mro__:
        if cls.__name__ in _GROUPED_PARTITION_DIM:
            return _GROUPED_PARTITION_DIM[cls.__name__]
    return None


def _grouped_parts(module, dim: int) -> int:
    """The strided blocks of a grouped linear, from the layer: TE's GroupedLinear records partition_stride
    1 on every weight, yet a gated expert's fc1 (column-parallel) holds [its gate rows; its up rows] on each
    expert-TP rank, as megatron-core's TEGroupedMLP chunks it in two and its checkpoint applies the SwiGLU
    factory to it (megatron/core/transformer/moe/experts.py)."""
    gated = bool(getattr(getattr(module, "config", None), "gated_linear_unit", False))
    return 2 if gated and dim == 0 else 1


def layer_naming(module) -> str:
    """How `module`'s parameters are named: TE_NAMES when a layer holds a fused norm (layer_norm_weight) or
    grouped experts (weight<i>), LOCAL_NAMES otherwise. Two builds with the same naming and layout have the
    same state_dict keys and optimizer order; any other pair meets only through canonical names."""
    for name, _ in module.named_parameters():
        if _FUSED_NORM_RE.search(name) or _GROUPED_RE.search(name):
            return TE_NAMES
    return LOCAL_NAMES


def param_shards(
    module,
    tp_rank: int,
    tp_size: int,
    etp_rank: int = 0,
    etp_size: int = 1,
    ep_rank: int = 0,
    num_local_experts: int = 0,
    layer_offset: int = 0,
):
    """(name, parameter, ParamShard) of every parameter of `module`.

    The canonical name replaces a local expert index by its global one (ep_rank * local + i), names a
    grouped-GEMM expert parameter (linear_fc1.weight3) like its sequential twin
    (experts.<global>.linear_fc1.weight), names a norm TE fuses into the next linear like the local layer's
    norm (hf_weights.canonical_alias), and replaces a pipeline stage's local layer index by the global one
    (+ layer_offset). It is the one name every checkpoint path (save, reshard, HF load, export) uses, so a
    checkpoint moves between layer backends."""
    owners = {
        f"{n}.{pn}" if n else pn: m
        for n, m in module.named_modules()
        for pn, _ in m.named_parameters(recurse=False)
    }
    for name, p in module.named_parameters():
        # a pipeline stage numbers its layers from 0: the canonical name has the global layer index
        cname = canonical_alias(
            _LAYER_RE.sub(lambda m: f"layers.{int(m.group(1)) + layer_offset}.", name)
            if layer_offset
            else name
        )
        grouped = _GROUPED_RE.search(cname)
        # expert params: by name (with EP=1 mcore leaves their `allreduce` attribute True)
        is_expert = bool(grouped or _EXPERT_RE.search(name)) or not getattr(p, "allreduce", True)
        if grouped:
            g = ep_rank * num_local_experts + int(grouped.group(3))
            cname = cname[: grouped.start()] + f"experts.experts.{g}.{grouped.group(1)}.{grouped.group(2)}"
        elif is_expert and num_local_experts:
            cname = _EXPERT_RE.sub(
                lambda m: f"experts.{ep_rank * num_local_experts + int(m.group(1))}.", cname
            )
        rank, size = (etp_rank, etp_size) if is_expert else (tp_rank, tp_size)
        dim, parts = None, 1
        if getattr(p, "tensor_model_parallel", False) and size > 1:
            dim = p.partition_dim
            if grouped:
                dim = _grouped_partition_dim(owners[name])
                if dim is None:
                    raise NotImplementedError(f"canonical init: unknown grouped linear for {name}")
                if grouped.group(2) == "bias" and dim == 1:
                    dim = None  # a row-parallel bias is whole on every rank
                parts = 1 if dim is None else _grouped_parts(owners[name], dim)
            else:
                # a strided split (a gated MLP's fc1, stride 2) hands each rank its slice of every block
                parts = getattr(p, "partition_stride", 1)
        yield name, p, ParamShard(cname, is_expert, dim, rank, size, parts)


def canonical_tensor(seed: int, tag: str, cname: str, full: list[int]):
    """The full tensor a parameter is cut from: norm weights and layer scales 1, biases 0, the rest
    N(0, INIT_STD)."""
    g = torch.Generator().manual_seed(zlib.crc32(f"{seed}:{tag}:{cname}".encode()) & 0x7FFFFFFF)
    leaf = cname.rsplit(".", 1)[-1]
    if ("norm" in cname and "weight" in leaf) or leaf == "layer_scale":
        return torch.ones(full)
    if "bias" in leaf:
        return torch.zeros(full)
    return torch.randn(full, generator=g) * INIT_STD


def canonical_init_(
    module,
    seed: int,
    tag: str,
    tp_rank: int,
    tp_size: int,
    etp_rank: int = 0,
    etp_size: int = 1,
    ep_rank: int = 0,
    num_local_experts: int = 0,
    layer_offset: int = 0,
) -> None:
    """Overwrite every parameter with its shard of a full tensor drawn from (seed, tag, canonical name)
    (see param_shards); TP-split params are drawn at full size and sliced along their split dimension."""
    shards = param_shards(
        module, tp_rank, tp_size, etp_rank, etp_size, ep_rank, num_local_experts, layer_offset
    )
    for _, p, sh in shards:
        full = list(p.shape)
        if sh.dim is not None:
            full[sh.dim] *= sh.size
        t = canonical_tensor(seed, tag, sh.cname, full)
        if sh.dim is not None:
            cut = strided_blocks(full[sh.dim], sh.parts, sh.rank, sh.size)
            t = torch.cat([t.narrow(sh.dim, s, n) for s, n in cut], sh.dim)
        with torch.no_grad():
            p.copy_(t.to(device=p.device, dtype=p.dtype))

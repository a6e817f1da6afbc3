"""The two modules: a ViT encoder + MLP projector, and a GPT language model (dense or MoE).

Both are megatron-core 0.16.1 modules built with an explicit ProcessGroupCollection. The layer backend
(Transformer Engine or megatron-core's local layers) and the fused kernels come from kernels.py, decided
once per rank. Weights come from `canonical_init_`, which derives every parameter from (seed, parameter
name, full shape) and then takes this rank's TP/EP shard, so every layout (and the one-process reference)
starts from bit-identical weights, whichever backend built the layers.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass

import torch
from megatron.core.extensions.transformer_engine import TEColumnParallelLinear, TERowParallelLinear
from megatron.core.models.gpt.gpt_layer_specs import (
    get_gpt_layer_local_spec,
    get_gpt_layer_with_transformer_engine_spec,
)
from megatron.core.models.gpt.gpt_model import GPTModel
from megatron.core.models.vision.multimodal_projector import MultimodalProjector
from megatron.core.models.vision.radio import RADIOViTModel
from megatron.core.models.vision.vit_layer_specs import (
    get_vit_layer_with_local_spec,
    get_vit_layer_with_transformer_engine_spec,
)
from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
from megatron.core.transformer.mlp import MLPSubmodules
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.transformer_block import TransformerBlockSubmodules
from megatron.core.transformer.transformer_config import TransformerConfig

from mimo_jobs.study.presets import ModelPreset
from mimo_jobs.trainer.model.kernels import CPU_KERNELS, TE, Kernels, bias_activation_fusion

INIT_STD = 0.02


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


def _base_kwargs(prec: Precision, add_bias_linear: bool = True) -> dict:
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
            on.get("bias_activation_fusion", False), False, add_bias_linear
        ),
        "masked_softmax_fusion": on.get("masked_softmax_fusion", False),
        "bias_dropout_fusion": on.get("bias_dropout_fusion", False),
        "apply_rope_fusion": on.get("apply_rope_fusion", False),
        "persist_layer_norm": False,  # apex's persistent LayerNorm kernel: not used by either backend
    }


def recompute_kwargs(recompute: str) -> dict:
    """trainer.recompute as megatron-core's TransformerConfig fields: `selective` recomputes the core
    attention (the activations that grow with the sequence squared), `full` recomputes each transformer
    layer from its input (uniform method, one layer per checkpoint)."""
    if recompute == "selective":
        return {"recompute_granularity": "selective", "recompute_modules": ["core_attn"]}
    if recompute == "full":
        return {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1}
    return {}


def llm_config(
    preset: ModelPreset, tp: int, ep: int, etp: int, prec: Precision, recompute: str = "none", pp: int = 1
):
    p = preset.llm
    moe = bool(p.num_experts)
    # SequentialMLP with biases modifies a view in place (autograd error): MoE LLMs have no linear biases
    kw = _base_kwargs(prec, add_bias_linear=not moe) | recompute_kwargs(recompute)
    if moe:
        kw.update(
            num_moe_experts=p.num_experts,
            moe_router_topk=p.moe_router_topk,
            moe_ffn_hidden_size=p.moe_ffn_hidden_size or p.ffn_hidden_size,
            expert_model_parallel_size=ep,
            expert_tensor_parallel_size=etp,
            moe_token_dispatcher_type="alltoall",
            moe_grouped_gemm=prec.kernels.grouped_gemm,
            moe_router_load_balancing_type="aux_loss",
            moe_aux_loss_coeff=1e-2,
            moe_permute_fusion=False,
            moe_router_fusion=False,
            add_bias_linear=False,
            sequence_parallel=tp > 1,
        )
    return TransformerConfig(
        num_layers=p.num_layers,
        hidden_size=p.hidden_size,
        num_attention_heads=p.num_attention_heads,
        num_query_groups=p.num_query_groups,
        ffn_hidden_size=p.ffn_hidden_size,
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        **kw,
    )


def encoder_configs(preset: ModelPreset, tp: int, prec: Precision, recompute: str = "none"):
    e, llm = preset.encoder, preset.llm
    vit = TransformerConfig(
        num_layers=e.num_layers,
        hidden_size=e.hidden_size,
        num_attention_heads=e.num_attention_heads,
        ffn_hidden_size=e.ffn_hidden_size,
        tensor_model_parallel_size=tp,
        **(_base_kwargs(prec) | recompute_kwargs(recompute)),
    )
    # The projector maps encoder width -> LLM width: MLP(enc_h -> llm_h -> llm_h), TP-split like the ViT.
    proj = TransformerConfig(
        num_layers=1,
        hidden_size=llm.hidden_size,
        num_attention_heads=tp,
        ffn_hidden_size=llm.hidden_size,
        tensor_model_parallel_size=tp,
        gated_linear_unit=False,
        **_base_kwargs(prec),
    )
    return vit, proj


class SPLayerNorm(torch.nn.LayerNorm):
    """A LayerNorm for sequence-parallel MoE with TP>1 on the local backend: the local spec's
    WrappedTorchNorm refuses sequence_parallel, and SP norms need their params tagged so
    finalize_model_grads all-reduces their grads over TP (TE's TENorm does both itself)."""

    def __init__(self, config, hidden_size: int, eps: float = 1e-5, **_):
        super().__init__(hidden_size, eps=eps, dtype=config.params_dtype)
        for p in self.parameters():
            p.sequence_parallel = config.sequence_parallel


def llm_layer_spec(cfg, prec: Precision, num_experts: int | None):
    """The GPT layer spec of the rank's backend (a block spec with SP norms for local sequence parallel)."""
    if prec.te:
        return get_gpt_layer_with_transformer_engine_spec(
            num_experts=num_experts, moe_grouped_gemm=prec.kernels.grouped_gemm and bool(num_experts)
        )
    spec = get_gpt_layer_local_spec(num_experts=num_experts, moe_grouped_gemm=False)
    if cfg.sequence_parallel:
        spec.submodules.input_layernorm = SPLayerNorm
        spec.submodules.pre_mlp_layernorm = SPLayerNorm
        local = cfg.num_layers // cfg.pipeline_model_parallel_size
        spec = TransformerBlockSubmodules(layer_specs=[spec] * local, layer_norm=SPLayerNorm)
    return spec


def build_llm(
    preset: ModelPreset, cfg, pgc, prec: Precision, seq_length: int, first: bool = True, last: bool = True
):
    """The LLM, or its pipeline stage: `first` holds the embedding, `last` the output layer and the loss;
    each stage builds num_layers / pp layers (megatron-core reads the stage from pgc.pp)."""
    gpt = GPTModel(
        config=cfg,
        transformer_layer_spec=llm_layer_spec(cfg, prec, preset.llm.num_experts or None),
        vocab_size=preset.llm.vocab_size,
        max_sequence_length=seq_length,
        position_embedding_type="rope",
        share_embeddings_and_output_weights=False,  # untied: nothing to keep in sync across stages
        pre_process=first,
        post_process=last,
        pg_collection=pgc,
    )
    return in_params_dtype(gpt, prec)


def build_encoder(preset: ModelPreset, vit_cfg, proj_cfg, pgc, prec: Precision):
    return in_params_dtype(Encoder(preset, vit_cfg, proj_cfg, pgc, prec), prec)


def in_params_dtype(module, prec: Precision):
    """Every floating parameter in the run's dtype, as megatron-core's Float16Module casts a bf16 model:
    the local backend's norms (WrappedTorchNorm) ignore params_dtype and would stay fp32."""
    if prec.bf16:
        module.to(dtype=prec.dtype)
    return module


def encoder_layer_specs(prec: Precision):
    """(ViT layer spec, projector MLP submodules) of the rank's backend."""
    if prec.te:
        return (
            get_vit_layer_with_transformer_engine_spec(),
            MLPSubmodules(linear_fc1=TEColumnParallelLinear, linear_fc2=TERowParallelLinear),
        )
    return (
        get_vit_layer_with_local_spec(),
        MLPSubmodules(linear_fc1=ColumnParallelLinear, linear_fc2=RowParallelLinear),
    )


class VarResViT(RADIOViTModel):
    """RADIO ViT without CPE: its position table is windowed to any image size (multiple of the patch), so
    images of different sizes give different token counts. RADIO checks a fixed seq_length; it is set per
    call from the input."""

    def forward(self, x, attention_mask=None):
        self.seq_length = (x.shape[-2] // self.patch_dim) * (x.shape[-1] // self.patch_dim)
        if attention_mask is None:
            # bidirectional attention; an explicit mask also avoids mcore's device="cuda" default mask
            attention_mask = torch.zeros(
                1, 1, self.seq_length, self.seq_length, dtype=torch.bool, device=x.device
            )
        return super().forward(x, attention_mask=attention_mask)


class Encoder(MegatronModule):
    """ViT + MLP projector: a list of images -> flat image embeddings [sum N_i, llm_hidden]."""

    def __init__(self, preset: ModelPreset, vit_cfg, proj_cfg, pgc, prec: Precision):
        super().__init__(config=vit_cfg)
        e = preset.encoder
        spec, proj_sub = encoder_layer_specs(prec)
        self.patch = e.patch_size
        self.vit = VarResViT(
            vit_cfg,
            spec,
            add_class_token=False,
            patch_dim=e.patch_size,
            img_h=e.image_size,
            img_w=e.image_size,
            max_img_h=e.image_size,
            max_img_w=e.image_size,
            has_cpe=False,
            pg_collection=pgc,
        )
        # RADIO builds its patch embedder without tp_group (radio.py:129): rebuild it on our TP group.
        self.vit.embedder = ColumnParallelLinear(
            input_size=e.channels * e.patch_size**2,
            output_size=e.hidden_size,
            bias=False,
            config=vit_cfg,
            gather_output=True,
            init_method=lambda t: torch.nn.init.normal_(t, 0, 1),
            tp_group=pgc.tp,
        )
        self.projector = MultimodalProjector(
            proj_cfg, proj_sub, "mlp", input_size=e.hidden_size, tp_group=pgc.tp
        )
        self.out_hidden = proj_cfg.hidden_size
        self.dtype = prec.dtype

    def forward(self, images: list):
        """images: [C, H, W] tensors (H, W multiples of the patch). Returns [sum_i N_i, H_llm] in image
        order, N_i = (H/p)*(W/p). Same-size images run as one batch."""
        if not images:
            return None
        order: dict[tuple, list[int]] = {}
        for i, im in enumerate(images):
            order.setdefault(tuple(im.shape), []).append(i)
        outs: list = [None] * len(images)
        for idx in order.values():
            x = torch.stack([images[i] for i in idx]).to(self.dtype)
            y = self.vit(x)  # [b, n, h_enc]
            for j, i in enumerate(idx):
                outs[i] = y[j]
        flat = torch.cat(outs, dim=0).unsqueeze(1)  # [sum N, 1, h_enc]: MLP works on [s, b, h]
        return self.projector(flat).squeeze(1)


# ----------------------------------------------------------------------------------------------- init

_EXPERT_RE = re.compile(r"local_experts\.(\d+)\.")
_LAYER_RE = re.compile(r"(?<![a-z_])layers\.(\d+)\.")
# TE's grouped GEMM holds local expert i of one linear as parameters weight<i> / bias<i>
_GROUPED_RE = re.compile(r"experts\.(linear_fc[12])\.(weight|bias)(\d+)$")
# megatron-core's grouped linears by layer type, and the dimension each splits over expert TP. TE records
# partition_dim 0 on all of them when megatron handles expert comms itself (parallel_mode None), so the
# layer type, not the attribute, says which dimension is split.
_GROUPED_PARTITION_DIM = {"TEColumnParallelGroupedLinear": 0, "TERowParallelGroupedLinear": 1}


@dataclass(frozen=True)
class ParamShard:
    """One parameter as canonical_init_ sees it: its canonical name and how this rank's shard is cut."""

    cname: str
    expert: bool
    dim: int | None  # the split dimension (None: this rank holds the full tensor)
    rank: int
    size: int


def _grouped_partition_dim(module) -> int | None:
    for cls in type(module).__mro__:
        if cls.__name__ in _GROUPED_PARTITION_DIM:
            return _GROUPED_PARTITION_DIM[cls.__name__]
    return None


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
    (experts.<global>.linear_fc1.weight), and replaces a pipeline stage's local layer index by the global
    one (+ layer_offset)."""
    owners = {
        f"{n}.{pn}" if n else pn: m
        for n, m in module.named_modules()
        for pn, _ in m.named_parameters(recurse=False)
    }
    for name, p in module.named_parameters():
        # a pipeline stage numbers its layers from 0: the canonical name has the global layer index
        cname = (
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
        dim = None
        if getattr(p, "tensor_model_parallel", False) and size > 1:
            dim = p.partition_dim
            if grouped:
                dim = _grouped_partition_dim(owners[name])
                if dim is None:
                    raise NotImplementedError(f"canonical init: unknown grouped linear for {name}")
                if grouped.group(2) == "bias" and dim == 1:
                    dim = None  # a row-parallel bias is whole on every rank
            if getattr(p, "partition_stride", 1) != 1:
                raise NotImplementedError(f"canonical init: strided TP partition for {name}")
        yield name, p, ParamShard(cname, is_expert, dim, rank, size)


def canonical_tensor(seed: int, tag: str, cname: str, full: list[int]):
    """The full tensor a parameter is cut from: norm weights 1, biases 0, the rest N(0, INIT_STD)."""
    g = torch.Generator().manual_seed(zlib.crc32(f"{seed}:{tag}:{cname}".encode()) & 0x7FFFFFFF)
    leaf = cname.rsplit(".", 1)[-1]
    if "norm" in cname and "weight" in leaf:
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
            n = p.shape[sh.dim]
            t = t.narrow(sh.dim, sh.rank * n, n)
        with torch.no_grad():
            p.copy_(t.to(device=p.device, dtype=p.dtype))

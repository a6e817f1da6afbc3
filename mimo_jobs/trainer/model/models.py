"""The two modules: a ViT encoder + MLP projector, and a GPT language model (dense or MoE).

Both are megatron-core 0.16.1 modules built with an explicit ProcessGroupCollection. Transformer Engine
specs on GPU, local specs on CPU. Weights come from `canonical_init_`, which derives every parameter from
(seed, parameter name, full shape) and then takes this rank's TP/EP shard, so every layout (and the
one-process reference) starts from bit-identical weights.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass

from mimo_jobs.study.presets import ModelPreset

INIT_STD = 0.02


@dataclass(frozen=True)
class Precision:
    use_gpu: bool
    bf16: bool

    @property
    def dtype(self):
        import torch

        return torch.bfloat16 if self.bf16 else torch.float32


def _base_kwargs(prec: Precision) -> dict:
    kw = {
        "params_dtype": prec.dtype,
        "pipeline_dtype": prec.dtype,
        "bf16": prec.bf16,
        "hidden_dropout": 0.0,
        "attention_dropout": 0.0,
        "use_cpu_initialization": not prec.use_gpu,
        "calculate_per_token_loss": True,
        # the native fused cross entropy is the one that honours pg_collection (the vocab-parallel one
        # reads the TP group off parallel_state)
        "cross_entropy_loss_fusion": True,
        "cross_entropy_fusion_impl": "native",
    }
    if not prec.use_gpu:
        # no TE/apex/CUDA kernels on CPU
        kw.update(
            gradient_accumulation_fusion=False,
            bias_activation_fusion=False,
            masked_softmax_fusion=False,
            bias_dropout_fusion=False,
            apply_rope_fusion=False,
            persist_layer_norm=False,
        )
    else:
        kw.update(gradient_accumulation_fusion=False)
    return kw


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
    from megatron.core.transformer.transformer_config import TransformerConfig

    p = preset.llm
    kw = _base_kwargs(prec) | recompute_kwargs(recompute)
    if p.num_experts:
        kw.update(
            num_moe_experts=p.num_experts,
            moe_router_topk=p.moe_router_topk,
            moe_ffn_hidden_size=p.moe_ffn_hidden_size or p.ffn_hidden_size,
            expert_model_parallel_size=ep,
            expert_tensor_parallel_size=etp,
            moe_token_dispatcher_type="alltoall",
            moe_grouped_gemm=prec.use_gpu,
            moe_router_load_balancing_type="aux_loss",
            moe_aux_loss_coeff=1e-2,
            moe_permute_fusion=False,
            moe_router_fusion=False,
            add_bias_linear=False,  # SequentialMLP with biases modifies a view in place (autograd error)
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
    from megatron.core.transformer.transformer_config import TransformerConfig

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


def _sp_norm_class():
    """A LayerNorm for sequence-parallel MoE with TP>1 on CPU: the local spec's WrappedTorchNorm refuses
    sequence_parallel, and SP norms need their params tagged so finalize_model_grads all-reduces
    their grads over TP."""
    import torch

    class SPLayerNorm(torch.nn.LayerNorm):
        def __init__(self, config, hidden_size: int, eps: float = 1e-5, **_):
            super().__init__(hidden_size, eps=eps, dtype=config.params_dtype)
            for p in self.parameters():
                p.sequence_parallel = config.sequence_parallel

    return SPLayerNorm


def build_llm(
    preset: ModelPreset, cfg, pgc, prec: Precision, seq_length: int, first: bool = True, last: bool = True
):
    """The LLM, or its pipeline stage: `first` holds the embedding, `last` the output layer and the loss;
    each stage builds num_layers / pp layers (megatron-core reads the stage from pgc.pp)."""
    from megatron.core.models.gpt.gpt_model import GPTModel

    ne = preset.llm.num_experts or None
    if prec.use_gpu:
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec

        spec = get_gpt_layer_with_transformer_engine_spec(num_experts=ne, moe_grouped_gemm=bool(ne))
    else:
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

        spec = get_gpt_layer_local_spec(num_experts=ne, moe_grouped_gemm=False)
        if cfg.sequence_parallel:
            from megatron.core.transformer.transformer_block import TransformerBlockSubmodules

            norm = _sp_norm_class()
            spec.submodules.input_layernorm = norm
            spec.submodules.pre_mlp_layernorm = norm
            local = cfg.num_layers // cfg.pipeline_model_parallel_size
            spec = TransformerBlockSubmodules(layer_specs=[spec] * local, layer_norm=norm)
    model = GPTModel(
        config=cfg,
        transformer_layer_spec=spec,
        vocab_size=preset.llm.vocab_size,
        max_sequence_length=seq_length,
        position_embedding_type="rope",
        share_embeddings_and_output_weights=False,  # untied: nothing to keep in sync across stages
        pre_process=first,
        post_process=last,
        pg_collection=pgc,
    )
    return model


def build_encoder(preset: ModelPreset, vit_cfg, proj_cfg, pgc, prec: Precision):
    return _encoder_class()(preset, vit_cfg, proj_cfg, pgc, prec)


def _encoder_layer_specs(prec: Precision):
    """(ViT layer spec, projector MLP submodules): Transformer Engine layers on GPU, local layers on CPU."""
    from megatron.core.transformer.mlp import MLPSubmodules

    if prec.use_gpu:
        from megatron.core.extensions.transformer_engine import TEColumnParallelLinear, TERowParallelLinear
        from megatron.core.models.vision.vit_layer_specs import get_vit_layer_with_transformer_engine_spec

        return (
            get_vit_layer_with_transformer_engine_spec(),
            MLPSubmodules(linear_fc1=TEColumnParallelLinear, linear_fc2=TERowParallelLinear),
        )
    from megatron.core.models.vision.vit_layer_specs import get_vit_layer_with_local_spec
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear

    return (
        get_vit_layer_with_local_spec(),
        MLPSubmodules(linear_fc1=ColumnParallelLinear, linear_fc2=RowParallelLinear),
    )


def _var_res_vit_class():
    import torch
    from megatron.core.models.vision.radio import RADIOViTModel

    class VarResViT(RADIOViTModel):
        """RADIO ViT without CPE: its position table is windowed to any image size (multiple of the patch),
        so images of different sizes give different token counts. RADIO checks a fixed seq_length; it is
        set per call from the input."""

        def forward(self, x, attention_mask=None):
            self.seq_length = (x.shape[-2] // self.patch_dim) * (x.shape[-1] // self.patch_dim)
            if attention_mask is None:
                # bidirectional attention; an explicit mask also avoids mcore's device="cuda" default mask
                attention_mask = torch.zeros(
                    1, 1, self.seq_length, self.seq_length, dtype=torch.bool, device=x.device
                )
            return super().forward(x, attention_mask=attention_mask)

    return VarResViT


def _encoder_class():
    import torch
    from megatron.core.models.vision.multimodal_projector import MultimodalProjector
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear
    from megatron.core.transformer.module import MegatronModule

    class Encoder(MegatronModule):
        """ViT + MLP projector: a list of images -> flat image embeddings [sum N_i, llm_hidden]."""

        def __init__(self, preset: ModelPreset, vit_cfg, proj_cfg, pgc, prec: Precision):
            super().__init__(config=vit_cfg)
            e = preset.encoder
            spec, proj_sub = _encoder_layer_specs(prec)
            self.patch = e.patch_size
            self.vit = _var_res_vit_class()(
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

    return Encoder


# ----------------------------------------------------------------------------------------------- init

_EXPERT_RE = re.compile(r"local_experts\.(\d+)\.")
_LAYER_RE = re.compile(r"(?<![a-z_])layers\.(\d+)\.")


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
    """Overwrite every parameter with its shard of a full tensor drawn from (seed, tag, canonical name).

    The canonical name replaces a local expert index by its global one (ep_rank * local + i) and a pipeline
    stage's local layer index by the global one (+ layer_offset); TP-split
    params (attribute tensor_model_parallel) are drawn at full size and sliced along partition_dim."""
    import torch

    for name, p in module.named_parameters():
        # a pipeline stage numbers its layers from 0: the canonical name has the global layer index
        cname = (
            _LAYER_RE.sub(lambda m: f"layers.{int(m.group(1)) + layer_offset}.", name)
            if layer_offset
            else name
        )
        # expert params: by name (with EP=1 mcore leaves their `allreduce` attribute True)
        is_expert = bool(_EXPERT_RE.search(name)) or not getattr(p, "allreduce", True)
        if is_expert and num_local_experts:
            cname = _EXPERT_RE.sub(
                lambda m: f"experts.{ep_rank * num_local_experts + int(m.group(1))}.", cname
            )
        rank, size = (etp_rank, etp_size) if is_expert else (tp_rank, tp_size)
        full = list(p.shape)
        dim = None
        if getattr(p, "tensor_model_parallel", False) and size > 1:
            dim = p.partition_dim
            if getattr(p, "partition_stride", 1) != 1:
                raise NotImplementedError(f"canonical init: strided TP partition for {name}")
            full[dim] *= size
        g = torch.Generator().manual_seed(zlib.crc32(f"{seed}:{tag}:{cname}".encode()) & 0x7FFFFFFF)
        leaf = cname.rsplit(".", 1)[-1]
        if "norm" in cname and "weight" in leaf:
            t = torch.ones(full)
        elif "bias" in leaf:
            t = torch.zeros(full)
        else:
            t = torch.randn(full, generator=g) * INIT_STD
        if dim is not None:
            n = p.shape[dim]
            t = t.narrow(dim, rank * n, n)
        with torch.no_grad():
            p.copy_(t.to(device=p.device, dtype=p.dtype))

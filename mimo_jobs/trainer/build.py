"""Builds everything a rank needs (groups, models, DDP, optimizers, data, bridge) into one TrainState.

TrainState holds model, optimizer, schedule and provider state in one object so the checkpoint issue can
save/restore it from a single place.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mimo_jobs.plan.presets import ModelPreset, get_preset
from mimo_jobs.plan.runspec import RunSpec
from mimo_jobs.plan.topology import Plan
from . import grids as G
from .models import Precision


@dataclass
class Module:
    name: str
    model: Any  # the DDP wrapper when trained, the bare module when frozen
    frozen: bool
    pgc: Any
    shape: G.ModuleShape
    ddp: Any = None

    @property
    def core(self):
        return self.ddp.module if self.ddp is not None else self.model


@dataclass
class TrainState:
    run: RunSpec
    plan: Plan
    preset: ModelPreset
    prec: Precision
    device: Any
    reference: bool
    role: G.RankRole
    enc_shape: G.ModuleShape
    llm_shape: G.ModuleShape
    encoder: Module | None
    language: Module | None
    optimizer: Any
    schedule: Any
    provider: Any
    bridge: Any
    image_token_id: int
    iteration: int = 0
    consumed_samples: int = 0
    extras: dict = field(default_factory=dict)

    @property
    def train_iters(self) -> int:
        t = self.run.trainer
        return t.train_iters if t.train_iters is not None else -(-t.train_samples // self.run.layout.gbs)


def _ddp(module, cfg, pgc, spec):
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

    dc = DistributedDataParallelConfig(grad_reduce_in_fp32=True, overlap_grad_reduce=False,
                                       use_distributed_optimizer=spec.use_distributed_optimizer)
    return DistributedDataParallel(cfg, dc, module, pg_collection=pgc)


def build_state(run: RunSpec, plan: Plan, reference: bool, timeout) -> TrainState:
    import torch
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    from . import models as M
    from .bridge import Bridge
    from .data import image_token_id, make_provider
    from .optimizer import MimoOptimizer, build_megatron_optimizer, skip_megatron_optimizer
    from .schedule import from_spec

    t = run.trainer
    preset = get_preset(t.model)
    use_gpu = torch.cuda.is_available() and run.cluster.accelerator == "gpu"
    prec = Precision(use_gpu=use_gpu, bf16=t.precision == "bf16")
    if prec.bf16 and not use_gpu:
        raise ValueError("trainer.precision=bf16 needs a GPU (accelerator=gpu); use fp32 on CPU")
    device = torch.device("cuda", torch.cuda.current_device()) if use_gpu else "cpu"
    if t.freeze.encoder and t.freeze.llm:
        raise ValueError("trainer.freeze: both encoder and llm are frozen; nothing to train")

    enc_s, llm_s = G.single_process_shapes(plan) if reference else G.module_shapes(plan)
    backend = "nccl" if use_gpu else "gloo"
    grids = G.build_grids(enc_s, llm_s, backend, timeout)
    role = grids.role

    # probe P6: DotProductAttention allocates from parallel_state's global memory buffer even with a
    # pg_collection; it is per process, so sharing it between the modules is fine.
    if parallel_state._GLOBAL_MEMORY_BUFFER is None:
        parallel_state._set_global_memory_buffer()
    own = grids.language if role.is_language else grids.encoder
    pg = own.pgc
    # The model-parallel RNG tracker must exist (attention wraps its dropout in tracker.fork()); explicit
    # tp/ep ranks keep it off parallel_state (probe P6).
    model_parallel_cuda_manual_seed(t.seed, tp_rank=pg.tp.rank(), ep_rank=pg.ep.rank(),
                                    etp_rank=pg.expt_tp.rank(), force_reset_rng=True)

    encoder = language = None
    opts: dict[str, Any] = {}
    if role.is_encoder:
        epg = grids.encoder.pgc
        vit_cfg, proj_cfg = M.encoder_configs(preset, enc_s.tp, prec)
        enc = M.build_encoder(preset, vit_cfg, proj_cfg, epg, prec)
        M.canonical_init_(enc, t.seed, "encoder", epg.tp.rank(), epg.tp.size())
        if use_gpu:
            enc.cuda()
        if t.freeze.encoder:
            for p in enc.parameters():
                p.requires_grad_(False)
            encoder = Module(G.ENCODER, enc, True, epg, enc_s)
        else:
            ddp = _ddp(enc, vit_cfg, epg, t)
            encoder = Module(G.ENCODER, ddp, False, epg, enc_s, ddp)
    if role.is_language:
        lpg = grids.language.pgc
        cfg = M.llm_config(preset, llm_s.tp, llm_s.ep, llm_s.etp, prec)
        gpt = M.build_llm(preset, cfg, lpg, prec, t.seq_length)
        # we build decoder inputs ourselves (image tokens scattered in) and scatter to SP afterwards
        gpt.embedding.word_embeddings.reduce_scatter_embeddings = False
        nl = (preset.llm.num_experts // llm_s.ep) if preset.llm.num_experts else 0
        M.canonical_init_(gpt, t.seed, "language", lpg.tp.rank(), lpg.tp.size(), lpg.expt_tp.rank(),
                          lpg.expt_tp.size(), lpg.ep.rank(), nl)
        if use_gpu:
            gpt.cuda()
        if t.freeze.llm:
            for p in gpt.parameters():
                p.requires_grad_(False)
            language = Module(G.LANGUAGE, gpt, True, lpg, llm_s)
        else:
            ddp = _ddp(gpt, cfg, lpg, t)
            language = Module(G.LANGUAGE, ddp, False, lpg, llm_s, ddp)

    # Optimizers, one slot per module in a fixed order. get_megatron_optimizer is a world collective, so
    # every rank takes part in both slots: the module's own ranks build it, all others (and the ranks of a
    # frozen module) contribute no param groups. Keys are thus never merged across modules.
    for name, mod in ((G.ENCODER, encoder), (G.LANGUAGE, language)):
        if mod is not None and not mod.frozen:
            opts[name] = build_megatron_optimizer(mod.ddp, mod.pgc, t, prec, t.lr.max)
        elif not reference:
            skip_megatron_optimizer()
    mimo_opt = MimoOptimizer([G.ENCODER, G.LANGUAGE], opts, t.optimizer.weight_decay, device)

    total_samples = (t.train_samples if t.train_samples is not None else t.train_iters * run.layout.gbs)
    schedule = from_spec(t.lr, total_samples)

    lay = plan.layout
    if reference:
        lanes = list(range(lay.llm_dp))
    elif role.is_language:
        lanes = [role.dp_rank]
    else:
        lanes = plan.lanes_of_encoder(role.dp_rank)
    provider = make_provider(run, plan, lanes, need_images=role.is_encoder, need_text=True)

    bridge = None
    if not reference:
        bridge = Bridge(plan, enc_s, llm_s, role, grids.encoder.pgc.tp if role.is_encoder else None,
                        grids.language.pgc.tp if role.is_language else None, preset.llm.hidden_size,
                        prec.dtype, device)
    return TrainState(run=run, plan=plan, preset=preset, prec=prec, device=device, reference=reference,
                      role=role, enc_shape=enc_s, llm_shape=llm_s, encoder=encoder, language=language,
                      optimizer=mimo_opt, schedule=schedule, provider=provider, bridge=bridge,
                      image_token_id=image_token_id(preset.llm.vocab_size))


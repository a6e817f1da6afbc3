"""Builds everything a rank needs (groups, models, DDP, optimizers, data, bridge) into one TrainState.

TrainState holds model, optimizer, schedule and provider state in one object, so checkpoints save and
restore it from a single place (checkpointer.modules_of).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from megatron.core import parallel_state
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

import mimo_jobs.trainer.model.models as M
import mimo_jobs.trainer.parallel.grids as G
from mimo_jobs.data.mock import make_provider
from mimo_jobs.model.arch import ModelArch
from mimo_jobs.model.resolve import arch_of
from mimo_jobs.study.lr_rules import run_samples
from mimo_jobs.study.runspec import RunSpec
from mimo_jobs.study.runtime_rules import freeze_problem, precision_problem
from mimo_jobs.study.spec import RecomputeSpec
from mimo_jobs.study.topology import RankLayout
from mimo_jobs.trainer.device import runs_on_cpu
from mimo_jobs.trainer.model.kernels import installed, kernels_for
from mimo_jobs.trainer.model.models import Precision
from mimo_jobs.trainer.model.optimizer import MimoOptimizer, build_megatron_optimizer, skip_megatron_optimizer
from mimo_jobs.trainer.model.schedule import from_spec
from mimo_jobs.trainer.observe.memory import SavedTensorMeter
from mimo_jobs.trainer.parallel.bridge import Bridge
from mimo_jobs.trainer.parallel.pipeline import stage_link
from mimo_jobs.trainer.weights import hf_load, megatron_load


@dataclass
class Module:
    name: str
    model: Any  # the DDP wrapper when trained, the bare module when frozen
    frozen: bool
    pgc: Any
    shape: G.ModuleShape
    ddp: Any = None
    # models.param_shards' arguments for this rank: how its tensors are cut from the full ones (the canonical
    # init and the checkpoints' resharding read the same)
    shard_args: dict = field(default_factory=dict)
    modality: str = ""  # an encoder module's: what it embeds (image, audio); the LLM's: ""
    label: str = ""  # an encoder module's name in the study (vision, audio): its phases' prefix

    @property
    def core(self):
        return self.ddp.module if self.ddp is not None else self.model


@dataclass
class TrainState:
    run: RunSpec
    plan: RankLayout
    preset: ModelArch  # the resolved model description (trainer.model)
    prec: Precision
    device: Any
    reference: bool
    role: G.RankRole
    # every encoder module's ranks (colocated and in the reference one shape for all) and its plan as it meets
    # the LLM (grids.module_plan), by the module's name, in the model's order
    module_shapes: dict[str, G.ModuleShape]
    module_plans: dict[str, RankLayout]
    llm_shape: G.ModuleShape
    encoders: list[Module]  # this rank's encoder modules, in the model's order (none off the encoder ranks)
    language: Module | None
    optimizer: Any
    schedule: Any
    provider: Any
    bridge: Any  # an encoder rank's bridge (of its module), or the one bridge of a one-encoder model
    iteration: int = 0
    consumed_samples: int = 0
    extras: dict = field(default_factory=dict)
    meter: Any = None  # memory.SavedTensorMeter: activations kept for backward
    link: Any = None  # pipeline.StageLink to the neighbouring LLM stages (llm.pp > 1)
    inflight_peak: int = 0  # most encoder microbatches whose backward was still to come
    # every bridge this rank talks over, in the model's order: an LLM rank one per encoder module, an encoder
    # rank its own module's (none colocated or in the reference)
    bridges: list = field(default_factory=list)

    def module_named(self, name: str) -> Module:
        """This rank's encoder module of that study name (KeyError: not built on this rank)."""
        for m in self.encoders:
            if m.label == name:
                return m
        raise KeyError(f"encoder module {name!r} is not on rank {self.role.rank}")

    def kind_of(self, name: str) -> str:
        """The input kind an encoder module consumes (its family's modality: image, audio)."""
        return self.preset.encoders[name].modality

    def lanes(self) -> list[int]:
        """The LLM DP lanes whose data this rank reads (rank_lanes)."""
        return rank_lanes(
            self.plan, self.role, self.reference, G.own_module(self.module_shapes, self.role.rank)
        )

    @property
    def modules(self) -> list[Module]:
        """Every module this rank runs: the encoders in order, then the LLM."""
        return [*self.encoders, *([self.language] if self.language is not None else [])]

    @property
    def train_iters(self) -> int:
        t = self.run.trainer
        return t.train_iters if t.train_iters is not None else -(-t.train_samples // self.run.layout.gbs)


def rank_lanes(plan: RankLayout, role: G.RankRole, reference: bool, module: str | None = None) -> list[int]:
    """The LLM DP lanes whose data this rank reads: the reference all of them, an LLM rank its own, an encoder
    replica the lanes it serves as its module (`module`, the model's first by default) meets the LLM."""
    if reference:
        return list(range(plan.layout.llm_dp))
    if role.is_language:
        return [role.dp_rank]
    name = module if module is not None else plan.layout.encoders[0].name
    return G.module_plan(plan, name).lanes_of_encoder(role.dp_rank)


def build_state(run: RunSpec, plan: RankLayout, reference: bool, timeout) -> TrainState:
    """Collective (process groups, optimizers): every rank calls it once, after init_process_group."""
    t = run.trainer
    preset = arch_of(t.model)
    prec, device = _precision_and_device(run)
    frozen = freeze_problem(t.freeze.every_encoder(t.model), t.freeze.llm)  # the preflight's rule
    if frozen is not None:
        raise ValueError(str(frozen))
    if reference:
        encs, llm_s = G.single_process_shapes(plan)
    else:
        encs, llm_s = G.encoder_shapes(plan), G.language_shape(plan)
    grids = G.build_grids(encs, llm_s, "nccl" if prec.use_gpu else "gloo", timeout)
    role = grids.role
    own = G.own_module(encs, role.rank)
    plans = G.module_plans(plan)
    _seed_megatron(grids, t.seed)
    # each encoder module on ranks of its own: an encoder rank builds its module alone
    only = own if len(set(encs.values())) > 1 else None
    encoders = (
        _build_encoders(preset, t, grids.encoders[own].pgc, encs[own], prec, only) if role.is_encoder else []
    )
    language = _build_language(preset, t, grids.language.pgc, llm_s, prec, role) if role.is_language else None
    slots = [G.encoder_module(n) for n in preset.encoders] or [G.ENCODER]
    optimizer = _build_optimizer(t, prec, device, slots, [*encoders, language], reference)
    total_samples = run_samples(t.train_iters, t.train_samples, run.layout.gbs)
    schedule = from_spec(t.lr, total_samples)
    provider = make_provider(
        run, plan, rank_lanes(plan, role, reference, own), need_images=role.is_encoder, need_text=True
    )
    bridges = []
    if not reference and not plan.layout.colocated:  # colocated: both modules on this rank, no bridge
        bridges = _bridges(plan, preset, encs, llm_s, grids, role, prec, device)
    params = [p for m in (*encoders, language) if m is not None for p in m.core.parameters()]
    meter = SavedTensorMeter(params)
    for m in (*encoders, language):
        if m is not None:  # each module's own activation peak (memory facts per module)
            meter.watch(m.name, m.core)
    return TrainState(
        meter=meter,
        link=_stage_link(run, preset, llm_s, role, prec, device, reference),
        run=run,
        plan=plan,
        preset=preset,
        prec=prec,
        device=device,
        reference=reference,
        role=role,
        module_shapes=encs,
        module_plans=plans,
        llm_shape=llm_s,
        encoders=encoders,
        language=language,
        optimizer=optimizer,
        schedule=schedule,
        provider=provider,
        bridge=next((b for b in bridges if b.enc.contains(role.rank)), bridges[0] if bridges else None),
        bridges=bridges,
    )


def _bridges(plan: RankLayout, preset: ModelArch, encs, llm_s, grids, role, prec, device) -> list:
    """One bridge per encoder module into the LLM's first stage, on the ranks that talk over it: the
    module's own and the LLM's."""
    out = []
    for name, shape in encs.items():  # the layout's order is the ranks'
        mine = role.is_encoder and shape.contains(role.rank)
        if not (mine or role.is_language):
            continue
        out.append(
            Bridge(
                G.module_plan(plan, name),
                shape,
                llm_s,
                role,
                grids.encoders[name].pgc.tp if mine else None,
                grids.language.pgc.tp if role.is_language else None,
                preset.llm.hidden_size,
                prec.dtype,
                device,
                module=name,
            )
        )
    return out


def _stage_link(
    run: RunSpec, preset: ModelArch, llm_s: G.ModuleShape, role: G.RankRole, prec, device, reference
):
    """The pipeline neighbours of an LLM rank when the LLM has several stages (None otherwise)."""
    if reference or not role.is_language or llm_s.pp == 1:
        return None
    lay = run.layout
    sp = llm_s.tp if (preset.llm.num_experts and llm_s.tp > 1) else 1  # sequence parallel: see models.py
    shape = (run.trainer.seq_length // sp, lay.mbs, preset.llm.hidden_size)
    return stage_link(llm_s, role, shape, prec.dtype, device)


def _precision_and_device(run: RunSpec):
    """(Precision, device): the GPU when there is one and the run asks for it, else the CPU (fp32 only);
    the layer backend and fused kernels by the device and what is installed (model/kernels.py)."""
    use_gpu = not runs_on_cpu(run.cluster.accelerator, torch.cuda.is_available())
    prec = Precision(
        use_gpu=use_gpu,
        bf16=run.trainer.precision == "bf16",
        kernels=kernels_for(use_gpu, installed(), run.trainer.attention),
    )
    # the preflight's rule by the accelerator the run names; here also a GPU run on a node without CUDA
    cpu = precision_problem(run.trainer.precision, "gpu" if use_gpu else "cpu")
    if cpu is not None:
        raise ValueError(str(cpu))
    device = torch.device("cuda", torch.cuda.current_device()) if use_gpu else "cpu"
    return prec, device


def _seed_megatron(grids: G.Grids, seed: int) -> None:
    """The per-process megatron state the modules need even though they get explicit process groups."""
    # DotProductAttention allocates from parallel_state's global memory buffer even with a pg_collection;
    # the buffer is per process, so sharing it between the modules is fine.
    if parallel_state._GLOBAL_MEMORY_BUFFER is None:
        parallel_state._set_global_memory_buffer()
    pg = (grids.language if grids.role.is_language else grids.own_encoder()).pgc
    # The model-parallel RNG tracker must exist (attention wraps its dropout in tracker.fork()); passing the
    # tp/ep ranks explicitly keeps it from reading them off parallel_state, which this trainer never sets up.
    model_parallel_cuda_manual_seed(
        seed, tp_rank=pg.tp.rank(), ep_rank=pg.ep.rank(), etp_rank=pg.expt_tp.rank(), force_reset_rng=True
    )


def ddp_config(spec) -> DistributedDataParallelConfig:
    """megatron-core DDP as a trainer section (spec.TrainerSpec) says: the gradient reduce dtype and the
    overlaps (step/dpsync.py runs them)."""
    return DistributedDataParallelConfig(
        grad_reduce_in_fp32=spec.grad_reduce_dtype == "fp32",
        overlap_grad_reduce=spec.overlap_grad_reduce,
        overlap_param_gather=spec.overlap_param_gather,
        # the iteration dispatches every parameter all-gather at its start (dpsync.start_param_gathers): the
        # forward pre-hooks only wait, and no rank dispatches one from a forward another rank may not run
        align_param_gather=spec.overlap_param_gather,
        use_distributed_optimizer=spec.use_distributed_optimizer,
    )


def _ddp(module, cfg, pgc, spec):
    return DistributedDataParallel(cfg, ddp_config(spec), module, pg_collection=pgc)


def _wrap(
    name: str, module, cfg, pgc, shape: G.ModuleShape, frozen: bool, spec, modality: str = ""
) -> Module:
    """A frozen module stays bare (no grads); a trained one is wrapped in megatron DDP."""
    if frozen:
        for p in module.parameters():
            p.requires_grad_(False)
        return Module(name, module, True, pgc, shape, modality=modality)
    ddp = _ddp(module, cfg, pgc, spec)
    return Module(name, ddp, False, pgc, shape, ddp, modality=modality)


def _build_encoders(
    preset: ModelArch, t, pgc, shape: G.ModuleShape, prec: Precision, only: str | None = None
) -> list[Module]:
    """Every encoder module of the model (or the one named `only`, on ranks of its own), in its order, each
    with its own projector into the LLM's width, on this rank's encoder grid."""
    out = []
    for name, e in preset.named_encoders:
        if only is not None and name != only:
            continue
        if e.modality == "audio":
            out.append(_build_audio(name, e, preset, t, pgc, shape, prec))
        else:
            one = preset if preset.single_vision else ModelArch(preset.name, encoder=e, llm=preset.llm)
            out.append(_build_encoder(name, one, t, pgc, shape, prec, preset))
    return out


def _build_encoder(
    name: str,
    preset: ModelArch,
    t,
    pgc,
    shape: G.ModuleShape,
    prec: Precision,
    whole: ModelArch | None = None,
) -> Module:
    """An image encoder (`preset` is the model with it as its one encoder, `whole` the model of every module,
    which trainer.init's module names are read against)."""
    vit_cfg, proj_cfg = M.encoder_configs(preset, shape.tp, prec, RecomputeSpec.of(t.recompute).encoder)
    enc = M.build_encoder(preset, vit_cfg, proj_cfg, pgc, prec)
    cut = {"tp_rank": pgc.tp.rank(), "tp_size": pgc.tp.size()}
    tag = G.encoder_module(name)
    M.canonical_init_(enc, t.seed, tag, **cut)
    # trainer.init.encoder / encoders.<name>, when it names HF weights
    hf_load.load_encoder(t.init, preset.encoder, enc, cut, whole or preset, name)
    if prec.use_gpu:
        enc.cuda()
    mod = _wrap(tag, enc, vit_cfg, pgc, shape, t.freeze.frozen(name), t, preset.encoder.modality)
    mod.shard_args, mod.label = cut, name
    return mod


def _build_audio(name: str, a, preset: ModelArch, t, pgc, shape: G.ModuleShape, prec: Precision) -> Module:
    """A Whisper-class audio encoder and its projector (audio_encoder.AudioTower)."""
    from mimo_jobs.trainer.model.audio_encoder import audio_config, build_audio_tower

    cfg = audio_config(a, shape.tp, prec, RecomputeSpec.of(t.recompute).encoder)
    proj_cfg = M.projector_config(preset.llm.hidden_size, shape.tp, prec)
    tower = build_audio_tower(a, cfg, proj_cfg, pgc, prec)
    cut = {"tp_rank": pgc.tp.rank(), "tp_size": pgc.tp.size()}
    tag = G.encoder_module(name)
    M.canonical_init_(tower, t.seed, tag, **cut)
    tower.encoder.reset_positions_()  # the frozen sinusoidal table, which the random init overwrote
    hf_load.load_audio(t.init, preset, name, tower.encoder, cut)  # trainer.init.encoders.<name>: HF weights
    if prec.use_gpu:
        tower.cuda()
    mod = _wrap(tag, tower, cfg, pgc, shape, t.freeze.frozen(name), t, "audio")
    mod.shard_args, mod.label = cut, name
    return mod


def _build_language(
    preset: ModelArch, t, pgc, shape: G.ModuleShape, prec: Precision, role: G.RankRole
) -> Module:
    cfg = M.llm_config(
        preset, shape.tp, shape.ep, shape.etp, prec, RecomputeSpec.of(t.recompute).llm, shape.pp
    )
    gpt = M.build_llm(
        preset, cfg, pgc, prec, t.seq_length, role.is_first_stage, role.is_last_stage, pgc.pp.rank()
    )
    per_stage = preset.llm.num_layers // shape.pp
    # we build decoder inputs ourselves (image tokens scattered in) and scatter to SP afterwards
    if role.is_first_stage:  # only the first pipeline stage has the embedding
        gpt.embedding.word_embeddings.reduce_scatter_embeddings = False
    nl = (preset.llm.num_experts // shape.ep) if preset.llm.num_experts else 0
    cut = {
        "tp_rank": pgc.tp.rank(),
        "tp_size": pgc.tp.size(),
        "etp_rank": pgc.expt_tp.rank(),
        "etp_size": pgc.expt_tp.size(),
        "ep_rank": pgc.ep.rank(),
        "num_local_experts": nl,
        "layer_offset": pgc.pp.rank() * per_stage,
    }
    M.canonical_init_(gpt, t.seed, "language", **cut)
    hf_load.load_llm(t.init, preset.llm, gpt, cut)  # trainer.init.llm, when it names HF weights
    megatron_load.load_llm(t.init, gpt, pgc, preset.llm.vocab_size)  # trainer.init.llm: {megatron: DIR}
    if prec.use_gpu:
        gpt.cuda()
    mod = _wrap(G.LANGUAGE, gpt, cfg, pgc, shape, t.freeze.llm, t)
    mod.shard_args = cut
    return mod


def _build_optimizer(t, prec: Precision, device, slots: list[str], modules: list, reference: bool):
    """The MimoOptimizer over one megatron optimizer slot per module, in a fixed order (`slots`: every
    encoder module's name, then the LLM's).

    get_megatron_optimizer is a world collective, so every rank takes part in every slot: the module's own
    ranks build it, all others (and the ranks of a frozen module) contribute no param groups. Keys are thus
    never merged across modules."""

    here = {m.name: m for m in modules if m is not None}
    opts: dict[str, Any] = {}
    for name in [*slots, G.LANGUAGE]:
        mod = here.get(name)
        if mod is not None and not mod.frozen:
            opts[name] = build_megatron_optimizer(mod.ddp, mod.pgc, t, prec, t.lr.max)
        elif not reference:
            skip_megatron_optimizer()
    return MimoOptimizer([*slots, G.LANGUAGE], opts, t.optimizer.weight_decay, device)

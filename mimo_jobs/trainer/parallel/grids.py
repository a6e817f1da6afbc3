"""Process groups of both modules, built on every rank in one fixed order, and this rank's role.

`new_subgroups_by_enumeration` (behind HyperCommGrid.create_pg) calls `new_group` for every subgroup on
every rank, so all ranks must create the same groups in the same order or the world deadlocks.
`build_grids` is therefore the only place that creates groups, and it creates all of them on every rank.

Rank layout (topology.py): encoder ranks [0, E), LLM ranks [E, world); several encoder modules each take
their own range of [0, E), in the model's order (topology.module_ranges); inside a module tp is the fastest
dimension, then pp, then dp. HyperCommGrid orders dims with the first name fastest, hence [tp, cp, pp, dp].
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch.distributed as dist
from megatron.core.hyper_comm_grid import HyperCommGrid
from megatron.core.process_groups_config import ProcessGroupCollection

from mimo_jobs.contract.modules import TRAINER_ENCODER, TRAINER_LANGUAGE, trainer_slot
from mimo_jobs.study.topology import RankLayout, module_ranges

ENCODER, LANGUAGE = TRAINER_ENCODER, TRAINER_LANGUAGE


def encoder_module(name: str) -> str:
    """The trainer's name of the encoder module a study names `name` (its checkpoint directory, optimizer
    slot and canonical-init tag): contract/modules.py holds the rule, both ways."""
    return trainer_slot(name)


@dataclass(frozen=True)
class ModuleShape:
    name: str  # ENCODER or LANGUAGE
    offset: int
    tp: int
    pp: int
    dp: int
    ep: int = 1
    etp: int = 1

    @property
    def size(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def edp(self) -> int:
        return self.tp * self.dp // (self.ep * self.etp)

    def contains(self, rank: int) -> bool:
        return self.offset <= rank < self.offset + self.size

    # Pure coordinate arithmetic (same convention as the grid): local = tp + tp*pp_rank + tp*pp*dp_rank.
    def coords(self, rank: int) -> tuple[int, int, int]:
        local = rank - self.offset
        return local % self.tp, (local // self.tp) % self.pp, local // (self.tp * self.pp)

    def rank_of(self, tp_rank: int, pp_rank: int, dp_rank: int) -> int:
        return self.offset + tp_rank + self.tp * (pp_rank + self.pp * dp_rank)

    def leader_of(self, dp_rank: int) -> int:
        """The replica's bridge leader: TP rank 0 of the boundary (only, PP=1) stage."""
        return self.rank_of(0, 0, dp_rank)


def language_shape(plan: RankLayout) -> ModuleShape:
    """The LLM's shape: after every encoder module's ranks, or on every rank colocated."""
    lay = plan.layout
    return ModuleShape(
        LANGUAGE,
        plan.llm_rank_start,
        lay.llm_tp,
        lay.llm_pp,
        lay.llm_dp,
        lay.llm_ep if lay.num_experts else 1,
        lay.llm_etp if lay.num_experts else 1,
    )


def encoder_shapes(plan: RankLayout) -> dict[str, ModuleShape]:
    """Every encoder module's shape by its name, in the model's order: each on its own ranks
    (topology.module_ranges). Colocated, every module takes the LLM's TP and DP on the same ranks, so every
    name maps to one shape (one grid serves them all)."""
    lay = plan.layout
    if lay.colocated or not lay.several:
        m = lay.encoders[0]
        one = ModuleShape(ENCODER, 0, m.tp, m.pp, m.dp, 1, m.tp)
        return {m.name: one for m in lay.encoders}
    return {r.name: ModuleShape(ENCODER, r.rank_start, r.tp, r.pp, r.dp, 1, r.tp) for r in module_ranges(lay)}


def own_module(shapes: dict[str, ModuleShape], rank: int) -> str:
    """The name of the encoder module whose ranks hold `rank` (the first module off every encoder's ranks)."""
    return next((n for n, s in shapes.items() if s.contains(rank)), next(iter(shapes)))


def module_plan(plan: RankLayout, name: str) -> RankLayout:
    """The plan as the encoder module `name` meets the LLM: its own sizes and fan (topology.module_ranges),
    so the bridge's segments and an encoder replica's lanes are that module's; its layout holds that module
    alone."""
    lay = plan.layout
    if not lay.several:
        return plan
    r = next(r for r in module_ranges(lay) if r.name == name)
    one = replace(lay, encoders=tuple(m for m in lay.encoders if m.name == name))
    return replace(
        plan,
        layout=one,
        fan=r.fan,
        lanes_per_encoder=r.lanes_per_encoder,
        encoders_per_lane=r.encoders_per_lane,
        samples_per_encoder_microbatch=r.samples_per_encoder_microbatch,
    )


def module_plans(plan: RankLayout) -> dict[str, RankLayout]:
    """Every encoder module's plan (module_plan) by its name, in the model's order."""
    return {m.name: module_plan(plan, m.name) for m in plan.layout.encoders}


def single_process_shapes(plan: RankLayout) -> tuple[dict[str, ModuleShape], ModuleShape]:
    """The reference: (every encoder module's shape by its name, the LLM's), all on rank 0, every parallel
    size 1 (one grid serves every encoder module)."""
    one = ModuleShape(ENCODER, 0, 1, 1, 1)
    return {m.name: one for m in plan.layout.encoders}, ModuleShape(LANGUAGE, 0, 1, 1, 1)


@dataclass(frozen=True)
class RankRole:
    """What this rank does: which module(s) it runs and where it sits inside them."""

    rank: int
    modules: tuple[str, ...]  # (ENCODER,), (LANGUAGE,) or both for the one-process reference
    tp_rank: int
    dp_rank: int
    is_first_stage: bool
    is_last_stage: bool
    is_leader: bool  # TP rank 0: talks over the bridge and broadcasts to its TP peers

    @property
    def is_encoder(self) -> bool:
        return ENCODER in self.modules

    @property
    def is_language(self) -> bool:
        return LANGUAGE in self.modules


def role_of(rank: int, enc: ModuleShape, llm: ModuleShape) -> RankRole:
    mods = tuple(m.name for m in (enc, llm) if m.contains(rank))
    if not mods:
        raise RuntimeError(
            f"rank {rank} is in no grid (encoder ranks [{enc.offset}, {enc.offset + enc.size}), "
            f"LLM ranks [{llm.offset}, {llm.offset + llm.size})): refusing a stub rank"
        )
    own = llm if LANGUAGE in mods else enc
    tp, pp, dp = own.coords(rank)
    return RankRole(rank, mods, tp, dp, pp == 0, pp == own.pp - 1, tp == 0)


@dataclass
class ModuleGroups:
    shape: ModuleShape
    pgc: Any  # megatron ProcessGroupCollection (None off the module's ranks)
    grid: Any
    expert_grid: Any


def _expert_dims(shape: ModuleShape) -> tuple[list[int], list[str]]:
    """The expert view over the module's ranks, as (sizes, names) fastest first. With one stage, the TP x DP
    ranks split into ETP x EP x expert-DP. With several, each stage's experts are split over its own ranks:
    pp stays where the dense grid has it (after TP), so EP and expert-DP factor DP alone, which needs
    ETP == TP (the topology's moe-pp rule)."""
    if shape.pp == 1:
        return [shape.etp, shape.ep, shape.pp, shape.edp], ["tp", "ep", "pp", "dp"]
    return [shape.etp, shape.pp, shape.ep, shape.edp], ["tp", "pp", "ep", "dp"]


# The fixed creation order of a module's groups: (ProcessGroupCollection field, grid, dims). Every rank
# creates every one of them, in this order, for both modules (create_pg returns None off the grid).
GROUPS = (
    ("tp", "dense", ["tp"]),
    ("cp", "dense", ["cp"]),
    ("pp", "dense", ["pp"]),
    ("dp", "dense", ["dp"]),
    ("tp_cp", "dense", ["tp", "cp"]),
    ("dp_cp", "dense", ["cp", "dp"]),
    ("mp", "dense", ["tp", "pp"]),
    ("tp_dp_cp", "dense", ["tp", "cp", "dp"]),
    # the optimizer's grad-norm group must be the whole module grid, not the dp group
    ("intra_dist_opt", "dense", ["tp", "cp", "pp", "dp"]),
    ("expt_tp", "expert", ["tp"]),
    ("ep", "expert", ["ep"]),
    ("expt_dp", "expert", ["dp"]),
    ("tp_ep", "expert", ["tp", "ep"]),
    ("tp_ep_pp", "expert", ["tp", "ep", "pp"]),
)


def _grids(shape: ModuleShape, backend: str | None) -> dict:

    dense = HyperCommGrid(
        [shape.tp, 1, shape.pp, shape.dp], ["tp", "cp", "pp", "dp"], rank_offset=shape.offset, backend=backend
    )
    return {
        "dense": dense,
        "expert": HyperCommGrid(*_expert_dims(shape), rank_offset=shape.offset, backend=backend),
    }


def group_enumeration(shape: ModuleShape, world: int) -> list[tuple[str, list[list[int]]]]:
    """The rank lists of every group the trainer creates for the module, in creation order, without a
    process group: HyperCommGrid.get_rank_enum is the enumeration its create_pg hands to torch (megatron-core
    reads the world size from WORLD_SIZE when torch.distributed is not initialised)."""
    import os

    saved = os.environ.get("WORLD_SIZE")
    os.environ["WORLD_SIZE"] = str(world)
    try:
        grids = _grids(shape, None)
    finally:
        if saved is None:
            del os.environ["WORLD_SIZE"]
        else:
            os.environ["WORLD_SIZE"] = saved
    return [(name, grids[grid].get_rank_enum(dims)) for name, grid, dims in GROUPS]


def _pgc(shape: ModuleShape, backend: str, timeout) -> ModuleGroups:

    grids = _grids(shape, backend)
    groups = {name: grids[grid].create_pg(dims, timeout=timeout) for name, grid, dims in GROUPS}
    g, eg = grids["dense"], grids["expert"]

    if not shape.contains(dist.get_rank()):
        return ModuleGroups(shape, None, g, eg)
    pgc = ProcessGroupCollection(**groups)
    # The embedding groups keep tied weights in sync across the first and last pipeline stages. Embeddings
    # here are untied and positions are rotary: with one stage the group is the (single-rank) pp group,
    # with several there is nothing to sync (None: megatron-core then skips the all-reduce).
    pgc.embd = pgc.pos_embd = pgc.pp if shape.pp == 1 else None
    return ModuleGroups(shape, pgc, g, eg)


@dataclass
class Grids:
    language: ModuleGroups
    role: RankRole
    # every encoder module's groups by its name, in the model's order (colocated and in the reference every
    # name maps to one set of groups)
    encoders: dict[str, ModuleGroups]

    def own_encoder(self) -> ModuleGroups:
        """The groups of the encoder module whose ranks hold this rank (the first off every encoder's ranks)."""
        return self.encoders[own_module({n: g.shape for n, g in self.encoders.items()}, self.role.rank)]


def build_grids(encs: dict[str, ModuleShape], llm: ModuleShape, backend: str, timeout) -> Grids:
    """Every encoder module's grid first (in the model's order; modules of one shape share one grid), then
    the language grid, on every rank. The bridges need no extra group: they use point-to-point messages on
    the world group between replica leaders (see bridge.py)."""
    rank = dist.get_rank()
    role = role_of(rank, encs[own_module(encs, rank)], llm)
    made: dict[ModuleShape, ModuleGroups] = {}
    for shape in encs.values():
        if shape not in made:
            made[shape] = _pgc(shape, backend, timeout)
    lm = _pgc(llm, backend, timeout)
    return Grids(lm, role, {n: made[s] for n, s in encs.items()})

"""Loading a checkpoint saved under one layout into another: TP, PP, EP, DP, the encoder/LLM split,
heterogeneous <-> colocated, the distributed optimizer on or off.

Every save records, per rank and module, how each parameter it holds is cut from the full (canonical)
tensor (`shard_table`: the canonical name of model/models.py's param_shards, the full shape, the split
dimension, the rank's index along it and the strided blocks of a gated MLP) and the optimizer state in model
space (state.optimizer_space: a flat range of the parameter and the optimizer's tensors for it). A rank of
the new layout computes the same description of what it holds, and for each of its parameters assembles the
full tensor from the source pieces that cover it (weights from the DP-rank-0 files, optimizer tensors from
every rank's part), then takes its own cut. Source files are memory-mapped, so a rank reads only the
storages it touches; the peak is about one full tensor.

What carries over: the iteration and consumed samples (the LR schedule is a function of consumed samples),
the optimizer's step count, Adam moments and fp32 main parameters, and the data position: each LLM DP lane's
reader state when the lanes are the same (llm.dp, mbs and gbs unchanged), otherwise the mock provider starts
every lane at the first sample after the consumed ones (its global batches do not depend on llm.dp); an
energon reader's state belongs to its lane and cannot be split or merged, so that is refused. RNG states are
not carried (they belong to ranks that no longer exist; the model draws no random numbers while training).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import mimo_jobs.trainer.checkpoint.state as S
from mimo_jobs.contract.manifest import CheckpointError, CheckpointInfo, CheckpointMismatch, rank_file
from mimo_jobs.model.cuts import strided_blocks
from mimo_jobs.model.hf_weights import canonical_alias
from mimo_jobs.trainer.checkpoint.as_data import NotData, load_part
from mimo_jobs.trainer.model.models import param_shards
from mimo_jobs.trainer.model.optimizer import leaf_optimizers

# the output table of a model with tied embeddings is the input table (a stage that holds only the output
# layer keeps its own copy of it)
_TIED = ("output_layer.weight", "embedding.word_embeddings.weight")
# tables whose rows are padded to a multiple that depends on TP (model/arch.py padded_vocab)
_VOCAB_TABLES = ("embedding.word_embeddings.weight", "output_layer.weight")


@dataclass(frozen=True)
class Cut:
    """How one rank's local tensor is cut from the full tensor (model/cuts.py's strided_blocks): along `dim`
    the full tensor is `parts` equal blocks, and rank `rank` of `size` holds its 1/size of each."""

    full: tuple[int, ...]
    dim: int | None
    rank: int
    size: int
    parts: int

    def blocks(self) -> list[tuple[int, int]]:
        """(start, length) along `dim` of the full tensor of each block this rank holds, in local order."""
        assert self.dim is not None
        return strided_blocks(self.full[self.dim], self.parts, self.rank, self.size)

    def take(self, full: torch.Tensor) -> torch.Tensor:
        if self.dim is None:
            return full
        return torch.cat([full.narrow(self.dim, s, n) for s, n in self.blocks()], self.dim)

    def put(self, full: torch.Tensor, local: torch.Tensor) -> None:
        if self.dim is None:
            full.copy_(local)
            return
        off = 0
        for s, n in self.blocks():
            full.narrow(self.dim, s, n).copy_(local.narrow(self.dim, off, n))
            off += n

    def local_shape(self) -> tuple[int, ...]:
        if self.dim is None:
            return self.full
        s = list(self.full)
        s[self.dim] //= self.size
        return tuple(s)


def shard_table(model, shard_args: dict) -> dict[str, tuple]:
    """{parameter name: (canonical name, full shape, dim, rank, size, parts)} of what this rank holds."""
    out = {}
    for name, p, sh in param_shards(model, **shard_args):
        full = list(p.shape)
        if sh.dim is not None:
            full[sh.dim] *= sh.size
        out[name] = (sh.cname, tuple(full), sh.dim, sh.rank, sh.size, sh.parts)
    return out


def _cut(row: tuple) -> Cut:
    _, full, dim, rank, size, parts = row
    return Cut(tuple(full), dim, rank, size, parts)


def _load(p: Path):
    # mmap: the tensors stay on disk until touched, so a rank reads only the storages it needs; as data only,
    # since the source may be someone else's run
    try:
        return load_part(p, mmap=True)
    except NotData as e:
        raise CheckpointError(str(e)) from None


@dataclass
class _Piece:
    rank: int  # source rank
    name: str  # the parameter's name on that rank
    cut: Cut


class SavedModule:
    """What the source checkpoint holds of one module: per canonical name, the pieces of every source
    rank."""

    def __init__(self, info: CheckpointInfo, module: str):
        self.info, self.module = info, module
        ranks = [int(r) for r, mods in (info.rank_modules or {}).items() if module in mods]
        if not ranks:
            raise CheckpointMismatch(f"{info.path}: no rank of the checkpoint holds the {module} module")
        self.parts: dict[int, dict] = {}
        self.pieces: dict[str, list[_Piece]] = {}
        for r in sorted(ranks):
            part = self._file(f"{module}/optim-{r:05d}.pt")
            if part.get("shards") is None:
                raise CheckpointMismatch(
                    f"{info.path / module}/optim-{r:05d}.pt: saved without the layout of its tensors "
                    "(a checkpoint written before resharding existed): load it with its own layout"
                )
            self.parts[r] = part
            for name, row in part["shards"].items():
                # canonical again: a table written before TE's fused norms had their local name
                self.pieces.setdefault(canonical_alias(row[0]), []).append(_Piece(r, name, _cut(row)))
        self._weights: dict[int, dict] = {}

    def _file(self, rel: str):
        p = self.info.path / rel
        want = self.info.files.get(rel)
        if want is None or not p.is_file():
            raise CheckpointError(f"{p}: missing (the checkpoint directory is damaged)")
        if p.stat().st_size != want:
            raise CheckpointError(f"{p}: {p.stat().st_size} bytes, the manifest says {want} (damaged)")
        return _load(p)

    def weights_of(self, r: int) -> dict:
        """Every weight source rank r wrote for this module (dense and expert files; {} if it wrote none)."""
        if r not in self._weights:
            d: dict = {}
            for kind in ("model", "experts"):
                rel = f"{self.module}/{kind}-{r:05d}.pt"
                if rel in self.info.files:
                    d.update(self._file(rel))
            self._weights[r] = d
        return self._weights[r]

    def pieces_of(self, cname: str) -> list[_Piece]:
        if cname in self.pieces:
            return self.pieces[cname]
        for a, b in (_TIED, _TIED[::-1]):
            if cname.endswith(a) and cname[: -len(a)] + b in self.pieces:
                return self.pieces[cname[: -len(a)] + b]
        raise CheckpointMismatch(
            f"{self.info.path}/{self.module}: the checkpoint has no tensor {cname} (another model?)"
        )

    def full(self, cname: str, key: str | None) -> torch.Tensor:
        """The full tensor `cname`: its weights (key None) or the optimizer tensor `key`, assembled from the
        source pieces; raises if they do not cover it."""
        pieces = self.pieces_of(cname)
        cut0 = pieces[0].cut
        out = torch.empty(cut0.full, dtype=torch.float32)
        done: set[int] = set()
        for pc in pieces:
            if pc.cut.full != cut0.full:
                raise CheckpointMismatch(
                    f"{self.info.path}/{self.module}: {cname} is {pc.cut.full} on rank {pc.rank}, "
                    f"{cut0.full} on rank {pieces[0].rank} (damaged checkpoint)"
                )
            if pc.cut.rank in done:
                continue
            local = self._local(pc, pieces, key)
            if local is not None:
                pc.cut.put(out, local.to(torch.float32))
                done.add(pc.cut.rank)
        need = {0} if cut0.dim is None else set(range(cut0.size))
        if not need <= done:
            what = "weights" if key is None else f"optimizer state {key}"
            raise CheckpointError(
                f"{self.info.path}/{self.module}: the {what} of {cname} are incomplete (shards "
                f"{sorted(need - done)} of {cut0.size} missing)"
            )
        return out

    def _local(self, pc: _Piece, pieces: list[_Piece], key: str | None) -> torch.Tensor | None:
        """The local tensor of the source shard `pc.cut.rank`: the weights a source rank wrote, or the
        optimizer ranges of all source ranks holding that shard (DP ranks each hold a range)."""
        shape = pc.cut.local_shape()
        if key is None:
            w = self.weights_of(pc.rank).get(pc.name)
            return None if w is None else w.reshape(shape)
        flat = torch.zeros(int(torch.Size(shape).numel()), dtype=torch.float32)
        covered = torch.zeros(flat.numel(), dtype=torch.bool)
        for q in pieces:
            if q.cut.rank != pc.cut.rank:
                continue
            rec = (self.parts[q.rank].get("space") or {}).get(q.name)
            if rec is None or key not in rec:
                continue
            a, b = rec["range"]
            flat[a:b] = rec[key].to(torch.float32)
            covered[a:b] = True
        if not bool(covered.all()):
            return None
        return flat.reshape(shape)

    def step(self) -> float | None:
        steps = {p.get("step") for p in self.parts.values() if p.get("space")}
        steps.discard(None)
        return max(steps) if steps else None

    def state_keys(self) -> list[str]:
        keys: set[str] = set()
        for p in self.parts.values():
            for rec in (p.get("space") or {}).values():
                keys |= {k for k in rec if k not in ("range", "param")}
        return sorted(keys)

    def has_main(self) -> bool:
        return any("param" in rec for p in self.parts.values() for rec in (p.get("space") or {}).values())


def _fit(full: torch.Tensor, want: tuple, cname: str, where: str, fill: torch.Tensor | None) -> torch.Tensor:
    """`full` as the shape this run wants: equal, or a vocabulary table whose padding rows differ (the rows
    both have are kept; the others come from `fill`, the run's own values, or zeros)."""
    if tuple(full.shape) == tuple(want):
        return full
    if cname.endswith(_VOCAB_TABLES) and tuple(full.shape[1:]) == tuple(want[1:]):
        out = torch.zeros(want) if fill is None else fill.clone()
        n = min(full.shape[0], want[0])
        out[:n] = full[:n]
        return out
    raise CheckpointMismatch(
        f"{where}: {cname} is {list(full.shape)} in the checkpoint, this run's model has {list(want)} "
        "(another model?)"
    )


def restore_module(info: CheckpointInfo, m, weights_only: bool) -> None:
    """Load module `m` (files.ModuleParts, with its shard_args) of this rank from `info`, whatever layout
    saved it: weights, and (unless weights_only) the optimizer state."""
    where = f"{info.path}/{m.name}"
    if m.shard_args is None:
        raise CheckpointError(f"{where}: this module does not say how its tensors are cut (shard_args)")
    src = SavedModule(info, m.name)
    mine = list(param_shards(m.model, **m.shard_args))
    by_name = {n: (p, sh) for n, p, sh in mine}
    cuts: dict[str, Cut] = {}
    with torch.no_grad():
        for name, p, sh in mine:
            full = list(p.shape)
            if sh.dim is not None:
                full[sh.dim] *= sh.size
            cut = Cut(tuple(full), sh.dim, sh.rank, sh.size, sh.parts)
            cuts[name] = cut
            w = _fit(src.full(sh.cname, None), cut.full, sh.cname, where, None)
            p.copy_(cut.take(w).to(device=p.device, dtype=p.dtype))
    if m.optimizer is None:
        return
    for o in leaf_optimizers(m.optimizer):
        # bf16: the optimizer's fp32 main copies were taken from the initial weights; refresh them (a
        # continuing load overwrites them again below with the checkpoint's own)
        if getattr(getattr(o, "config", None), "bf16", False) and o.get_parameters():
            o.reload_model_params()
    if weights_only:
        return
    step, keys = src.step(), src.state_keys()
    if step is None:
        raise CheckpointMismatch(
            f"{where}: the checkpoint has no optimizer state for the {m.name} module (frozen or not yet "
            "stepped when saved); start from it with trainer.init.weights_only: true"
        )
    views = S.init_optimizer_space(m.model, m.optimizer, keys, step)
    use_main = src.has_main()
    with torch.no_grad():
        for name, rec in views.items():
            _, sh = by_name[name]
            cut = cuts[name]
            a, b = rec["range"]
            for k in [*keys, "param"]:
                if k not in rec:
                    continue
                if k == "param" and not use_main:  # the source's main params were its weights
                    full = _fit(src.full(sh.cname, None), cut.full, sh.cname, where, None)
                else:
                    full = _fit(src.full(sh.cname, k), cut.full, sh.cname, where, None)
                rec[k].copy_(cut.take(full).reshape(-1)[a:b].to(rec[k].dtype))


# ---------------------------------------------------------------- data position


def data_state(info: CheckpointInfo, provider, gbs: int) -> dict | None:
    """The provider state that continues `info` on this rank's lanes (see the module doc); None when the
    provider starts afresh."""
    lanes = list(provider.lanes)
    states = []
    for r in sorted(int(x) for x in (info.rank_modules or {})):
        own = _load(info.path / rank_file(r))
        if own.get("provider") is not None:
            states.append(own["provider"])
    same = _same_lanes(info, provider, gbs)
    kind = states[0].get("kind") if states else None
    if same and kind == "mock":
        pos: dict[int, int] = {}
        for s in states:
            pos.update({int(k): int(v) for k, v in s["position"].items()})
        return {"kind": "mock", "position": {x: pos[x] for x in lanes}}
    if same and kind == "energon":
        merged = dict(states[0])
        merged["lanes"] = {}
        for s in states:
            merged["lanes"].update(s["lanes"])
        return merged
    if kind == "mock" or kind is None:
        # the mock provider's global batch `step` is samples [step * gbs, (step + 1) * gbs) in any layout
        if info.consumed_samples % gbs:
            raise CheckpointMismatch(
                f"{info.path}: {info.consumed_samples} samples consumed, not a whole number of this run's "
                f"global batches (gbs {gbs}); use a gbs that divides it, or trainer.init.weights_only: true"
            )
        step = info.consumed_samples // gbs
        return {"kind": "mock", "position": {x: step * provider.cfg.num_microbatches for x in lanes}}
    raise CheckpointMismatch(
        f"{info.path}: the data position of an {kind} dataset moves only between layouts with the same "
        f"llm.dp, mbs and gbs (saved with llm.dp={info.layout.get('llm_dp')}, mbs={info.layout.get('mbs')}, "
        f"gbs={info.layout.get('gbs')}); keep them, or start with trainer.init.weights_only: true"
    )


def load_provider_state(provider, state: dict, source: Path) -> None:
    """The provider continues from `state`, read from `source`; loader state that is not data (a crafted
    pickle) is refused naming the checkpoint it came from."""
    from mimo_jobs.data.loader_state import LoaderStateRefused

    try:
        provider.load_state_dict(state)
    except LoaderStateRefused as e:
        raise CheckpointError(f"{source}: {e}") from None


def _same_lanes(info: CheckpointInfo, provider, gbs: int) -> bool:
    cfg = provider.cfg
    lanes = getattr(cfg, "lanes", None)
    if lanes is None:
        lanes = getattr(cfg, "llm_dp", None)
    return (
        info.layout.get("llm_dp") == lanes
        and info.layout.get("mbs") == cfg.mbs
        and info.layout.get("gbs") == gbs
    )


def restore_rank(info: CheckpointInfo, modules: list, provider: Any, gbs: int, weights_only: bool):
    """This rank's state from `info` under this run's layout. Returns (iteration, consumed samples)."""
    for m in modules:
        restore_module(info, m, weights_only)
    if weights_only:
        return 0, 0
    if provider is not None:
        st = data_state(info, provider, gbs)
        if st is not None:
            load_provider_state(provider, st, info.path)
    return info.iteration, info.consumed_samples

"""Sharded, atomic checkpoints with exact resume: the collective `save` and `load` (format: manifest.py).

Every rank writes only its own part, nothing is gathered: per rank its RNG/data/counter state, per rank and
module its optimizer shard; dense weights come from DP rank 0 of each DP group, expert weights from
expert-DP rank 0 (what each part holds: checkpoint_state.py).

Atomic protocol of `save`:
  1. rank 0 creates iter_N.tmp/ (removing what a crashed save at N left); the world agrees it exists;
  2. every rank writes its files into iter_N.tmp/ and fsyncs them;
  3. the world gathers (files, error) of every rank: any error removes iter_N.tmp/ and raises on every rank;
  4. rank 0 writes run.yaml and manifest.json, renames iter_N.tmp -> iter_N, replaces `latest` and prunes
     to the last K complete checkpoints; the world agrees it did.
A crash anywhere before the `latest` replace leaves the previous checkpoint as `latest`; stale *.tmp
directories are removed by the next save.

Why not megatron dist_checkpointing: on CPU/gloo it needs one more CUDA shim (torch.cuda.synchronize), spawns
a multiprocessing manager per save (~20 s for a tiny model), and its common.pt is written by rank 0 only, so
the LLM ranks' non-tensor state (scheduler, RNG, data state) of a non-colocated layout is silently dropped.

Every optimizer part also records how the rank's tensors are cut from the full ones and the optimizer state
in model space (sharing storage with the optimizer state, so no extra bytes): a launch of the same layout
reads its own files (`load`), any other layout reassembles what it needs (`load_foreign`, reshard.py).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import mimo_jobs.trainer.checkpoint.reshard as R
import mimo_jobs.trainer.checkpoint.state as S
from mimo_jobs.contract.manifest import (
    FORMAT_VERSION,
    LATEST,
    MANIFEST,
    CheckpointError,
    CheckpointInfo,
    CheckpointMismatch,
    Provenance,
    check_compatible,
    iter_name,
    latest_checkpoint,
    list_checkpoints,
    manifest_doc,
    parse_iter_name,
    rank_file,
    read_manifest,
    resolve_source,
    same_layout,
    same_names,
)
from mimo_jobs.trainer.checkpoint.as_data import NotData, load_part

# Test hook (fault injection), see _maybe_crash.
CRASH_ENV = "MIMO_CKPT_CRASH"
CRASH_POINTS = ("rank_files", "before_rename", "before_latest")


@dataclass
class ModuleParts:
    """One module this rank owns (encoder or language): what goes into the checkpoint for it."""

    name: str
    model: Any  # nn.Module: the bare module (DDP's .module) whose state_dict is saved
    optimizer: Any = None  # megatron optimizer (possibly Chained) or None for a frozen module
    dp_group: Any = None  # dense params are replicated over this group (rank 0 of it writes them)
    expt_dp_group: Any = None  # expert params are replicated over this group (MoE)
    scheduler: Any = None  # anything with state_dict/load_state_dict (optional)
    frozen: bool = False
    # param_shards' arguments for this rank (build.Module.shard_args): how its tensors are cut from the full
    # ones. None: the checkpoint cannot be resharded (same-layout loads only)
    shard_args: dict | None = None


@dataclass
class Resumed:
    """What `load` restored (the trainer sets its counters from it)."""

    path: Path
    iteration: int
    consumed_samples: int
    extra: dict


# ---------------------------------------------------------------- files and world agreement


def _fsync_write(path: Path, obj) -> int:

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    return path.stat().st_size


def _fsync_text(path: Path, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(d: Path) -> None:
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _load_file(d: Path, rel: str, expected: dict):
    """torch.load of one part, after checking it is listed in the manifest with this size."""
    p = d / rel
    if rel not in expected:
        raise CheckpointMismatch(f"{p}: not part of this checkpoint (written by a different layout?)")
    if not p.is_file():
        raise CheckpointError(f"{p}: missing (the checkpoint directory is damaged)")
    if p.stat().st_size != expected[rel]:
        raise CheckpointError(f"{p}: {p.stat().st_size} bytes, the manifest says {expected[rel]} (damaged)")
    try:
        return load_part(p)  # as data only: a part may come from someone else's run
    except NotData as e:
        raise CheckpointError(str(e)) from None


def _remove_dir(d: Path) -> None:
    # rename first: a crash during rmtree must not leave a half-deleted directory under an iter_ name
    trash = d.with_name(f".deleting-{d.name}-{os.getpid()}")
    os.replace(d, trash)
    shutil.rmtree(trash, ignore_errors=True)


def _maybe_crash(point: str, iteration: int) -> None:
    """Test hook: MIMO_CKPT_CRASH="<point>[:<rank>[:<iteration>]]" kills the whole job (SIGKILL to this
    process group: torchrun and every rank, like `kill -9` of the job) when `rank` reaches `point` of the
    save of `iteration` (rank/iteration empty or '*' = any)."""
    v = os.environ.get(CRASH_ENV)
    if not v:
        return
    want, rank, it = (v.split(":") + ["", ""])[:3]

    if want == point and rank in ("", "*", str(dist.get_rank())) and it in ("", "*", str(iteration)):
        os.killpg(os.getpgrp(), signal.SIGKILL)


def _agree(ok: bool) -> bool:
    """True on every rank iff ok on every rank (MIN all-reduce over the world)."""
    dev = "cuda" if dist.get_backend() == "nccl" else "cpu"
    t = torch.tensor([1 if ok else 0], dtype=torch.int32, device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return bool(t.item())


def _group_rank(g) -> int:
    return 0 if g is None else g.rank()


def _group_source(g) -> int:
    """Global rank of the group's rank 0 (the one that wrote the replicated weights)."""
    return dist.get_rank() if g is None else dist.get_global_rank(g, 0)


# ---------------------------------------------------------------- save


def save(
    directory: str | Path,
    *,
    iteration: int,
    consumed_samples: int,
    modules: list[ModuleParts],
    provider: Any,
    provenance: Provenance,
    keep: int,
    run_doc: dict | None = None,
    extra: dict | None = None,
) -> Path:
    """Collective over the whole world: every rank calls it at the same iteration. Returns the final path.
    Raises CheckpointError on every rank if any rank failed to write (the previous checkpoint stays)."""
    root = Path(directory)
    rank = dist.get_rank()
    provenance = _named(provenance, modules)
    tmp, final = root / f"{iter_name(iteration)}.tmp", root / iter_name(iteration)
    t0 = time.perf_counter()
    _prepare_tmp(root, tmp)
    files, write_err = _write_rank_parts(tmp, rank, iteration, consumed_samples, modules, provider, extra)
    gathered = _gather_parts(tmp, final, files, write_err, modules)
    finish_err = None
    if rank == 0:
        try:
            _publish(
                root,
                tmp,
                final,
                iteration,
                keep,
                run_doc,
                manifest_doc(
                    iteration=iteration,
                    consumed_samples=consumed_samples,
                    provenance=provenance,
                    files={k: v for g in gathered for k, v in g["files"].items()},
                    rank_modules={str(r): g["modules"] for r, g in enumerate(gathered)},
                    save_s=time.perf_counter() - t0,
                ),
            )
        except Exception as e:  # noqa: BLE001 - raised on every rank just below
            finish_err = f"rank 0: finishing {final}: {type(e).__name__}: {e}"
    if not _agree(finish_err is None):
        raise CheckpointError(
            finish_err or f"checkpoint {final}: rank 0 failed to finish it (previous one kept)"
        )
    return final


def _prepare_tmp(root: Path, tmp: Path) -> None:
    """Collective: rank 0 creates an empty `tmp`; raises on every rank if it could not."""
    err = None
    if dist.get_rank() == 0:
        try:
            root.mkdir(parents=True, exist_ok=True)
            if tmp.exists():  # a previous attempt crashed mid-save at this iteration
                shutil.rmtree(tmp)
            tmp.mkdir()
        except OSError as e:
            err = f"cannot prepare {tmp}: {e}"
    if not _agree(err is None):
        raise CheckpointError(err or f"rank 0 could not prepare {tmp}")


def _write_rank_parts(
    tmp: Path,
    rank: int,
    iteration: int,
    consumed_samples: int,
    modules: list[ModuleParts],
    provider: Any,
    extra: dict | None,
) -> tuple[dict[str, int], str | None]:
    """This rank's files (relative path -> bytes) written into `tmp`, and the error that stopped it (or
    None)."""
    files: dict[str, int] = {}
    try:
        for m in modules:
            dense, experts = S.split_model_state(m.model)
            if _group_rank(m.dp_group) == 0:
                rel = f"{m.name}/model-{rank:05d}.pt"
                files[rel] = _fsync_write(tmp / rel, dense)
            if experts and _group_rank(m.expt_dp_group) == 0:
                rel = f"{m.name}/experts-{rank:05d}.pt"
                files[rel] = _fsync_write(tmp / rel, experts)
            space, step = (None, None) if m.optimizer is None else S.optimizer_space(m.model, m.optimizer)
            part = {
                "module": m.name,
                "frozen": m.frozen,
                "optimizer": None if m.optimizer is None else S.optimizer_state(m.optimizer),
                "scheduler": None if m.scheduler is None else m.scheduler.state_dict(),
                # for loading under another layout (reshard.py); the tensors are the optimizer's own, so
                # torch.save stores them once
                "shards": None if m.shard_args is None else R.shard_table(m.model, m.shard_args),
                "space": space,
                "step": step,
            }
            rel = f"{m.name}/optim-{rank:05d}.pt"
            files[rel] = _fsync_write(tmp / rel, part)
        own = {
            "format": FORMAT_VERSION,
            "rank": rank,
            "iteration": iteration,
            "consumed_samples": consumed_samples,
            "modules": [m.name for m in modules],
            "rng": S.rng_state(),
            "provider": None if provider is None else provider.state_dict(),
            "extra": extra or {},
        }
        files[rank_file(rank)] = _fsync_write(tmp / rank_file(rank), own)
        _maybe_crash("rank_files", iteration)
    except Exception as e:  # noqa: BLE001 - reported world-wide by _gather_parts, then raised everywhere
        return files, f"rank {rank}: writing {tmp}: {type(e).__name__}: {e}"
    return files, None


def _gather_parts(
    tmp: Path, final: Path, files: dict[str, int], err: str | None, modules: list[ModuleParts]
) -> list[dict]:
    """Collective: every rank's {"files", "err", "modules"}, in rank order. If any rank failed, rank 0 removes
    `tmp` and every rank raises."""
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, {"files": files, "err": err, "modules": [m.name for m in modules]})
    errs = [g["err"] for g in gathered if g["err"]]
    if errs:
        if dist.get_rank() == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        dist.barrier()
        raise CheckpointError(f"checkpoint {final} not written (previous one kept): " + "; ".join(errs))
    return gathered


def _publish(
    root: Path, tmp: Path, final: Path, iteration: int, keep: int, run_doc: dict | None, manifest: dict
) -> None:
    """Rank 0 only: complete `tmp`, rename it to `final`, point `latest` at it, prune old checkpoints."""
    import yaml

    if run_doc is not None:
        _fsync_text(tmp / "run.yaml", yaml.safe_dump(run_doc, sort_keys=False))
    for sub in [tmp, *[p for p in tmp.iterdir() if p.is_dir()]]:
        _fsync_dir(sub)
    _fsync_text(tmp / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True))
    _fsync_dir(tmp)
    _maybe_crash("before_rename", iteration)
    if final.exists():  # complete but never `latest` (crash after rename): this save replaces it
        _remove_dir(final)
    os.replace(tmp, final)
    _fsync_dir(root)
    _maybe_crash("before_latest", iteration)
    _fsync_text(root / f"{LATEST}.tmp", final.name + "\n")
    os.replace(root / f"{LATEST}.tmp", root / LATEST)
    _fsync_dir(root)
    prune(root, keep)


def prune(directory: str | Path, keep: int) -> list[Path]:
    """Delete all but the `keep` newest complete checkpoints (never the one `latest` names), and leftovers
    of crashed saves/deletes. Returns what was removed."""
    root = Path(directory)
    removed = []
    cur = latest_checkpoint(root)
    complete = list_checkpoints(root)
    doomed = complete[:-keep] if keep > 0 else complete
    for c in doomed:
        if cur is not None and c.path == cur.path:
            continue
        _remove_dir(c.path)
        removed.append(c.path)
    for p in root.iterdir():
        if not p.is_dir():
            continue
        tmp_of = parse_iter_name(p.name[:-4]) if p.name.endswith(".tmp") else None
        if p.name.startswith(".deleting-"):
            shutil.rmtree(p, ignore_errors=True)
        elif tmp_of is not None and cur is not None and tmp_of <= cur.iteration:
            shutil.rmtree(p, ignore_errors=True)  # a crashed save older than the current checkpoint
            removed.append(p)
    return removed


# ---------------------------------------------------------------- load


def _named(provenance: Provenance, modules: list[ModuleParts]) -> Provenance:
    """`provenance` with the naming of this rank's layers (models.layer_naming)."""
    from mimo_jobs.trainer.model.models import LOCAL_NAMES, TE_NAMES, layer_naming

    names = {layer_naming(m.model) for m in modules}
    return replace(provenance, layers=TE_NAMES if TE_NAMES in names else LOCAL_NAMES)


def load(
    directory: str | Path,
    *,
    modules: list[ModuleParts],
    provider: Any,
    provenance: Provenance,
    path: str | Path | None = None,
) -> Resumed | None:
    """Collective: restore this rank's part of `latest` (or `path`). None when there is no checkpoint yet.
    Refuses (CheckpointMismatch on every rank) a checkpoint of another run or layout."""
    info = _agreed_checkpoint(Path(directory), path)
    if info is None:
        return None
    problems = check_compatible(info, provenance)
    if problems:
        raise CheckpointMismatch(f"refusing checkpoint {info.path}: " + "; ".join(problems))
    rank = dist.get_rank()
    resumed, err = None, None
    err_cls: type[CheckpointError] = CheckpointError
    try:
        resumed = _restore_rank(info, rank, modules, provider, same_names(info, _named(provenance, modules)))
    except CheckpointError as e:
        err, err_cls = str(e), type(e)
    except Exception as e:  # noqa: BLE001
        err = f"rank {rank}: loading {info.path}: {type(e).__name__}: {e}"
    if not _agree(err is None):
        # the state of this process is now partly restored: the caller must not train on
        raise err_cls(err or f"loading {info.path} failed on another rank (see its log)")
    return resumed


def load_foreign(
    source: str | Path,
    *,
    modules: list[ModuleParts],
    provider: Any,
    provenance: Provenance,
    gbs: int,
    weights_only: bool = False,
) -> Resumed:
    """Collective: start this run from `source`, a checkpoint of any run and layout (a checkpoints directory:
    its latest; or one iter_N). The same layout and world read their own files (RNG included); any other
    layout is resharded. weights_only: the weights only; iteration 0, fresh optimizer and data position."""
    info = _agreed_checkpoint(Path(source), None, resolve=True)
    assert info is not None  # resolve_source raises when there is none
    rank = dist.get_rank()
    resumed, err = None, None
    err_cls: type[CheckpointError] = CheckpointError
    try:
        if same_layout(info, provenance) and not weights_only:
            named = same_names(info, _named(provenance, modules))
            resumed = _restore_rank(info, rank, modules, provider, named)
        else:
            it, consumed = R.restore_rank(info, modules, provider, gbs, weights_only)
            resumed = Resumed(path=info.path, iteration=it, consumed_samples=consumed, extra={})
    except CheckpointError as e:
        err, err_cls = str(e), type(e)
    except Exception as e:  # noqa: BLE001
        err = f"rank {rank}: loading {info.path}: {type(e).__name__}: {e}"
    errs: list = [None] * dist.get_world_size()
    dist.all_gather_object(errs, (err, err_cls.__name__))
    bad = [(e, c) for e, c in errs if e]
    if bad:
        # the state of this process is now partly restored: the caller must not train on
        cls = CheckpointMismatch if bad[0][1] == "CheckpointMismatch" else CheckpointError
        raise cls(bad[0][0])
    return resumed


def _agreed_checkpoint(root: Path, path: str | Path | None, resolve: bool = False) -> CheckpointInfo | None:
    """Collective: the checkpoint to load (`path`, else `latest` in `root`; None if there is none; resolve:
    what resolve_source says `root` names), checked to be the same on every rank (every rank reads the same
    marker/manifest; agree anyway, so that no rank trains from another state)."""
    err: str | None = None
    info = None
    try:
        if resolve:
            info = resolve_source(root)
        else:
            info = read_manifest(Path(path)) if path is not None else latest_checkpoint(root)
    except CheckpointError as e:
        err = str(e)
    seen: list = [None] * dist.get_world_size()
    dist.all_gather_object(seen, (None if info is None else str(info.path), err))
    errs = sorted({e for _, e in seen if e})
    if errs:
        raise CheckpointError("; ".join(errs))
    if len({p for p, _ in seen}) != 1:
        raise CheckpointError(
            f"ranks see different checkpoints in {root}: "
            f"{sorted({str(p) for p, _ in seen})} "
            "(is trainer.checkpoint_dir on a filesystem all nodes share?)"
        )
    return info


def _restore_rank(
    info: CheckpointInfo, rank: int, modules: list[ModuleParts], provider: Any, same_names: bool = True
) -> Resumed:
    """This rank's part of `info` (same layout): module weights, optimizer and scheduler state, data provider,
    RNG. Layers named otherwise than the writer's (Transformer Engine against local) take their weights and
    optimizer state by canonical name, as a resharded load does (state_dict keys and the optimizer's
    parameter order differ between the two)."""
    d, expected = info.path, info.files
    own = _load_file(d, rank_file(rank), expected)
    if own["modules"] != [m.name for m in modules]:
        raise CheckpointMismatch(
            f"{d / rank_file(rank)}: rank {rank} held modules {own['modules']}, "
            f"now {[m.name for m in modules]}"
        )
    for m in modules:
        if same_names:
            _restore_module(d, rank, m, expected)
        else:
            R.restore_module(info, m, weights_only=False)
            part = _load_file(d, f"{m.name}/optim-{rank:05d}.pt", expected) if m.scheduler else None
            if part is not None and part["scheduler"] is not None:
                m.scheduler.load_state_dict(part["scheduler"])
    if provider is not None:
        if own["provider"] is None:
            raise CheckpointMismatch(f"{d / rank_file(rank)}: no data-provider state saved")
        R.load_provider_state(provider, own["provider"], d / rank_file(rank))
    S.set_rng_state(own["rng"])
    return Resumed(
        path=d,
        iteration=int(own["iteration"]),
        consumed_samples=int(own["consumed_samples"]),
        extra=own.get("extra") or {},
    )


def _restore_module(d: Path, rank: int, m: ModuleParts, expected: dict) -> None:
    state = _load_file(d, f"{m.name}/model-{_group_source(m.dp_group):05d}.pt", expected)
    _, experts_now = S.split_model_state(m.model)
    if experts_now:
        state.update(_load_file(d, f"{m.name}/experts-{_group_source(m.expt_dp_group):05d}.pt", expected))
    S.load_model_state(m.model, state, f"{d}/{m.name}")
    rel = f"{m.name}/optim-{rank:05d}.pt"
    part = _load_file(d, rel, expected)
    if (part["optimizer"] is None) != (m.optimizer is None):
        raise CheckpointMismatch(
            f"{d}/{m.name}: saved {'without' if part['optimizer'] is None else 'with'}"
            f" an optimizer (frozen={part['frozen']}), this run has frozen={m.frozen}"
        )
    if m.optimizer is not None:
        S.load_optimizer_state(m.optimizer, part["optimizer"], f"{d}/{rel}")
    if m.scheduler is not None and part["scheduler"] is not None:
        m.scheduler.load_state_dict(part["scheduler"])

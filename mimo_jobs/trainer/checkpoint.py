"""Sharded, atomic checkpoints with exact resume (issue 7).

Format (one directory per checkpoint, every rank writes only its own part, nothing is gathered):

  <checkpoint_dir>/
    latest                      text: "iter_0000012" (replaced atomically: write latest.tmp, os.replace)
    iter_0000012/
      manifest.json             provenance + the list of files (written last, by rank 0, before the rename)
      run.yaml                  the resolved run config (run.yaml document) this checkpoint was taken with
      rank/rank-00003.pt        per rank: RNG states (python, numpy, torch, cuda, megatron tracker),
                                data-provider state of its lanes, iteration, consumed samples, extras
      <module>/optim-00003.pt   per rank and module: optimizer (the distributed optimizer's own shard, via
                                megatron's "dp_reshardable" parameter state: no gather) + scheduler state
      <module>/model-00002.pt   dense weights of one TP/EP shard, written by DP rank 0 of each DP group only
      <module>/experts-00002.pt expert weights, written by expert-DP rank 0 only (MoE)

Atomic protocol: every rank writes into iter_N.tmp/ and fsyncs; the world agrees on success (all-reduce);
rank 0 writes manifest.json, renames iter_N.tmp -> iter_N, then replaces `latest`; a final barrier ends the
save. A crash anywhere before the `latest` replace leaves the previous checkpoint as `latest`; stale
*.tmp directories are removed by the next save. The last K complete checkpoints are kept.

Why not megatron dist_checkpointing (probed, see the closing report): on CPU/gloo it needs one more CUDA
shim (torch.cuda.synchronize), spawns a multiprocessing manager per save (~20 s for a tiny model), and its
common.pt is written by rank 0 only, so the LLM ranks' non-tensor state (scheduler, RNG, data state) of a
non-colocated layout is silently dropped. This format is same-layout only: loading under a different
TP/DP/EP layout is refused (no resharding).

torch/megatron are imported inside functions only: `mimo-jobs status` lists checkpoints via
`list_checkpoints`/`latest_checkpoint` without a GPU stack.
"""

from __future__ import annotations

from mimo_jobs.contract import REQUEUE_LOG_LINE
from mimo_jobs.errors import MimoJobsError

import json
import os
import re
import shutil
import signal
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

FORMAT_VERSION = 1
LATEST = "latest"
_ITER_RE = re.compile(r"^iter_(\d{7,})$")
# Layout fields that must match for a checkpoint to load (same-layout format: no resharding).
LAYOUT_KEYS = ("nodes", "gpus_per_node", "enc_tp", "enc_pp", "enc_dp", "llm_tp", "llm_pp", "llm_dp", "llm_ep",
               "llm_etp", "llm_cp", "num_experts", "gbs", "mbs")
# Test hook (fault injection), see _maybe_crash.
CRASH_ENV = "MIMO_CKPT_CRASH"
CRASH_POINTS = ("rank_files", "before_rename", "before_latest")


class CheckpointError(MimoJobsError, RuntimeError):
    """A checkpoint cannot be written or read (names the directory/file and what is wrong)."""


class CheckpointMismatch(CheckpointError):
    """The checkpoint belongs to another run or another layout: refused."""


def iter_name(iteration: int) -> str:
    return f"iter_{iteration:07d}"


@dataclass(frozen=True)
class Provenance:
    """Who wrote a checkpoint. run_id + layout decide whether another launch may load it."""

    run_id: str
    study: str
    run_name: str
    layout: dict  # asdict(topology.Layout)
    world: int
    git_sha: str | None = None
    job_id: str | None = None
    attempt: int = 0


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


@dataclass
class CheckpointInfo:
    """A complete checkpoint on disk (read from its manifest; no torch needed)."""

    path: Path
    iteration: int
    consumed_samples: int
    run_id: str
    study: str
    run_name: str
    git_sha: str | None
    layout: dict
    world: int
    time: str
    job_id: str | None = None
    attempt: int = 0
    bytes: int = 0
    files: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["path"] = str(self.path)
        return d


@dataclass
class Resumed:
    """What `load` restored (the trainer sets its counters from it)."""

    path: Path
    iteration: int
    consumed_samples: int
    extra: dict


# ---------------------------------------------------------------- discovery (pure file I/O, no torch)


def _read_manifest(d: Path) -> CheckpointInfo:
    try:
        m = json.loads((d / "manifest.json").read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{d}: no manifest.json (not a complete checkpoint)") from None
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{d}/manifest.json: unreadable: {e}") from None
    if m.get("format") != FORMAT_VERSION:
        raise CheckpointError(f"{d}/manifest.json: format {m.get('format')!r}, this mimo-jobs reads "
                              f"format {FORMAT_VERSION}")
    p = m["provenance"]
    return CheckpointInfo(path=d, iteration=int(m["iteration"]), consumed_samples=int(m["consumed_samples"]),
                          run_id=p["run_id"], study=p["study"], run_name=p["run_name"], git_sha=p.get("git_sha"),
                          layout=p["layout"], world=int(p["world"]), time=m.get("time", ""),
                          job_id=p.get("job_id"), attempt=int(p.get("attempt", 0)),
                          bytes=int(m.get("bytes", 0)), files=m.get("files", {}))


def list_checkpoints(directory: str | Path) -> list[CheckpointInfo]:
    """Complete checkpoints (with a manifest), oldest first. Temporary/partial directories are ignored."""
    d = Path(directory)
    if not d.is_dir():
        return []
    out = []
    for c in d.iterdir():
        if c.is_dir() and _ITER_RE.match(c.name) and (c / "manifest.json").is_file():
            try:
                out.append(_read_manifest(c))
            except CheckpointError:
                continue
    return sorted(out, key=lambda i: i.iteration)


def latest_checkpoint(directory: str | Path) -> CheckpointInfo | None:
    """The checkpoint `latest` names; if the marker is missing or names nothing complete, the newest complete
    checkpoint (a crash between the rename and the marker update leaves exactly that state)."""
    d = Path(directory)
    marker = d / LATEST
    if marker.is_file():
        name = marker.read_text().strip()
        if _ITER_RE.match(name) and (d / name / "manifest.json").is_file():
            return _read_manifest(d / name)
    all_ = list_checkpoints(d)
    return all_[-1] if all_ else None


def check_compatible(info: CheckpointInfo, prov: Provenance) -> list[str]:
    """Why `prov` (this launch) may not load `info` (empty = compatible)."""
    problems = []
    if info.run_id != prov.run_id:
        problems.append(f"it belongs to run {info.run_id} ({info.study}/{info.run_name}), this is run "
                        f"{prov.run_id} ({prov.study}/{prov.run_name}); the run id hashes the resolved study "
                        "config, so a changed config is a new run: give it its own trainer.checkpoint_dir (or move "
                        "the old checkpoints away)")
    diff = [k for k in LAYOUT_KEYS if info.layout.get(k) != prov.layout.get(k)]
    if diff:
        problems.append("it was saved with a different layout (" + ", ".join(
            f"{k}={info.layout.get(k)} vs now {prov.layout.get(k)}" for k in diff)
            + "); resharding is not supported: resume with the checkpoint's layout")
    if info.world != prov.world and not diff:
        problems.append(f"it was saved by {info.world} ranks, this launch has {prov.world}")
    return problems


# ---------------------------------------------------------------- state pieces (torch inside)


def _rng_state() -> dict:
    import random

    import numpy as np
    import torch
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    st = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
          "tracker": {k: v.clone() for k, v in get_cuda_rng_tracker().get_states().items()}}
    if torch.cuda.is_available():
        st["cuda"] = torch.cuda.get_rng_state()
    return st


def _set_rng_state(st: dict) -> None:
    import random

    import numpy as np
    import torch
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    random.setstate(st["python"])
    np.random.set_state(st["numpy"])
    torch.set_rng_state(st["torch"])
    if "cuda" in st and torch.cuda.is_available():
        torch.cuda.set_rng_state(st["cuda"])
    get_cuda_rng_tracker().set_states({k: v.clone() for k, v in st["tracker"].items()})


def _leaves(opt) -> list:
    return list(getattr(opt, "chained_optimizers", [opt]))


def _is_distopt(o) -> bool:
    return hasattr(o, "get_parameter_state_dp_reshardable")


def _optimizer_state(opt) -> list[dict]:
    out = []
    for o in _leaves(opt):
        if not o.get_parameters():  # a rank holding no params of this group (e.g. empty expert optimizer)
            out.append({"empty": True})
            continue
        d = {"common": o.state_dict()}
        if _is_distopt(o):
            ps = o.get_parameter_state_dp_reshardable()
            _mark_no_padding(ps)
            d["param_state"] = ps
        out.append(d)
    return out


def _mark_no_padding(ps: dict) -> None:
    # load_parameter_state_from_dp_reshardable filters on a 'padding' flag that only the dist-ckpt path sets
    for k, v in ps.items():
        if isinstance(k, int):
            for buckets in v.values():
                for bucket in buckets:
                    for elem in bucket:
                        elem.setdefault("padding", False)


def _load_optimizer_state(opt, states: list[dict], where: str) -> None:
    import torch

    with torch.no_grad():  # fp32 distopt main params are views of params that require grad
        _load_optimizer_state_(opt, states, where)


def _load_optimizer_state_(opt, states: list[dict], where: str) -> None:
    leaves = _leaves(opt)
    if len(leaves) != len(states):
        raise CheckpointMismatch(f"{where}: {len(states)} optimizer parts saved, this run builds {len(leaves)}")
    for o, s in zip(leaves, states):
        if s.get("empty"):
            continue
        if _is_distopt(o) != ("param_state" in s):
            raise CheckpointMismatch(f"{where}: saved with use_distributed_optimizer="
                                     f"{'param_state' in s}, this run has {_is_distopt(o)}")
        o.load_state_dict(s["common"])  # distopt: allocates dummy state tensors, filled just below
        if "param_state" in s:
            o.load_parameter_state_from_dp_reshardable(s["param_state"])
        _unshare_steps(o)


def _unshare_steps(o) -> None:
    """megatron 0.16.1's DistributedOptimizer.load_state_dict (torch-Adam path, no TE/Apex) puts ONE `step`
    tensor into every parameter's state; torch Adam increments it in place per parameter, so after one step
    the bias correction is wrong (seen as a bitwise mismatch from the 2nd resumed step on). Give each
    parameter its own copy."""
    inner = getattr(o, "optimizer", None)
    for st in getattr(inner, "state", {}).values():
        if isinstance(st, dict) and "step" in st and hasattr(st["step"], "clone"):
            st["step"] = st["step"].clone()


def _split_model_state(model) -> tuple[dict, dict]:
    """(dense, expert) parts of the module's state_dict; expert params are the ones megatron marks
    allreduce=False (replicated over the expert-DP group instead of the DP group)."""
    sd = model.state_dict()
    expert_names = {n for n, p in model.named_parameters() if getattr(p, "allreduce", True) is False}
    dense = {k: v for k, v in sd.items() if k not in expert_names}
    experts = {k: v for k, v in sd.items() if k in expert_names}
    return dense, experts


def _group_rank(g) -> int:
    return 0 if g is None else g.rank()


def _group_source(g) -> int:
    """Global rank of the group's rank 0 (the one that wrote the replicated weights)."""
    import torch.distributed as dist

    return dist.get_rank() if g is None else dist.get_global_rank(g, 0)


def _fsync_write(path: Path, obj) -> int:
    import torch

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


def _maybe_crash(point: str, iteration: int) -> None:
    """Test hook: MIMO_CKPT_CRASH="<point>[:<rank>[:<iteration>]]" kills the whole job (SIGKILL to this
    process group: torchrun and every rank, like `kill -9` of the job) when `rank` reaches `point` of the
    save of `iteration` (rank/iteration empty or '*' = any)."""
    v = os.environ.get(CRASH_ENV)
    if not v:
        return
    want, rank, it = (v.split(":") + ["", ""])[:3]
    import torch.distributed as dist

    if want == point and rank in ("", "*", str(dist.get_rank())) and it in ("", "*", str(iteration)):
        os.killpg(os.getpgrp(), signal.SIGKILL)


def _agree(ok: bool) -> bool:
    """True on every rank iff ok on every rank (MIN all-reduce over the world)."""
    import torch
    import torch.distributed as dist

    dev = "cuda" if dist.get_backend() == "nccl" else "cpu"
    t = torch.tensor([1 if ok else 0], dtype=torch.int32, device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return bool(t.item())


def _rank_file(r: int) -> str:
    return f"rank/rank-{r:05d}.pt"


# ---------------------------------------------------------------- save


def save(directory: str | Path, *, iteration: int, consumed_samples: int, modules: list[ModuleParts],
         provider: Any, provenance: Provenance, keep: int, run_doc: dict | None = None,
         extra: dict | None = None) -> Path:
    """Collective over the whole world: every rank calls it at the same iteration. Returns the final path.
    Raises CheckpointError on every rank if any rank failed to write (the previous checkpoint stays)."""
    import torch.distributed as dist
    import yaml

    root = Path(directory)
    rank, world = dist.get_rank(), dist.get_world_size()
    name = iter_name(iteration)
    tmp, final = root / f"{name}.tmp", root / name
    t0 = time.perf_counter()
    err = None
    if rank == 0:
        try:
            root.mkdir(parents=True, exist_ok=True)
            if tmp.exists():  # a previous attempt crashed mid-save at this iteration
                shutil.rmtree(tmp)
            tmp.mkdir()
        except OSError as e:
            err = f"cannot prepare {tmp}: {e}"
    if not _agree(err is None):
        raise CheckpointError(err or f"rank 0 could not prepare {tmp}")

    files: dict[str, int] = {}
    try:
        for m in modules:
            dense, experts = _split_model_state(m.model)
            if _group_rank(m.dp_group) == 0:
                rel = f"{m.name}/model-{rank:05d}.pt"
                files[rel] = _fsync_write(tmp / rel, dense)
            if experts and _group_rank(m.expt_dp_group) == 0:
                rel = f"{m.name}/experts-{rank:05d}.pt"
                files[rel] = _fsync_write(tmp / rel, experts)
            part = {"module": m.name, "frozen": m.frozen,
                    "optimizer": None if m.optimizer is None else _optimizer_state(m.optimizer),
                    "scheduler": None if m.scheduler is None else m.scheduler.state_dict()}
            rel = f"{m.name}/optim-{rank:05d}.pt"
            files[rel] = _fsync_write(tmp / rel, part)
        own = {"format": FORMAT_VERSION, "rank": rank, "iteration": iteration,
               "consumed_samples": consumed_samples, "modules": [m.name for m in modules],
               "rng": _rng_state(), "provider": None if provider is None else provider.state_dict(),
               "extra": extra or {}}
        files[_rank_file(rank)] = _fsync_write(tmp / _rank_file(rank), own)
        _maybe_crash("rank_files", iteration)
    except Exception as e:  # noqa: BLE001 - reported world-wide below, then raised everywhere
        err = f"rank {rank}: writing {tmp}: {type(e).__name__}: {e}"
    gathered: list = [None] * world
    dist.all_gather_object(gathered, {"files": files, "err": err, "modules": [m.name for m in modules]})
    errs = [g["err"] for g in gathered if g["err"]]
    if errs:
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        dist.barrier()
        raise CheckpointError(f"checkpoint {final} not written (previous one kept): " + "; ".join(errs))

    if rank == 0:
        try:
            all_files = {k: v for g in gathered for k, v in g["files"].items()}
            manifest = {
                "format": FORMAT_VERSION, "iteration": iteration, "consumed_samples": consumed_samples,
                "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "provenance": asdict(provenance), "bytes": sum(all_files.values()),
                "rank_modules": {str(r): g["modules"] for r, g in enumerate(gathered)},
                "files": all_files, "save_s": round(time.perf_counter() - t0, 4),
            }
            if run_doc is not None:
                _fsync_text(tmp / "run.yaml", yaml.safe_dump(run_doc, sort_keys=False))
            for sub in [tmp, *[p for p in tmp.iterdir() if p.is_dir()]]:
                _fsync_dir(sub)
            _fsync_text(tmp / "manifest.json", json.dumps(manifest, indent=1, sort_keys=True))
            _fsync_dir(tmp)
            _maybe_crash("before_rename", iteration)
            if final.exists():  # complete but never `latest` (crash after rename): this save replaces it
                _remove_dir(final)
            os.replace(tmp, final)
            _fsync_dir(root)
            _maybe_crash("before_latest", iteration)
            _fsync_text(root / f"{LATEST}.tmp", name + "\n")
            os.replace(root / f"{LATEST}.tmp", root / LATEST)
            _fsync_dir(root)
            prune(root, keep)
        except Exception as e:  # noqa: BLE001
            err = f"rank 0: finishing {final}: {type(e).__name__}: {e}"
    if not _agree(err is None):
        raise CheckpointError(err or f"checkpoint {final}: rank 0 failed to finish it (previous one kept)")
    return final


def _remove_dir(d: Path) -> None:
    # rename first: a crash during rmtree must not leave a half-deleted directory under an iter_ name
    trash = d.with_name(f".deleting-{d.name}-{os.getpid()}")
    os.replace(d, trash)
    shutil.rmtree(trash, ignore_errors=True)


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
        if p.is_dir() and p.name.startswith(".deleting-"):
            shutil.rmtree(p, ignore_errors=True)
        elif p.is_dir() and p.name.endswith(".tmp") and cur is not None and \
                _ITER_RE.match(p.name[:-4]) and int(p.name[5:-4]) <= cur.iteration:
            shutil.rmtree(p, ignore_errors=True)  # a crashed save older than the current checkpoint
            removed.append(p)
    return removed


# ---------------------------------------------------------------- load


def load(directory: str | Path, *, modules: list[ModuleParts], provider: Any, provenance: Provenance,
         path: str | Path | None = None) -> Resumed | None:
    """Collective: restore this rank's part of `latest` (or `path`). None when there is no checkpoint yet.
    Refuses (CheckpointMismatch on every rank) a checkpoint of another run or layout."""
    import torch.distributed as dist

    rank = dist.get_rank()
    root = Path(directory)
    err: str | None = None
    info = None
    try:
        info = _read_manifest(Path(path)) if path is not None else latest_checkpoint(root)
    except CheckpointError as e:
        err = str(e)
    # every rank reads the same marker/manifest; agree anyway, so that no rank trains from another state
    seen: list = [None] * dist.get_world_size()
    dist.all_gather_object(seen, (None if info is None else str(info.path), err))
    errs = sorted({e for _, e in seen if e})
    if errs:
        raise CheckpointError("; ".join(errs))
    if len({p for p, _ in seen}) != 1:
        raise CheckpointError(f"ranks see different checkpoints in {root}: {sorted({str(p) for p, _ in seen})} "
                              "(is trainer.checkpoint_dir on a filesystem all nodes share?)")
    if info is None:
        return None
    problems = check_compatible(info, provenance)
    if problems:
        raise CheckpointMismatch(f"refusing checkpoint {info.path}: " + "; ".join(problems))

    d = info.path
    resumed = None
    err_cls: type[CheckpointError] = CheckpointError
    try:
        expected = info.files
        own = _load_file(d, _rank_file(rank), expected)
        if own["modules"] != [m.name for m in modules]:
            raise CheckpointMismatch(f"{d / _rank_file(rank)}: rank {rank} held modules {own['modules']}, "
                                     f"now {[m.name for m in modules]}")
        for m in modules:
            src = _group_source(m.dp_group)
            state = _load_file(d, f"{m.name}/model-{src:05d}.pt", expected)
            _, experts_now = _split_model_state(m.model)
            if experts_now:
                esrc = _group_source(m.expt_dp_group)
                state.update(_load_file(d, f"{m.name}/experts-{esrc:05d}.pt", expected))
            missing, unexpected = m.model.load_state_dict(state, strict=False)
            # TE/megatron `_extra_state` entries may legitimately be absent on either side
            missing = [k for k in missing if not k.endswith("_extra_state")]
            unexpected = [k for k in unexpected if not k.endswith("_extra_state")]
            if missing or unexpected:
                raise CheckpointMismatch(f"{d}/{m.name}: model keys differ (missing {missing[:5]}, unexpected "
                                         f"{unexpected[:5]}): a different model preset?")
            part = _load_file(d, f"{m.name}/optim-{rank:05d}.pt", expected)
            if (part["optimizer"] is None) != (m.optimizer is None):
                raise CheckpointMismatch(f"{d}/{m.name}: saved {'without' if part['optimizer'] is None else 'with'}"
                                         f" an optimizer (frozen={part['frozen']}), this run has frozen={m.frozen}")
            if m.optimizer is not None:
                _load_optimizer_state(m.optimizer, part["optimizer"], f"{d}/{m.name}/optim-{rank:05d}.pt")
            if m.scheduler is not None and part["scheduler"] is not None:
                m.scheduler.load_state_dict(part["scheduler"])
        if provider is not None:
            if own["provider"] is None:
                raise CheckpointMismatch(f"{d / _rank_file(rank)}: no data-provider state saved")
            provider.load_state_dict(own["provider"])
        _set_rng_state(own["rng"])
        resumed = Resumed(path=d, iteration=int(own["iteration"]), consumed_samples=int(own["consumed_samples"]),
                          extra=own.get("extra") or {})
    except CheckpointError as e:
        err, err_cls = str(e), type(e)
    except Exception as e:  # noqa: BLE001
        err = f"rank {rank}: loading {d}: {type(e).__name__}: {e}"
    if not _agree(err is None):
        # the state of this process is now partly restored: the caller must not train on
        raise err_cls(err or f"loading {d} failed on another rank (see its log)")
    return resumed


def _load_file(d: Path, rel: str, expected: dict):
    import torch

    p = d / rel
    if rel not in expected:
        raise CheckpointMismatch(f"{p}: not part of this checkpoint (written by a different layout?)")
    if not p.is_file():
        raise CheckpointError(f"{p}: missing (the checkpoint directory is damaged)")
    if p.stat().st_size != expected[rel]:
        raise CheckpointError(f"{p}: {p.stat().st_size} bytes, the manifest says {expected[rel]} (damaged)")
    return torch.load(p, map_location="cpu", weights_only=False)


# ---------------------------------------------------------------- trainer hooks (called from main.py)

# Test hook: MIMO_CKPT_KILL_AFTER_ITER=<n> SIGKILLs every rank right after iteration n (and its periodic
# save, if any): a deterministic `kill -9` of the whole job for the resume tests.
KILL_ENV = "MIMO_CKPT_KILL_AFTER_ITER"
# Test hook: MIMO_CKPT_TEST_STEP_DELAY_S=<s> sleeps after every step, so a test's signal lands mid-run.
DELAY_ENV = "MIMO_CKPT_TEST_STEP_DELAY_S"


def checkpoint_dir_of(run, doc: dict, run_yaml: str | Path | None = None) -> Path:
    """paths.checkpoints of run.yaml (render resolves trainer.checkpoint_dir into it), else
    trainer.checkpoint_dir, else <run dir>/checkpoints next to run.yaml."""
    p = (doc.get("paths") or {}).get("checkpoints") or run.trainer.checkpoint_dir
    if p:
        return Path(p)
    if run_yaml is not None:
        return Path(run_yaml).resolve().parent / "checkpoints"
    raise CheckpointError("run.yaml has no paths.checkpoints and trainer.checkpoint_dir is not set")


def modules_of(st) -> list[ModuleParts]:
    """The modules this rank owns in a trainer TrainState (fixed order: encoder, language)."""
    out = []
    for mod in (st.encoder, st.language):
        if mod is None:
            continue
        opt = None if mod.frozen else st.optimizer.optimizers.get(mod.name)
        out.append(ModuleParts(name=mod.name, model=mod.core, optimizer=opt, dp_group=mod.pgc.dp,
                               expt_dp_group=getattr(mod.pgc, "expt_dp", None), frozen=mod.frozen))
    return out


class Checkpointer:
    """Resume at start, periodic saves, and the stop-save-requeue path, for one trainer process."""

    def __init__(self, run, doc: dict, directory: Path, world: int, watch=None, enabled: bool = True):
        self.run = run
        self.doc = doc
        self.dir = directory
        self.enabled = enabled
        self.watch = watch
        self.interval = run.trainer.save_interval
        self.keep = run.trainer.keep_checkpoints
        prov = doc.get("provenance") or {}
        self.provenance = Provenance(
            run_id=run.run_id, study=run.study, run_name=run.name, layout=asdict(run.layout), world=world,
            git_sha=prov.get("git_sha"),
            # launch.sh exports these for SLURM and local jobs alike
            job_id=os.environ.get("MIMO_JOBS_JOB_ID") or os.environ.get("SLURM_JOB_ID"),
            attempt=int(os.environ.get("MIMO_JOBS_ATTEMPT") or os.environ.get("SLURM_RESTART_COUNT") or 0))
        self.last_saved: int | None = None
        self.last_save_s: float | None = None
        self.resumed: Resumed | None = None

    @classmethod
    def for_run(cls, run, doc: dict, run_yaml: str | Path | None, reference: bool) -> Checkpointer:
        """The reference mode (one process) neither resumes nor saves: it is a yardstick, not a run."""
        import torch.distributed as dist

        from .signals import PreemptionWatch, deadline_from_env, margin_from_env

        if reference:
            return cls(run, doc, Path("."), 1, None, enabled=False)
        watch = PreemptionWatch(deadline=deadline_from_env(), margin_s=margin_from_env()).install()
        return cls(run, doc, checkpoint_dir_of(run, doc, run_yaml), dist.get_world_size(), watch)

    def resume(self, st) -> Resumed | None:
        if not self.enabled:
            return None
        r = load(self.dir, modules=modules_of(st), provider=st.provider, provenance=self.provenance)
        if r is not None:
            st.iteration, st.consumed_samples = r.iteration, r.consumed_samples
            self.last_saved = r.iteration
            self.resumed = r
            if st.role.rank == 0:
                # wording matched by ingest (logparse: "resumed from checkpoint" -> checkpoint_loaded event)
                print(f"mimo-jobs trainer: resumed from checkpoint {r.path} (iteration {r.iteration}, "
                      f"{r.consumed_samples} samples)", flush=True)
        return r

    def save(self, st) -> Path:
        t0 = time.perf_counter()
        p = save(self.dir, iteration=st.iteration, consumed_samples=st.consumed_samples, modules=modules_of(st),
                 provider=st.provider, provenance=self.provenance, keep=self.keep, run_doc=self.doc)
        self.last_saved = st.iteration
        self.last_save_s = time.perf_counter() - t0
        if self.watch is not None:
            self.watch.note_save(self.last_save_s)
        if st.role.rank == 0:  # "saved checkpoint" -> ingest's checkpoint_saved event
            print(f"mimo-jobs trainer: saved checkpoint {p} (iteration {st.iteration}, {st.consumed_samples} "
                  f"samples, {self.last_save_s:.2f} s)", flush=True)
        return p

    def after_step(self, st, n_iters: int, step_s: float | None = None):
        """Call on every rank after each iteration. Saves every save_interval iterations; returns a
        StopDecision (after saving) when the world agreed to stop early for a requeue, else None."""
        if not self.enabled:
            return None
        if step_s is not None and self.watch is not None:
            self.watch.note_step(step_s)
        if self.interval and st.iteration % self.interval == 0 and self.last_saved != st.iteration:
            self.save(st)
        kill = os.environ.get(KILL_ENV)
        if kill and int(kill) == st.iteration:
            os.kill(os.getpid(), signal.SIGKILL)
        delay = os.environ.get(DELAY_ENV)
        if delay:
            time.sleep(float(delay))
        stop = self.watch.should_stop() if self.watch is not None else None
        if stop is None or st.iteration >= n_iters:
            return None  # the run is complete anyway: no requeue
        if self.last_saved != st.iteration:
            self.save(st)
        if st.role.rank == 0:
            from .signals import write_requeue_marker

            write_requeue_marker(self.dir, st.iteration, stop.reason, self.provenance.job_id)
            print(f"{REQUEUE_LOG_LINE} {st.iteration} ({stop.reason}); "
                  f"checkpoint {self.dir / iter_name(st.iteration)}", flush=True)
        return stop

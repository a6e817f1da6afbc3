"""What a rank holds in memory, measured: the facts a capacity plan is checked against.

- `SavedTensorMeter` counts the bytes autograd keeps for backward (activations), live and peak, with
  torch's saved-tensor hooks: each storage once however many saved tensors view it, parameters not at all
  (they are counted as parameters), released when autograd drops the graph. A storage first saved inside
  a watched module's forward (`watch`: each encoder module and the LLM) counts to that module too, so each
  module has its own peak over the run (what the step saves outside every module, the loss's, counts only
  to the rank's).
- `rank_facts` sums what the rank's modules hold after sharding: parameters, gradient buffers, optimizer
  state, and on a GPU the allocator's peaks. Written by every rank to `<run dir>/memory/rank-<r>.json`
  (`write_facts`) at the end of a run and at each checkpoint; ingest stores them per run and rank.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from mimo_jobs.contract.memory import MemoryFacts, facts_path


class _Saved:
    """What the pack hook returns: the tensor, and a release of its storage's count when autograd drops it."""

    __slots__ = ("key", "meter", "tensor")

    def __init__(self, meter: SavedTensorMeter, key, tensor) -> None:
        self.meter, self.key, self.tensor = meter, key, tensor

    def __del__(self) -> None:
        if self.key is not None:
            self.meter._release(self.key)


class SavedTensorMeter:
    def __init__(self, params=()) -> None:
        self.live = 0
        self.peak = 0
        self._refs: dict[Any, list] = {}  # storage -> [bytes, saved tensors viewing it, owning module]
        self._params = {self._key(p) for p in params}
        self._inside: list[str] = []  # the watched modules whose forward is running, innermost last
        self.module_live: dict[str, int] = {}
        self.module_peak: dict[str, int] = {}  # per watched module: the most it held at once, over the run

    def watch(self, name: str, module) -> None:
        """Count what `module`'s forward saves to `name` as well (forward pre- and post-hooks)."""
        self.module_live.setdefault(name, 0)
        self.module_peak.setdefault(name, 0)

        def enter(*_) -> None:
            self._inside.append(name)

        def leave(*_) -> None:  # returns None: a forward hook's result would replace the module's output
            self._inside.pop()

        module.register_forward_pre_hook(enter)
        module.register_forward_hook(leave)

    @staticmethod
    def _key(t):
        s = t.untyped_storage()
        return (s.data_ptr(), str(s.device))

    def hooks(self):
        """The context in which autograd's saved tensors are counted."""
        return torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def reset_peak(self) -> None:
        self.peak = self.live

    def _pack(self, t) -> _Saved:
        key = self._key(t)
        if key in self._params or t.untyped_storage().nbytes() == 0:
            return _Saved(self, None, t)
        entry = self._refs.get(key)
        if entry is None:
            nbytes = t.untyped_storage().nbytes()
            owner = self._inside[-1] if self._inside else None
            self._refs[key] = [nbytes, 1, owner]
            self.live += nbytes
            self.peak = max(self.peak, self.live)
            if owner is not None:
                self.module_live[owner] += nbytes
                self.module_peak[owner] = max(self.module_peak[owner], self.module_live[owner])
        else:
            entry[1] += 1
        return _Saved(self, key, t)

    @staticmethod
    def _unpack(saved: _Saved):
        return saved.tensor

    def _release(self, key) -> None:
        entry = self._refs.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            del self._refs[key]
            self.live -= entry[0]
            if entry[2] is not None:
                self.module_live[entry[2]] -= entry[0]


def _tensor_bytes(t) -> int:
    return t.numel() * t.element_size()


def module_facts(mod) -> dict[str, int]:
    """Parameters (count, bytes), gradient-buffer bytes and optimizer-state bytes one module holds here."""
    core = mod.core
    params = list(core.parameters())
    grad_bytes = 0
    if mod.ddp is not None:  # megatron DDP keeps gradients in contiguous buffers (fp32 here)
        for buf in list(getattr(mod.ddp, "buffers", [])) + list(
            getattr(mod.ddp, "expert_parallel_buffers", [])
        ):
            grad_bytes += _tensor_bytes(buf.grad_data)
    return {
        "params": sum(p.numel() for p in params),
        "param_bytes": sum(_tensor_bytes(p) for p in params),
        "grad_buffer_bytes": grad_bytes,
    }


def optimizer_state_bytes(opt) -> int:
    """Bytes of the optimizer's state tensors (Adam moments, fp32 master copies of a distributed optimizer's
    shard) across every optimizer a megatron ChainedOptimizer holds."""
    from mimo_jobs.trainer.model.optimizer import leaf_optimizers

    total, seen = 0, set()
    for leaf in leaf_optimizers(opt):
        inner = getattr(leaf, "optimizer", leaf)
        for state in getattr(inner, "state", {}).values():
            for v in state.values() if isinstance(state, dict) else ():
                if isinstance(v, torch.Tensor) and id(v) not in seen:
                    seen.add(id(v))
                    total += _tensor_bytes(v)
        for group in getattr(leaf, "shard_fp32_from_float16_groups", None) or []:
            total += sum(_tensor_bytes(p) for p in group)
    return total


def rank_facts(st, meter: SavedTensorMeter, inflight_peak: int) -> dict:
    """This rank's memory facts (see the module doc); one dict per module it runs, and the rank's peaks."""
    modules = {}
    for mod in st.modules:
        f = module_facts(mod)
        opt = st.optimizer.optimizers.get(mod.name)
        f["optimizer_state_bytes"] = optimizer_state_bytes(opt) if opt is not None else 0
        if mod.name in meter.module_peak:
            f["saved_activation_peak_bytes"] = meter.module_peak[mod.name]
        modules[mod.name] = f
    own = (st.language or st.encoders[0]).shape  # the LLM's stage, else this rank's encoder module's
    out = {
        "rank": st.role.rank,
        "iteration": st.iteration,
        "tp_rank": st.role.tp_rank,
        "pp_rank": own.coords(st.role.rank)[1] if not st.reference else 0,
        "dp_rank": st.role.dp_rank,
        "modules": modules,
        "saved_activation_peak_bytes": meter.peak,
        "inflight_peak": inflight_peak,
    }
    if torch.cuda.is_available() and str(st.device).startswith("cuda"):
        out["cuda_max_allocated_bytes"] = torch.cuda.max_memory_allocated()
        out["cuda_max_reserved_bytes"] = torch.cuda.max_memory_reserved()
    return out


def write_facts(run_dir: Path, facts: dict) -> Path:
    """<run dir>/memory/rank-<r>.json, replaced atomically (a reader never sees half a file)."""
    record = MemoryFacts.from_json(facts)  # the one format ingest reads (a missing field fails here)
    path = facts_path(Path(run_dir), record.rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(record.to_json(), sort_keys=True))
    tmp.replace(path)
    return path

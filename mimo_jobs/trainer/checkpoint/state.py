"""The torch state one rank puts into a checkpoint, and puts back: RNG states, a module's weights (dense |
expert) and its optimizer state. Pure state conversion, no file I/O (files.py writes and reads them).

Optimizer state: per leaf optimizer (dense, expert) its state_dict, plus, for the distributed optimizer, its
own shard of the parameter state through megatron's "dp_reshardable" format (no gather over DP).
"""

from __future__ import annotations

import torch
from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

from mimo_jobs.contract.manifest import CheckpointMismatch
from mimo_jobs.trainer.model.optimizer import leaf_optimizers

# ---------------------------------------------------------------- RNG


def rng_state() -> dict:
    """Python, numpy, torch (and CUDA) generators and megatron's model-parallel RNG tracker."""
    import random

    import numpy as np

    st = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "tracker": {k: v.clone() for k, v in get_cuda_rng_tracker().get_states().items()},
    }
    if torch.cuda.is_available():
        st["cuda"] = torch.cuda.get_rng_state()
    return st


def set_rng_state(st: dict) -> None:
    import random

    import numpy as np

    random.setstate(st["python"])
    np.random.set_state(st["numpy"])
    torch.set_rng_state(st["torch"])
    if "cuda" in st and torch.cuda.is_available():
        torch.cuda.set_rng_state(st["cuda"])
    get_cuda_rng_tracker().set_states({k: v.clone() for k, v in st["tracker"].items()})


# ---------------------------------------------------------------- model weights


def split_model_state(model) -> tuple[dict, dict]:
    """(dense, expert) parts of the module's state_dict; expert params are the ones megatron marks
    allreduce=False (replicated over the expert-DP group instead of the DP group)."""
    sd = model.state_dict()
    expert_names = {n for n, p in model.named_parameters() if getattr(p, "allreduce", True) is False}
    dense = {k: v for k, v in sd.items() if k not in expert_names}
    experts = {k: v for k, v in sd.items() if k in expert_names}
    return dense, experts


def load_model_state(model, state: dict, where: str) -> None:
    """Load all of `state` into `model`; any key missing on either side is a mismatch."""
    missing, unexpected = model.load_state_dict(state, strict=False)
    # TE/megatron `_extra_state` entries may legitimately be absent on either side
    missing = [k for k in missing if not k.endswith("_extra_state")]
    unexpected = [k for k in unexpected if not k.endswith("_extra_state")]
    if missing or unexpected:
        raise CheckpointMismatch(
            f"{where}: model keys differ (missing {missing[:5]}, unexpected "
            f"{unexpected[:5]}): a different model preset?"
        )


# ---------------------------------------------------------------- optimizer


def _is_distopt(o) -> bool:
    return hasattr(o, "get_parameter_state_dp_reshardable")


def optimizer_state(opt) -> list[dict]:
    """One entry per leaf optimizer: {"empty": True} | {"common": state_dict[, "param_state": shard]}."""
    out = []
    for o in leaf_optimizers(opt):
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


def load_optimizer_state(opt, states: list[dict], where: str) -> None:
    """Inverse of `optimizer_state`; `where` names the file in errors."""
    leaves = leaf_optimizers(opt)
    if len(leaves) != len(states):
        raise CheckpointMismatch(
            f"{where}: {len(states)} optimizer parts saved, this run builds {len(leaves)}"
        )
    with torch.no_grad():  # fp32 distopt main params are views of params that require grad
        for o, s in zip(leaves, states):
            if s.get("empty"):
                continue
            if _is_distopt(o) != ("param_state" in s):
                raise CheckpointMismatch(
                    f"{where}: saved with use_distributed_optimizer="
                    f"{'param_state' in s}, this run has {_is_distopt(o)}"
                )
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

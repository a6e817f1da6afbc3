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
    """Load all of `state` into `model`; any key missing on either side, or of another shape, is a mismatch
    (one line: a checkpoint of another model at the same layout, found before torch's own multi-line dump)."""
    own = model.state_dict()
    shaped = [
        (k, list(v.shape), list(own[k].shape))
        for k, v in state.items()
        if k in own and hasattr(v, "shape") and tuple(v.shape) != tuple(own[k].shape)
    ]
    if shaped:
        k, theirs, ours = shaped[0]
        more = f" (and {len(shaped) - 1} more)" if len(shaped) > 1 else ""
        raise CheckpointMismatch(
            f"{where}: {k} is {theirs} in the checkpoint, {ours} in this run's model{more}: a checkpoint of "
            "another model"
        )
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
    """megatron-core's DistributedOptimizer.load_state_dict (torch-Adam path, no TE/Apex; seen on 0.16.1) puts
    ONE `step` tensor into every parameter's state; torch Adam increments it in place per parameter, so after
    one step the bias correction is wrong (seen as a bitwise mismatch from the 2nd resumed step on). Give each
    parameter its own copy (a copy costs nothing where a later release no longer shares it)."""
    inner = getattr(o, "optimizer", None)
    for st in getattr(inner, "state", {}).values():
        if isinstance(st, dict) and "step" in st and hasattr(st["step"], "clone"):
            st["step"] = st["step"].clone()


# ---------------------------------------------------------------- optimizer state in model space

# What a parameter's optimizer state is, independent of how the optimizer lays it out: per model parameter
# (by its name in the module), the flat range [start, end) of the parameter this rank's optimizer holds and,
# for that range, the optimizer's tensors (Adam: exp_avg, exp_avg_sq) and the fp32 main copy ("param") when
# it is not the model parameter itself. reshard.py moves this between layouts.


def _main_of(o) -> dict:
    """model parameter -> (start, end, main parameter or None, the torch optimizer state's key) for one leaf
    optimizer: the distributed optimizer's DP shard, or the whole parameter (Float16 optimizer: its fp32
    copy; FP32 optimizer: the parameter itself, main None)."""
    out = {}
    if _is_distopt(o):
        for gbuf_range_maps in o.gbuf_ranges:
            for buckets in gbuf_range_maps.values():
                for bucket in buckets:
                    for mp, rmap in bucket["param_map"].items():
                        gi, go = o.model_param_group_index_map[mp]
                        main = o.optimizer.param_groups[gi]["params"][go]
                        out[mp] = (rmap["param"].start, rmap["param"].end, main, main)
        return out
    for model_g, main_g in zip(getattr(o, "float16_groups", []), getattr(o, "fp32_from_float16_groups", [])):
        for mp, main in zip(model_g, main_g):
            out[mp] = (0, mp.numel(), main, main)
    for g in getattr(o, "fp32_from_fp32_groups", []):
        for mp in g:
            out[mp] = (0, mp.numel(), None, mp)
    if not hasattr(o, "float16_groups"):  # FP32Optimizer: its param groups hold the model parameters
        for g in o.optimizer.param_groups:
            for mp in g["params"]:
                out[mp] = (0, mp.numel(), None, mp)
    return out


def _step_in_group(inner) -> bool:
    """Where Adam keeps its step count: torch's Adam/AdamW per parameter (state[p]["step"]); Transformer
    Engine's and apex's FusedAdam (megatron-core's Adam when either is installed) one per param group
    (group["step"]), as megatron-core's DistributedOptimizer.state_dict reads it."""
    return not isinstance(inner, (torch.optim.Adam, torch.optim.AdamW))


def _groups_of(inner) -> dict[int, dict]:
    return {id(p): g for g in inner.param_groups for p in g["params"]}


def _set_group_step(group: dict, step: float) -> None:
    old = group.get("step")
    if torch.is_tensor(old):  # FusedAdam(capturable=True) keeps it on the device
        old.fill_(int(step))
    else:
        group["step"] = int(step)


def optimizer_space(model, opt) -> tuple[dict, float | None]:
    """({param name: {"range": (start, end), "<key>": flat tensor, ...}}, Adam's step count or None), the
    tensors being the optimizer's own (no copies: saved next to `optimizer_state` they share its storage)."""
    names = {id(p): n for n, p in model.named_parameters()}
    space, step = {}, None
    for o in leaf_optimizers(opt):
        if getattr(o, "optimizer", None) is None or not o.get_parameters():
            continue
        groups = _groups_of(o.optimizer) if _step_in_group(o.optimizer) else {}
        for mp, (a, b, main, key) in _main_of(o).items():
            st = o.optimizer.state.get(key, {})
            rec: dict = {"range": (a, b)}
            if groups.get(id(key), {}).get("step") is not None:
                step = float(groups[id(key)]["step"])
            for k, v in st.items():
                if k == "step":
                    step = float(v)
                elif torch.is_tensor(v) and v.numel() == b - a:
                    rec[k] = v.view(-1)
            if main is not None:
                rec["param"] = main.view(-1)
            space[names[id(mp)]] = rec
    return space, step


def init_optimizer_space(model, opt, keys: list[str], step: float) -> dict:
    """Give every parameter of `opt` the state tensors `keys` (zeros) and the step count `step` where the
    optimizer keeps it (torch's Adam: a tensor per parameter, as it creates on its first step; FusedAdam: its
    param group), and return the views `optimizer_space` would (to be filled)."""
    for o in leaf_optimizers(opt):
        if getattr(o, "optimizer", None) is None or not o.get_parameters():
            continue
        in_group = _step_in_group(o.optimizer)
        groups = _groups_of(o.optimizer)
        for _mp, (_a, _b, _main, key) in _main_of(o).items():
            st = o.optimizer.state[key]
            for k in keys:
                st[k] = torch.zeros_like(key, memory_format=torch.preserve_format)
            if in_group:
                _set_group_step(groups[id(key)], step)
            else:
                st["step"] = torch.tensor(float(step), dtype=torch.float32)  # one tensor per parameter
    return optimizer_space(model, opt)[0]

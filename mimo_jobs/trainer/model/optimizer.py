"""The MIMO optimizer: one megatron optimizer per module, one decision for the whole world.

Each module's optimizer sees only its own ranks, but clipping needs the global grad norm and a skipped
step must be skipped everywhere, so `step()` agrees world-wide:
  1. prepare_grads on each active optimizer, then each module's grad norm;
  2. one world all-reduce (MAX) of [non-finite seen, norm^2 per module in a fixed slot vector]: the first slot
     is 1 when any rank's grad scaler found an inf or any rank's module norm is NaN/inf, else 0; a module's
     slot holds its norm^2 on its ranks (all equal) and 0 elsewhere. A non-finite norm is never put in a
     slot: a float MAX does not carry NaN (gloo returns another rank's value unless rank 0 holds it; NCCL's
     float max is fmaxf, which returns the non-NaN operand: src/device/reduce_kernel.h of NVIDIA/nccl), so
     only the 0/1 flag decides the skip;
  3. skip together when the flag is set; else global norm = sqrt(sum of slots), clip every module by it,
     step, success all-reduced with MIN.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from megatron.core.optimizer.clip_grads import clip_grad_by_total_norm_fp32


def build_megatron_optimizer(ddp, pgc, spec, prec, max_lr: float):
    """get_megatron_optimizer for one module. A WORLD collective in megatron-core 0.19 (it all_gathers the
    param-group keys, see _PARAM_GROUP_GATHERS), so every rank must call either this or `skip_megatron_optimizer` exactly once per
    module it owns, in the same order."""
    o = spec.optimizer
    cfg = OptimizerConfig(
        optimizer=o.name,
        lr=max_lr,
        min_lr=spec.lr.min,
        weight_decay=o.weight_decay,
        adam_beta1=o.beta1,
        adam_beta2=o.beta2,
        adam_eps=o.eps,
        clip_grad=0.0,  # clipping is done by MimoOptimizer with the global norm
        bf16=prec.bf16,
        params_dtype=prec.dtype,
        use_distributed_optimizer=spec.use_distributed_optimizer,
    )
    # megatron-core refuses gloo helper groups together with a pg_collection
    return get_megatron_optimizer(cfg, [ddp], use_gloo_process_groups=False, pg_collection=pgc)


# get_megatron_optimizer (one model chunk) runs _get_param_groups twice, dense then expert params, and each
# run all-gathers the param-group keys over the WORLD (optimizer/__init__.py:181).
_PARAM_GROUP_GATHERS = 2


def skip_megatron_optimizer() -> None:
    """What a rank that builds no optimizer for a module (another module's rank, or a frozen module's)
    contributes to that module's get_megatron_optimizer: the same world gathers, with no param-group keys."""
    for _ in range(_PARAM_GROUP_GATHERS):
        gathered = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, [])


def leaf_optimizers(opt) -> list:
    """The optimizers inside a megatron ChainedOptimizer (dense, expert), or [opt] itself."""
    return list(getattr(opt, "chained_optimizers", [opt]))


@dataclass
class StepResult:
    ok: bool
    grad_norm: float | None
    skipped: bool
    nan: bool


class MimoOptimizer:
    def __init__(self, slots: list[str], optimizers: dict, weight_decay: float, device):
        self.slots = list(slots)  # fixed module order, the same on every rank
        self.optimizers = {k: v for k, v in optimizers.items() if v is not None}  # the active ones
        self.weight_decay = weight_decay
        self.device = device

    def zero_grad(self) -> None:
        for o in self.optimizers.values():
            o.zero_grad()

    def set_lr(self, lr: float) -> None:
        for o in self.optimizers.values():
            for g in o.param_groups:
                g["lr"] = lr
                g["weight_decay"] = self.weight_decay * g.get("wd_mult", 1.0)

    def _all_reduce(self, values: list[float], op):

        t = torch.tensor(
            values, dtype=torch.float64 if self.device == "cpu" else torch.float32, device=self.device
        )
        dist.all_reduce(t, op=op)
        return t.tolist()

    def _module_norms(self) -> tuple[bool, list[float]]:
        """(this rank saw a non-finite grad norm, norm^2 per slot with 0 for the non-finite and absent ones)."""
        bad = False
        sq = [0.0] * len(self.slots)
        for i, name in enumerate(self.slots):
            if name in self.optimizers:
                n = float(self.optimizers[name].get_grad_norm() or 0.0)
                if math.isfinite(n):
                    sq[i] = n * n
                else:
                    bad = True
        return bad, sq

    def step(self, clip_grad: float) -> StepResult:

        found = False
        for o in self.optimizers.values():  # every optimizer prepares (no short-circuit)
            found |= bool(o.prepare_grads())
        bad, sq = self._module_norms()
        agreed = self._all_reduce([1.0 if (found or bad) else 0.0, *sq], dist.ReduceOp.MAX)
        if agreed[0] > 0:
            return StepResult(False, None, True, True)
        norm = math.sqrt(sum(agreed[1:]))
        if not math.isfinite(norm):  # finite module norms whose squares overflow: the same on every rank
            return StepResult(False, norm, True, True)
        if clip_grad > 0:
            for o in self.optimizers.values():
                for leaf in leaf_optimizers(o):
                    params = leaf.get_parameters()
                    if params and not getattr(leaf, "is_stub_optimizer", False):
                        clip_grad_by_total_norm_fp32(params, max_norm=clip_grad, total_norm=norm)
        ok = True
        for o in self.optimizers.values():
            ok &= bool(o.step_with_ready_grads())
        ok = self._all_reduce([1.0 if ok else 0.0], dist.ReduceOp.MIN)[0] > 0
        return StepResult(ok, norm, not ok, False)

    def state_dict(self) -> dict:
        return {k: o.state_dict() for k, o in self.optimizers.items()}

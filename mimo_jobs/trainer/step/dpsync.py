"""When a rank's DDP transfers run, as the study's trainer section says (megatron-core's
DistributedDataParallel, trainer/build.py ddp_config).

- Gradient reduce: each trained module's DDP accumulates every microbatch's gradient; the backwards of all but
  the iteration's last microbatch run under `no_sync`, so with `overlap_grad_reduce` a bucket's reduce starts
  from the backward hooks once the last microbatch has filled it. A bucket the last backward left unfilled (an
  encoder microbatch with nothing to embed runs no backward) is started before the step, in bucket order, the
  order the hooks start them on every other rank of the group.
- Parameter all-gather (`overlap_param_gather`, distributed optimizer): the optimizer step leaves the gather
  to the next iteration; every module's gathers are dispatched at the iteration's start, in bucket order on
  every rank, and each layer's forward waits for its own (megatron-core's align_param_gather). One still open
  before the step (a module that ran no forward) is waited for, and a checkpoint gathers first.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mimo_jobs.trainer.build import TrainState


def _ddps(st: TrainState) -> list:
    return [m.ddp for m in st.modules if m.ddp is not None]


def _groups(ddp) -> list:
    return ddp.bucket_groups + ddp.expert_parallel_bucket_groups


def backward_of(st: TrainState, m: int) -> contextlib.AbstractContextManager:
    """The context of microbatch `m`'s backward: gradients only accumulate, except under the last one's."""
    if m == st.plan.num_microbatches - 1:
        return contextlib.nullcontext()
    stack = contextlib.ExitStack()
    for ddp in _ddps(st):
        stack.enter_context(ddp.no_sync())
    return stack


def start_param_gathers(st: TrainState) -> None:
    """At the iteration's start: dispatch the parameter all-gathers the last step left (overlap_param_gather)."""
    for ddp in _ddps(st):
        if ddp.ddp_config.overlap_param_gather:
            ddp.start_param_sync()


def before_step(st: TrainState) -> None:
    """Every transfer of the iteration dispatched and every gather done, before the gradients are finished
    and the parameters updated."""
    for ddp in _ddps(st):
        cfg = ddp.ddp_config
        for g in _groups(ddp):
            if cfg.overlap_param_gather and g.param_gather_handle is not None:
                g.finish_param_sync(skip_next_bucket_dispatch=True)
            # megatron-core's first iteration learns how many gradients each bucket waits for and starts its
            # reduce at finish_grad_sync; later ones start it from the hooks
            if cfg.overlap_grad_reduce and not g.is_first_batch and g.grad_reduce_handle is None:
                if not g.grad_reduce_finished:
                    g.start_grad_sync()


def gather_params(st: TrainState) -> None:
    """The updated parameters on every rank now (a checkpoint reads them): under overlap_param_gather the
    step left them to the next forward."""
    for ddp in _ddps(st):
        if ddp.ddp_config.overlap_param_gather:
            ddp.start_param_sync(force_sync=True)


def ddp_words(st: TrainState) -> str:
    """This rank's DDP as built: the reduce dtype and the overlaps (the trainer's start line)."""
    ddps = _ddps(st)
    if not ddps:
        return ""
    cfg = ddps[0].ddp_config
    overlaps = [n for n in ("overlap_grad_reduce", "overlap_param_gather") if getattr(cfg, n)]
    reduce = "fp32" if cfg.grad_reduce_in_fp32 or not st.prec.bf16 else "bf16"
    return f"ddp grad reduce {reduce}, " + (" ".join(overlaps) if overlaps else "no overlap")

"""One iteration on a rank: the learning rate, the data (when the rank needs it before its program), N, the
rank's program (reference, colocated, encoder rank, LLM stage), the gradient reduction and optimizer step,
and the iteration's figures summed over the world."""

from __future__ import annotations

import torch
import torch.distributed as dist

from mimo_jobs.trainer.build import TrainState
from mimo_jobs.trainer.step import colocated, dpsync, encoder_rank, llm_stage, reference
from mimo_jobs.trainer.step.common import (
    PhaseTimer,
    StepStats,
    Tally,
    contributes,
    draw_microbatch,
    world_sum,
)


def train_step(st: TrainState) -> StepStats:
    """One iteration on this rank (see the package doc). Every rank runs the same world collectives in the
    same order: the token all-reduce, the optimizer's agreements, the figures' all-reduce."""
    tm = PhaseTimer(st.device)
    t0 = tm.now()
    lr = st.schedule(st.consumed_samples)
    st.optimizer.set_lr(lr)
    _zero_grads(st)
    dpsync.start_param_gathers(st)
    # An encoder rank draws each microbatch when it runs it (its inputs are the memory that matters); the
    # others draw the iteration's token batches first: N, the global batch's loss-bearing tokens, scales
    # every backward and must be known before the first.
    lazy = _encoder_only(st)
    batches = [] if lazy else [draw_microbatch(st, tm) for _ in range(st.plan.num_microbatches)]
    n_tokens, carried = _global_tokens(st, batches)
    _set_aux_scale(st, n_tokens)
    st.meter.reset_peak()
    with st.meter.hooks():
        tally = _program(st)(st, batches, n_tokens, tm)
    res = _optimizer_step(st, tm)
    loss_sum, aux, image_tokens, audio_tokens = _global_figures(st, tally)
    st.iteration += 1
    st.consumed_samples += st.plan.layout.gbs
    aux_per_microbatch = aux / (st.plan.num_microbatches * st.plan.layout.llm_dp)
    return StepStats(
        iteration=st.iteration,
        loss=loss_sum / max(n_tokens, 1.0),
        tokens=int(n_tokens),
        grad_norm=res.grad_norm,
        lr=lr,
        skipped=res.skipped,
        nan=res.nan,
        elapsed_s=tm.now() - t0,
        phases_s=dict(tm.acc),
        moe_aux_loss=aux_per_microbatch if st.preset.llm.num_experts else None,
        image_tokens=int(image_tokens),
        audio_tokens=int(audio_tokens),
        carried_tokens=int(carried),
        empty_encoder_microbatches=tally.empty_encoder_microbatches,
        saved_peak_bytes=st.meter.peak,
        inflight_peak=tally.inflight_peak,
    )


def _program(st: TrainState):
    """This rank's program: (st, batches, N, timer) -> Tally."""
    if st.reference:
        return reference.microbatches
    if st.plan.layout.colocated:
        return colocated.microbatches
    if st.role.is_encoder:
        return encoder_rank.microbatches
    return llm_stage.microbatches


def _encoder_only(st: TrainState) -> bool:
    return not st.reference and not st.plan.layout.colocated and not st.role.is_language


def _global_tokens(st: TrainState, batches: list[dict]) -> tuple[float, float]:
    """N, the loss-bearing tokens of the whole global batch, and the positions it carries (one world
    all-reduce of both: every rank takes part)."""
    local = [0.0, 0.0]
    if contributes(st):
        for b in (b for mb in batches for b in mb.values()):
            local[0] += float(b.loss_mask.sum())
            local[1] += float(carried_positions(b))
    return (local[0], local[1]) if st.reference else tuple(world_sum(st, local))


def carried_positions(b) -> int:
    """The sequence positions a microbatch carries: per sample, up to the last one the loss reads (the
    target of the last loss-bearing position) or the last placeholder of any encoder module; the rest is
    padding."""
    idx = torch.arange(b.tokens.shape[1], device=b.tokens.device)
    last_loss = torch.where(b.loss_mask > 0, idx, -2).amax(dim=1) + 2
    placeholder = torch.zeros_like(b.tokens, dtype=torch.bool)
    for m in b.inputs.values():
        placeholder = placeholder | (b.tokens == m.token_id)
    last_placeholder = torch.where(placeholder, idx, -1).amax(dim=1) + 1
    return int(torch.clamp(torch.maximum(last_loss, last_placeholder), max=b.tokens.shape[1]).sum())


def _zero_grads(st: TrainState) -> None:
    for m in st.modules:
        if m.ddp is not None:
            m.ddp.zero_grad_buffer()
    st.optimizer.zero_grad()


def _finalize(st: TrainState) -> None:
    from megatron.core.distributed.finalize_model_grads import finalize_model_grads

    for m in st.modules:
        if m.ddp is not None:
            finalize_model_grads([m.ddp], pg_collection=m.pgc)


# the losses megatron-core tracks for the router's aux_loss balancing (models.py sets no z-loss)
MOE_AUX_LOSSES = ("load_balancing_loss",)


def _moe_aux(st: TrainState) -> float:
    """Mean over the MoE layers of the load-balancing loss summed over this iteration's microbatches (dense
    layers hold a zero slot in the tracker); cleared."""
    if not st.preset.llm.num_experts or st.language is None:
        return 0.0
    from megatron.core.transformer.moe.moe_utils import (
        clear_aux_losses_tracker,
        get_moe_layer_wise_logging_tracker,
    )

    tr = get_moe_layer_wise_logging_tracker()
    v = 0.0
    # a pipeline stage of dense layers only tracks nothing, yet must join the stages' all-reduce: every
    # rank reduces the same names, zeros where it has none
    for name in MOE_AUX_LOSSES:
        x = tr.get(name)
        vals = x["values"] if x is not None else torch.zeros(st.preset.llm.num_layers, device=st.device)
        if _sp_size(st) > 1:  # with sequence parallelism each TP rank holds its shard's partial loss
            vals = vals.clone()
            dist.all_reduce(vals, group=st.language.pgc.tp)
        if st.llm_shape.pp > 1 and not st.reference:  # each stage filled the slots of its own layers
            vals = vals.clone()
            dist.all_reduce(vals, group=st.language.pgc.pp)
        v += float(vals.sum()) / st.preset.llm.moe_layers
    clear_aux_losses_tracker()
    return v


def _sp_size(st: TrainState) -> int:
    cfg = st.language.core.config
    return cfg.tensor_model_parallel_size if cfg.sequence_parallel else 1


def _set_aux_scale(st: TrainState, n_tokens: float) -> None:
    if st.preset.llm.num_experts and st.language is not None:
        from megatron.core.transformer.moe.moe_utils import MoEAuxLossAutoScaler

        # Per-token-loss mode: the aux loss gradient is scaled like the main loss (1/N). megatron-core 0.19
        # weights each rank's aux loss by its local token count times the tp_cp group's size (router.py,
        # calculate_per_token_loss): under sequence parallelism that is the whole sequence's count, so the
        # gradient is already independent of the LLM's TP size (0.16.1 weighted by the local count alone,
        # and the trainer multiplied the SP size back).
        scale = 1.0 / max(n_tokens, 1.0)
        MoEAuxLossAutoScaler.set_loss_scale(torch.tensor(scale, device=st.device))


def _optimizer_step(st: TrainState, tm: PhaseTimer):
    """Per-module gradient reduction, then the world-wide optimizer step (clipping by the global norm)."""
    a = tm.mark()
    dpsync.before_step(st)
    _finalize(st)
    res = st.optimizer.step(st.run.trainer.optimizer.clip_grad)
    tm.add("optimizer", a)
    return res


def _global_figures(st: TrainState, tally: Tally) -> list:
    """[loss sum, MoE aux loss, image tokens, audio tokens] over the whole global batch (a world all-reduce,
    except in the reference)."""
    aux = _moe_aux(st)
    if contributes(st):
        vals = [tally.loss_sum, aux, tally.tokens.get("image", 0), tally.tokens.get("audio", 0)]
    else:
        vals = [0.0, 0.0, 0.0, 0.0]
    return vals if st.reference else world_sum(st, vals)

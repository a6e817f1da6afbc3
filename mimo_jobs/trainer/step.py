"""One training iteration, heterogeneous (encoder ranks | LLM ranks) or the one-process reference.

Per iteration:
  data      every rank draws the iteration's microbatches for its lanes (deterministic streams);
  tokens    N = loss-bearing tokens of the whole global batch, all-reduced over the world, so every rank
            scales by the same 1/N (per-token loss; DDP sums): gradients do not depend on enc_dp/llm_dp
            or on which encoder ranks saw images (upstream-mimo §1.9);
  encoder   forward of every microbatch (sent over the bridge as soon as it is ready), then backward of
            each as its gradient comes back;
  LLM       per microbatch: receive image embeddings, scatter them into the image-token positions,
            forward, per-token loss * mask summed / N, backward, send the embedding gradient back;
  finalize  per-module DDP reduce on the module's own groups (finalize_model_grads);
  optimizer MimoOptimizer (global norm, world-wide skip agreement), LR by consumed samples.
The reference runs the same functions in one process: encoder replicas and lanes in a loop, the encoder
output handed to the LLM directly (no bridge), one backward per microbatch.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from .build import TrainState


@dataclass
class StepStats:
    iteration: int
    loss: float  # token-weighted mean over the global batch
    tokens: int
    grad_norm: float | None
    lr: float
    skipped: bool
    nan: bool
    elapsed_s: float
    phases_s: dict = field(default_factory=dict)
    moe_aux_loss: float | None = None
    image_tokens: int = 0
    empty_encoder_microbatches: int = 0  # encoder microbatches with no image at all (this rank)


class _Timer:
    def __init__(self):
        self.acc: dict[str, float] = {}

    def add(self, k: str, dt: float) -> None:
        self.acc[k] = self.acc.get(k, 0.0) + dt


def _tick() -> float:
    return time.perf_counter()


def _causal_mask(s: int, device):
    import torch

    return torch.triu(torch.ones(s, s, dtype=torch.bool, device=device), diagonal=1)[None, None]


def check_alignment(batch, image_token_id: int) -> None:
    """The runtime alignment invariant: placeholder tokens per sample == the image token counts."""
    got = (batch.tokens == image_token_id).sum(dim=1).tolist()
    if got != list(batch.image_token_counts):
        raise RuntimeError(f"lane {batch.lane} microbatch {batch.microbatch}: image placeholder tokens per "
                           f"sample {got} != image_token_counts {batch.image_token_counts}")


def llm_forward(st: TrainState, batch, img_emb):
    """Sum over the lane's loss-bearing tokens of the per-token loss (not yet divided by N)."""

    lm = st.language
    gpt = lm.core
    cfg = gpt.config
    dev = st.device
    tokens = batch.tokens.to(dev)
    emb = gpt.embedding.word_embeddings(tokens)  # [b, s, h], complete on every TP rank
    mask = tokens == st.image_token_id
    if img_emb is not None and img_emb.shape[0] > 0:
        # masked_scatter fills positions in row-major order: sample 0's image tokens first, as the bridge sends
        emb = emb.masked_scatter(mask.unsqueeze(-1), img_emb.to(emb.dtype))
    dec_in = emb.transpose(0, 1).contiguous()  # mcore wants [s, b, h]
    if cfg.sequence_parallel:
        from megatron.core.tensor_parallel.mappings import scatter_to_sequence_parallel_region

        dec_in = scatter_to_sequence_parallel_region(dec_in, group=lm.pgc.tp)
    labels = batch.labels.to(dev).clamp(min=0)  # masked positions carry IGNORE_INDEX; loss_mask drops them
    per_token = lm.model(input_ids=None, position_ids=batch.position_ids.to(dev),
                         attention_mask=_causal_mask(tokens.shape[1], dev), decoder_input=dec_in, labels=labels)
    return (per_token.float() * batch.loss_mask.to(dev)).sum()


def encoder_forward(st: TrainState, images: list):
    """Flat embeddings [sum N_i, H] of the images present (None entries are text-only samples)."""
    import torch

    ims = [im.to(st.device) for im in images if im is not None]
    enc = st.encoder
    if not ims:
        return torch.zeros(0, st.preset.llm.hidden_size, dtype=st.prec.dtype, device=st.device)
    if enc.frozen:
        with torch.no_grad():
            return enc.model(ims)
    return enc.model(ims)


def _encoder_samples(st: TrainState, lane_batches: dict, segs):
    """This encoder replica's samples of one microbatch, in global order: (images, keys, counts)."""
    images, keys, counts = [], [], []
    for g in segs:
        b = lane_batches[g.lane]
        sl = slice(g.lane_start, g.lane_start + g.n)
        images += (b.images or [None] * len(b.sample_keys))[sl]
        keys += b.sample_keys[sl]
        counts += b.image_token_counts[sl]
    return images, keys, counts


def _zero_grads(st: TrainState) -> None:
    for m in (st.encoder, st.language):
        if m is not None and m.ddp is not None:
            m.ddp.zero_grad_buffer()
    st.optimizer.zero_grad()


def _finalize(st: TrainState) -> None:
    from megatron.core.distributed.finalize_model_grads import finalize_model_grads

    for m in (st.encoder, st.language):
        if m is not None and m.ddp is not None:
            finalize_model_grads([m.ddp], pg_collection=m.pgc)


def _world_sum(st: TrainState, values: list[float]) -> list[float]:
    import torch
    import torch.distributed as dist

    t = torch.tensor(values, dtype=torch.float64 if st.device == "cpu" else torch.float32, device=st.device)
    dist.all_reduce(t)
    return t.tolist()


def _moe_aux(st: TrainState) -> float:
    """Mean over layers of the load-balancing loss summed over this iteration's microbatches; cleared."""
    if not st.preset.llm.num_experts or st.language is None:
        return 0.0
    from megatron.core.transformer.moe.moe_utils import (
        clear_aux_losses_tracker,
        get_moe_layer_wise_logging_tracker,
    )

    tr = get_moe_layer_wise_logging_tracker()
    v = 0.0
    for x in tr.values():
        vals = x["values"]
        if _sp_size(st) > 1:  # with sequence parallelism each TP rank holds its shard's partial loss
            import torch.distributed as dist

            vals = vals.clone()
            dist.all_reduce(vals, group=st.language.pgc.tp)
        v += float(vals.mean())
    clear_aux_losses_tracker()
    return v


def _sp_size(st: TrainState) -> int:
    cfg = st.language.core.config
    return cfg.tensor_model_parallel_size if cfg.sequence_parallel else 1


def _set_aux_scale(st: TrainState, n_tokens: float) -> None:
    if st.preset.llm.num_experts and st.language is not None:
        import torch
        from megatron.core.transformer.moe.moe_utils import MoEAuxLossAutoScaler

        # Per-token-loss mode: the aux loss gradient is scaled like the main loss (1/N). mcore 0.16.1 weights
        # each rank's (partial, under sequence parallelism) aux loss by its LOCAL token count, which SP
        # divides by the TP size; multiplying back keeps the gradient independent of the LLM's TP size.
        scale = _sp_size(st) / max(n_tokens, 1.0)
        MoEAuxLossAutoScaler.set_loss_scale(torch.tensor(scale, device=st.device))


def train_step(st: TrainState) -> StepStats:
    import torch

    from .bridge import segments_of_encoder

    t0 = _tick()
    tm = _Timer()
    role, plan, M = st.role, st.plan, st.plan.num_microbatches
    step = st.iteration
    lr = st.schedule(st.consumed_samples)
    st.optimizer.set_lr(lr)
    _zero_grads(st)

    # ---- data for the whole iteration
    a = _tick()
    if st.reference:
        lanes = list(range(plan.layout.llm_dp))
    elif role.is_language:
        lanes = [role.dp_rank]
    else:
        lanes = plan.lanes_of_encoder(role.dp_rank)
    batches = [{lane: st.provider.next(lane) for lane in lanes} for _ in range(M)]
    for mb in batches:
        for b in mb.values():
            check_alignment(b, st.image_token_id)
    tm.add("data", _tick() - a)

    # ---- global token count (every rank takes part; LLM lane leaders / the reference contribute)
    local_tokens = 0.0
    if role.is_language and (st.reference or role.is_leader):
        local_tokens = float(sum(float(b.loss_mask.sum()) for mb in batches for b in mb.values()))
    n_tokens = local_tokens if st.reference else _world_sum(st, [local_tokens])[0]
    _set_aux_scale(st, n_tokens)

    loss_sum = 0.0
    img_tokens = 0
    empty_mb = 0
    enc_trains = st.encoder is not None and not st.encoder.frozen
    grads_back = not st.run.trainer.freeze.encoder  # the LLM returns embedding gradients

    if st.reference:
        for m in range(M):
            a = _tick()
            flats, per_lane = [], {}
            for e in range(plan.layout.enc_dp):  # same per-replica image batches as the real encoder ranks
                segs = segments_of_encoder(plan, e)
                images, keys, counts = _encoder_samples(st, batches[m], segs)
                flat = encoder_forward(st, images)
                empty_mb += int(flat.shape[0] == 0)
                row = 0
                for g in segs:
                    n = sum(batches[m][g.lane].image_token_counts[g.lane_start:g.lane_start + g.n])
                    per_lane.setdefault(g.lane, []).append(flat[row:row + n])
                    row += n
                flats.append(flat)
            tm.add("enc_fwd", _tick() - a)
            a = _tick()
            total = None
            for lane in range(plan.layout.llm_dp):
                x = torch.cat(per_lane[lane]) if per_lane.get(lane) else None
                img_tokens += 0 if x is None else x.shape[0]
                ls = llm_forward(st, batches[m][lane], x)
                loss_sum += float(ls.detach())
                total = ls / max(n_tokens, 1.0) if total is None else total + ls / max(n_tokens, 1.0)
            tm.add("llm_fwd", _tick() - a)
            a = _tick()
            if total.requires_grad:
                total.backward()
            tm.add("llm_bwd", _tick() - a)
    elif role.is_encoder:
        segs = segments_of_encoder(plan, role.dp_rank)
        br = st.bridge
        saved = []
        for m in range(M):
            a = _tick()
            images, keys, counts = _encoder_samples(st, batches[m], segs)
            flat = encoder_forward(st, images)
            empty_mb += int(flat.shape[0] == 0)
            tm.add("enc_fwd", _tick() - a)
            br.send_forward(step, m, flat, keys, counts)
            saved.append((flat, keys, counts))
        if grads_back:
            for m, (flat, keys, counts) in enumerate(saved):
                w0 = br.wait_s
                a = _tick()
                g = br.recv_backward(step, m, keys, counts)
                b0 = _tick()
                tm.add("bridge_wait", br.wait_s - w0)
                if enc_trains and flat.shape[0] > 0:
                    flat.backward(g.to(flat.dtype))
                tm.add("enc_bwd", _tick() - b0)
        a = _tick()
        br.finish()
        tm.add("bridge_wait", _tick() - a)
    else:  # language ranks
        br = st.bridge
        lane = role.dp_rank
        for m in range(M):
            b = batches[m][lane]
            w0 = br.wait_s
            x = br.recv_forward(step, m, b.sample_keys, b.image_token_counts)
            tm.add("bridge_wait", br.wait_s - w0)
            img_tokens += x.shape[0]
            if grads_back:
                x = x.detach().requires_grad_(True)
            a = _tick()
            ls = llm_forward(st, b, x)
            loss_sum += float(ls.detach())
            tm.add("llm_fwd", _tick() - a)
            a = _tick()
            scaled = ls / max(n_tokens, 1.0)
            if scaled.requires_grad:
                scaled.backward()
            tm.add("llm_bwd", _tick() - a)
            if grads_back:
                g = x.grad if x.grad is not None else torch.zeros_like(x)
                br.send_backward(step, m, g, b.sample_keys, b.image_token_counts)
        a = _tick()
        br.finish()
        tm.add("bridge_wait", _tick() - a)

    a = _tick()
    _finalize(st)
    res = st.optimizer.step(st.run.trainer.optimizer.clip_grad)
    tm.add("optimizer", _tick() - a)

    # ---- figures for the log: loss over the whole global batch (LLM lane leaders contribute)
    aux = _moe_aux(st)
    contrib = role.is_language and (st.reference or role.is_leader)
    vals = [loss_sum if contrib else 0.0, aux if contrib else 0.0, img_tokens if contrib else 0.0]
    if not st.reference:
        vals = _world_sum(st, vals)
    st.iteration += 1
    st.consumed_samples += plan.layout.gbs
    elapsed = _tick() - t0
    lanes_total = plan.layout.llm_dp
    return StepStats(
        iteration=st.iteration, loss=vals[0] / max(n_tokens, 1.0), tokens=int(n_tokens),
        grad_norm=res.grad_norm, lr=lr, skipped=res.skipped, nan=res.nan, elapsed_s=elapsed,
        phases_s=dict(tm.acc),
        moe_aux_loss=vals[1] / (M * lanes_total) if st.preset.llm.num_experts else None,
        image_tokens=int(vals[2]), empty_encoder_microbatches=empty_mb)



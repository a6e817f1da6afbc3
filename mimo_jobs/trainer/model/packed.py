"""Packed rows in the LLM: attention and rotary positions that stay within each packed sample.

A packed row (data/packing.py) holds several samples end to end; `segment_ids` says which sample each
position belongs to. Two things make the row compute what each sample would alone:
  attention  a block-diagonal causal mask: a position attends to the earlier positions of its own sample;
  positions  RoPE at each sample's own positions (0, 1, ...: the batch's position_ids) rather than at the
             row's; megatron-core's GPTModel takes RoPE from the row index, so `rotary_at` makes it read the
             position ids for that forward.

Which attention honours the mask (megatron-core 0.19, restated from its sources): the local layers' torch
SDPA core (sdpa.py) passes it to scaled_dot_product_attention; their DotProductAttention (trainer.attention:
unfused) with the unfused softmax applies an explicit boolean mask (True = masked) to the
scores; the fused causal softmax (fusions/fused_softmax.py, fp16/bf16 with scaled_masked_softmax_cuda)
and Transformer Engine's causal attention build their own causal mask and ignore an explicit one. There a
packed row would attend across samples, so `packing_problem` refuses them; megatron-core's PackedSeqParams
(the THD layout with cu_seqlens, Transformer Engine only) is that backend's way and is not built here.
"""

from __future__ import annotations

import contextlib

import torch


def packed_mask(segment_ids: torch.Tensor) -> torch.Tensor:
    """[b, 1, s, s] bool, True where attention is masked: a later position, or another sample's."""
    s = segment_ids.shape[1]
    later = torch.triu(torch.ones(s, s, dtype=torch.bool, device=segment_ids.device), diagonal=1)
    other = segment_ids[:, :, None] != segment_ids[:, None, :]
    return (later[None] | other)[:, None]


@contextlib.contextmanager
def rotary_at(gpt, position_ids: torch.Tensor):
    """For the forwards inside, `gpt`'s RoPE is taken at `position_ids` ([b, s]) rather than at 0..s-1:
    [s, b, 1, d] frequencies gathered from its own table, which megatron-core's rotary application
    broadcasts over the heads. A position's frequencies are the ones the table gives that position."""
    rope = getattr(gpt, "rotary_pos_emb", None)
    if rope is None:  # no RoPE (learned absolute positions read position_ids themselves)
        yield
        return
    table = rope.forward

    def at_positions(max_seq_len, offset=0, packed_seq=False, cp_group=None):
        full = table(int(position_ids.max()) + 1, 0, packed_seq, cp_group)  # [L, 1, 1, d]
        return full[:, 0][position_ids.t()]  # [s, b, 1, d]

    rope.forward = at_positions
    try:
        yield
    finally:
        del rope.forward


def packing_problem(kernels) -> str | None:
    """Why packed rows cannot run on these kernels (None: they can): study/runtime_rules.packing_problem,
    the rule validate applies with the layers a study is planned on, asked of the kernels this rank built."""
    from mimo_jobs.study.runtime_rules import packing_problem as rule

    found = rule(kernels.backend, kernels.attention, bool(kernels.on.get("masked_softmax_fusion")))
    return None if found is None else str(found)

"""One process: megatron-core's local DotProductAttention (the core of the trainer's local layers, built with
the trainer's config keys: no dropout, no masked-softmax fusion) on the CPU, in fp32 and in bf16, and the
bytes autograd keeps for its backward (the trainer's SavedTensorMeter).

`python attention_worker.py OUT_JSON SEQ HEADS HEAD_DIM` writes {dtype: {"saved": bytes, "inputs": bytes}}:
the peak saved bytes over one forward of one sequence with a boolean causal mask, and the bytes of the
query, key, value and mask tensors among them (what the attention keeps beside its scores).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main(out: str, seq: int, heads: int, head_dim: int) -> None:
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.transformer_config import TransformerConfig

    from mimo_jobs.trainer import cuda_shims
    from mimo_jobs.trainer.observe.memory import SavedTensorMeter

    cuda_shims.install()
    os.environ.update(WORLD_SIZE="1", RANK="0")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    model_parallel_cuda_manual_seed(0)  # the dropout's RNG fork (a no-op dropout still forks)
    got = {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        cfg = TransformerConfig(
            num_layers=1,
            hidden_size=heads * head_dim,
            num_attention_heads=heads,
            bf16=dtype == torch.bfloat16,
            params_dtype=dtype,
            attention_dropout=0.0,
            hidden_dropout=0.0,
            masked_softmax_fusion=False,
        )
        core = DotProductAttention(cfg, 1, AttnMaskType.causal, "self")
        g = torch.Generator().manual_seed(0)
        q, k, v = (
            torch.randn(seq, 1, heads, head_dim, generator=g, dtype=dtype).requires_grad_() for _ in range(3)
        )
        mask = torch.ones(1, 1, seq, seq, dtype=torch.bool).triu(1)  # True: masked out
        meter = SavedTensorMeter()
        with meter.hooks():
            y = core(q, k, v, mask)
        y.float().sum().backward()
        inputs = sum(t.numel() * t.element_size() for t in (q, k, v, mask))
        got[name] = {"saved": meter.peak, "inputs": inputs}
    Path(out).write_text(json.dumps(got))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))

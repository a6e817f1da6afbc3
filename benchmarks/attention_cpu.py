"""The local layers' two core attentions on the CPU, by count (no clock): the bytes autograd keeps for
backward and the FLOPs of one forward + backward, torch's SDPA (trainer.attention: sdpa,
trainer/model/sdpa.py) against megatron-core 0.19.2's unfused DotProductAttention (trainer.attention:
unfused), on one causal sequence per length. Prints figures; asserts nothing (the s-not-s^2 growth is a test:
tests/trainer/test_sdpa_attention.py).

    python benchmarks/attention_cpu.py [--seqs 512 1024 2048 4096] [--heads 8] [--groups 8] [--head-dim 64]

saved   the peak bytes the trainer's SavedTensorMeter counts over the forward (q, k and v included);
FLOPs   torch.utils.flop_counter.FlopCounterMode. torch registers no formula for the CPU flash kernel
        (aten._scaled_dot_product_flash_attention_for_cpu and its backward), so this maps them to torch's own
        SDPA formulas (flop_counter.sdpa_flop_count / sdpa_backward_flop_count), as it counts the CUDA
        kernels: neither side discounts the causal half, and the flash backward recomputes Q K^T (5 matrix
        products against the unfused core's 4).
"""

from __future__ import annotations

import argparse
import os


def _setup() -> None:
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    from mimo_jobs.trainer import cuda_shims

    cuda_shims.install()
    os.environ.update(WORLD_SIZE="1", RANK="0")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    model_parallel_cuda_manual_seed(0)


def _flop_formulas() -> dict:
    import torch
    from torch.utils import flop_counter as fc

    aten = torch.ops.aten

    def fwd(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs):
        return fc.sdpa_flop_count(query_shape, key_shape, value_shape)

    def bwd(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs):
        return fc.sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)

    return {
        aten._scaled_dot_product_flash_attention_for_cpu: fwd,
        aten._scaled_dot_product_flash_attention_for_cpu_backward: bwd,
    }


def measure(core, s: int, heads: int, groups: int, head_dim: int) -> tuple[int, int]:
    """(peak saved bytes, FLOPs of forward + backward) of one causal sequence of length s."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from mimo_jobs.trainer.observe.memory import SavedTensorMeter
    from mimo_jobs.trainer.step.common import _causal_mask

    g = torch.Generator().manual_seed(s)
    q = torch.randn(s, 1, heads, head_dim, generator=g).requires_grad_()
    k, v = (torch.randn(s, 1, groups, head_dim, generator=g).requires_grad_() for _ in range(2))
    meter = SavedTensorMeter()
    with FlopCounterMode(display=False, custom_mapping=_flop_formulas()) as flops:
        with meter.hooks():
            y = core(q, k, v, _causal_mask(s, "cpu"))
        y.sum().backward()
    return meter.peak, flops.get_total_flops()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seqs", type=int, nargs="+", default=[512, 1024, 2048, 4096])
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=64)
    a = ap.parse_args(argv)
    _setup()
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.transformer_config import TransformerConfig

    from mimo_jobs.trainer.model.sdpa import SDPAttention

    cfg = TransformerConfig(
        num_layers=1,
        hidden_size=a.heads * a.head_dim,
        num_attention_heads=a.heads,
        num_query_groups=a.groups,
        attention_dropout=0.0,
        hidden_dropout=0.0,
        masked_softmax_fusion=False,
    )
    cores = {c.__name__: c(cfg, 1, AttnMaskType.causal, "self") for c in (DotProductAttention, SDPAttention)}
    mib = 1024**2
    print(f"fp32, batch 1, {a.heads} heads, {a.groups} query groups, head dim {a.head_dim}, causal")
    print(
        f"{'seq':>6} {'saved unfused':>14} {'saved sdpa':>11} {'ratio':>7} {'GFLOP unfused':>14} {'GFLOP sdpa':>11} "
        f"{'ratio':>7}"
    )
    for s in a.seqs:
        (su, fu), (ss, fs) = (measure(c, s, a.heads, a.groups, a.head_dim) for c in cores.values())
        print(
            f"{s:>6} {su / mib:>10.1f} MiB {ss / mib:>7.1f} MiB {ss / su:>7.3f} {fu / 1e9:>14.2f} "
            f"{fs / 1e9:>11.2f} {fs / fu:>7.3f}"
        )


if __name__ == "__main__":
    main()

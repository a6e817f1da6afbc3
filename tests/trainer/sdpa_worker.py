"""One process: the local layers' SDPA core attention (trainer/model/sdpa.py) against megatron-core 0.19.2's
unfused DotProductAttention on the same inputs (CPU, fp32), the bytes autograd keeps for each at s and 2s
(the trainer's SavedTensorMeter), and the core attention the trainer's layer specs build per setting.

`python sdpa_worker.py OUT_JSON` writes {"cases": {name: {...max differences}}, "saved": {...},
"built": {...}}.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def _setup():
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    from mimo_jobs.trainer import cuda_shims

    cuda_shims.install()
    os.environ.update(WORLD_SIZE="1", RANK="0")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    model_parallel_cuda_manual_seed(0)  # DotProductAttention's dropout forks the model-parallel RNG


def _config(heads: int, groups: int, head_dim: int, **kw):
    from megatron.core.transformer.transformer_config import TransformerConfig

    return TransformerConfig(
        num_layers=1,
        hidden_size=heads * head_dim,
        num_attention_heads=heads,
        num_query_groups=groups,
        attention_dropout=kw.pop("attention_dropout", 0.0),
        hidden_dropout=0.0,
        masked_softmax_fusion=False,
        **kw,
    )


def _pair(cfg, mask_type):
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    from mimo_jobs.trainer.model.sdpa import SDPAttention

    return DotProductAttention(cfg, 1, mask_type, "self"), SDPAttention(cfg, 1, mask_type, "self")


def _inputs(s: int, b: int, heads: int, groups: int, head_dim: int, seed: int):
    import torch

    g = torch.Generator().manual_seed(seed)
    q = torch.randn(s, b, heads, head_dim, generator=g)
    k = torch.randn(s, b, groups, head_dim, generator=g)
    v = torch.randn(s, b, groups, head_dim, generator=g)
    dy = torch.randn(s, b, heads * head_dim, generator=g)
    return q, k, v, dy


def _run(core, q, k, v, dy, mask):
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    y = core(q, k, v, mask)
    y.backward(dy)
    return y.detach(), q.grad, k.grad, v.grad


def _compare(ref, got) -> dict:
    names = ("out", "dq", "dk", "dv")
    return {
        "shape_equal": all(a.shape == b.shape for a, b in zip(ref, got, strict=True)),
        "max_abs": {n: float((a - b).abs().max()) for n, a, b in zip(names, ref, got, strict=True)},
        "max_ref": max(float(a.abs().max()) for a in ref),
    }


def _cases() -> dict:
    import torch
    from megatron.core.transformer.enums import AttnMaskType

    from mimo_jobs.trainer.model.packed import packed_mask
    from mimo_jobs.trainer.step.common import _causal_mask

    s, hd = 24, 8
    segments = torch.tensor([[0] * 10 + [1] * 9 + [2] * 5, [0] * 3 + [1] * 21])  # two packed rows
    cases = {
        # name: (heads, groups, batch, mask type, mask, config extras)
        "causal": (4, 4, 2, AttnMaskType.causal, _causal_mask(s, "cpu"), {}),
        "causal_gqa": (4, 2, 2, AttnMaskType.causal, _causal_mask(s, "cpu"), {}),
        "causal_mqa_scale": (4, 1, 1, AttnMaskType.causal, _causal_mask(s, "cpu"), {"softmax_scale": 0.3}),
        "causal_no_mask_given": (4, 2, 1, AttnMaskType.causal, None, {}),
        "packed": (4, 4, 2, AttnMaskType.causal, packed_mask(segments), {}),
        "packed_gqa": (4, 2, 2, AttnMaskType.causal, packed_mask(segments), {}),
        "bidirectional": (4, 4, 2, AttnMaskType.no_mask, torch.zeros(1, 1, s, s, dtype=torch.bool), {}),
    }
    out = {}
    for i, (name, (heads, groups, b, mtype, mask, extra)) in enumerate(cases.items()):
        ref_core, sdpa_core = _pair(_config(heads, groups, hd, **extra), mtype)
        q, k, v, dy = _inputs(s, b, heads, groups, hd, seed=i)
        # no mask on a causal layer: megatron-core builds the causal mask itself, on "cuda" (not on the CPU)
        ref = _run(ref_core, q, k, v, dy, _causal_mask(s, "cpu") if mask is None else mask)
        got = _run(sdpa_core, q, k, v, dy, mask)
        out[name] = _compare(ref, got)
    out["dropout"] = _dropout(s, hd)
    out["masks"] = _masks(s, segments)
    return out


def _masks(s: int, segments) -> dict:
    """What each mask becomes, and that every layer of a forward gets the same additive mask object."""
    import torch
    from megatron.core.transformer.enums import AttnMaskType

    from mimo_jobs.trainer.model.packed import packed_mask
    from mimo_jobs.trainer.model.sdpa import sdpa_mask
    from mimo_jobs.trainer.step.common import _causal_mask

    causal, none = AttnMaskType.causal, AttnMaskType.no_mask
    packed = packed_mask(segments)
    first, second = (sdpa_mask(packed, causal, s, s, torch.float32)[0] for _ in range(2))
    return {
        "causal": sdpa_mask(_causal_mask(s, "cpu"), causal, s, s) == (None, True),
        "all_false": sdpa_mask(torch.zeros(1, 1, s, s, dtype=torch.bool), none, s, s) == (None, False),
        "none_on_causal_layer": sdpa_mask(None, causal, s, s) == (None, True),
        "none_on_unmasked_layer": sdpa_mask(None, none, s, s) == (None, False),
        "packed_is_additive": bool((first == float("-inf")).eq(packed).all())
        and first.dtype == torch.float32,
        "packed_read_once": first is second,
    }


def _dropout(s: int, hd: int) -> dict:
    """The config's attention dropout: applied in training (a different output from the same inputs in eval
    mode), off in eval mode (equal to the reference's eval output)."""
    import torch
    from megatron.core.transformer.enums import AttnMaskType

    from mimo_jobs.trainer.step.common import _causal_mask

    ref_core, sdpa_core = _pair(_config(4, 4, hd, attention_dropout=0.5), AttnMaskType.causal)
    q, k, v, dy = _inputs(s, 1, 4, 4, hd, seed=99)
    mask = _causal_mask(s, "cpu")
    with torch.no_grad():
        trained = sdpa_core(q, k, v, mask)
        ref_core.eval(), sdpa_core.eval()
        ref_eval, sdpa_eval = ref_core(q, k, v, mask), sdpa_core(q, k, v, mask)
    return {
        "p": sdpa_core.dropout_p,
        "train_differs_from_eval": float((trained - sdpa_eval).abs().max()),
        "eval_max_abs": float((ref_eval - sdpa_eval).abs().max()),
    }


def _saved(seqs: tuple[int, ...]) -> dict:
    """Peak bytes autograd keeps over one forward of each core (q, k, v and the mask among them)."""
    from megatron.core.transformer.enums import AttnMaskType

    from mimo_jobs.trainer.observe.memory import SavedTensorMeter
    from mimo_jobs.trainer.step.common import _causal_mask

    heads, hd = 4, 16
    out: dict = {"unfused": {}, "sdpa": {}}
    ref_core, sdpa_core = _pair(_config(heads, heads, hd), AttnMaskType.causal)
    for s in seqs:
        q, k, v, dy = _inputs(s, 1, heads, heads, hd, seed=s)
        for name, core in (("unfused", ref_core), ("sdpa", sdpa_core)):
            meter = SavedTensorMeter()
            qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
            with meter.hooks():
                y = core(qq, kk, vv, _causal_mask(s, "cpu"))
            y.backward(dy)
            out[name][str(s)] = meter.peak
    return out


def _built() -> dict:
    """The core attention class of the trainer's LLM and ViT layer specs per trainer.attention."""
    from mimo_jobs.model.presets import PRESETS
    from mimo_jobs.trainer.model import models as M
    from mimo_jobs.trainer.model.kernels import Installed, kernels_for

    got = {}
    for attention in ("sdpa", "unfused"):
        prec = M.Precision(use_gpu=False, bf16=False, kernels=kernels_for(False, Installed(), attention))
        cfg = M.llm_config(PRESETS["tiny-moe"], 1, 1, 1, prec)
        llm = M.llm_layer_spec(cfg, prec).layer_specs
        vit, _, _ = M.encoder_layer_specs(prec)
        got[attention] = {
            "llm": sorted({s.submodules.self_attention.submodules.core_attention.__name__ for s in llm}),
            "vit": vit.submodules.self_attention.submodules.core_attention.__name__,
            "describe": prec.kernels.describe(),
        }
    return got


def main(out: str) -> None:
    _setup()
    result = {"cases": _cases(), "saved": _saved((256, 512)), "built": _built()}
    Path(out).write_text(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1])

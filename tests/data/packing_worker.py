"""One process: the trainer's real models (the --reference build) on the same samples packed and unpacked.

`python packing_worker.py RUN_YAML OUT_JSON K` draws K samples one per row (one microbatch of K rows) and
the packed rows that hold exactly those K samples (energon's packing over a buffer of K, one row per
microbatch), runs the trainer's own embed/llm_forward and backward on each, and writes for every
variant the summed loss and every parameter's gradient difference from the unpacked run:
  packed          the packed rows as the trainer gets them (block-diagonal mask, positions per sample)
  leaky           the same rows without segment_ids: causal over the whole row (attention and RoPE
                  positions cross the samples), what a trainer that ignored packing would compute
  mask_leak       the packed rows with a causal mask over the whole row (positions still per sample)
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path


def main(run_yaml: str, out: str, k: int) -> None:
    import torch

    from mimo_jobs.data.energon_provider import EnergonProvider, LoaderConfig
    from mimo_jobs.trainer.build import build_state
    from mimo_jobs.trainer.main import _init_dist, _install_cpu_shims, _load_run
    from mimo_jobs.trainer.step.common import embed, llm_forward
    from mimo_jobs.trainer.step.iteration import _zero_grads

    run, _doc = _load_run(Path(run_yaml))
    _install_cpu_shims(run)
    _, timeout = _init_dist(run, True)
    plan = run.rank_layout()
    st = build_state(run, plan, True, timeout)
    cfg = LoaderConfig.from_run(run, plan)
    unpacked = EnergonProvider(dataclasses.replace(cfg, mbs=k, packing=False), [0], need_images=True)
    packed = EnergonProvider(
        dataclasses.replace(cfg, mbs=1, packing=True, packing_buffer_size=k), [0], need_images=True
    )
    one = unpacked.next(0)
    rows, keys = [], []
    while len(keys) < k:
        b = packed.next(0)
        rows.append(b)
        keys += b.sample_keys[0].split("+")
    assert keys == one.sample_keys, (keys, one.sample_keys)

    params = {
        f"{m.name}.{n}": p
        for m in (*st.encoders, st.language)
        for n, p in m.core.named_parameters()
        if p.requires_grad
    }

    def step(batches) -> tuple[float, dict]:
        _zero_grads(st)
        total = 0.0
        for b in batches:
            loss = llm_forward(st, b, {"vision": embed(st, st.module_named("vision"), b.items("vision"))})
            loss.backward()
            total += float(loss.detach())
        grads = {}
        for n, p in params.items():
            g = getattr(p, "main_grad", None)
            grads[n] = (g if g is not None else p.grad).detach().clone()
        return total, grads

    ref_loss, ref = step([one])
    result = {
        "rows": len(rows),
        "samples": k,
        "image_tokens": sum(one.counts("vision")),
        "loss_tokens": float(one.loss_mask.sum()),
        "packed_loss_tokens": float(sum(b.loss_mask.sum() for b in rows)),
        "unpacked": {"loss": ref_loss},
    }
    import mimo_jobs.trainer.model.packed as packed_mod

    block_diagonal = packed_mod.packed_mask

    def causal_only(segment_ids):  # positions still per sample; attention over the whole row
        return block_diagonal(torch.zeros_like(segment_ids))

    variants = {
        "packed": (rows, block_diagonal),
        "leaky": ([dataclasses.replace(b, segment_ids=None) for b in rows], block_diagonal),
        "mask_leak": (rows, causal_only),
    }
    for name, (batches, mask_fn) in variants.items():
        packed_mod.packed_mask = mask_fn
        loss, grads = step(batches)
        packed_mod.packed_mask = block_diagonal
        worst = max(
            params, key=lambda n: float((grads[n] - ref[n]).abs().max() / ref[n].abs().max().clamp(min=1e-30))
        )
        result[name] = {
            "loss": loss,
            # per parameter: largest |difference| relative to that gradient's largest |entry|
            "grad_rel": {
                n: float((grads[n] - ref[n]).abs().max() / ref[n].abs().max().clamp(min=1e-30))
                for n in params
            },
            "worst": worst,
            "grad_zero": [n for n in params if float(ref[n].abs().max()) == 0.0],
        }
    unpacked.close()
    packed.close()
    torch.distributed.destroy_process_group()
    Path(out).write_text(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))

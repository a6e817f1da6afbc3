"""One process: build the trainer's real models (the --reference build) and measure them.

`python measure_worker.py RUN_YAML OUT_JSON SEQ IMAGE_SIDE` writes {module: params}, the FLOPs
`torch.utils.flop_counter.FlopCounterMode` counts for one forward+backward of the LLM on one sequence of SEQ
tokens and of the encoder on one IMAGE_SIDE x IMAGE_SIDE image, and the peak bytes the trainer's
SavedTensorMeter sees during each, for each trainer.attention of the local layers:
{attention: {params, flops, saved_peak_bytes}}. torch's FlopCounterMode has no formula for the CPU flash
attention SDPA runs (aten._scaled_dot_product_flash_attention_for_cpu): its attention FLOPs are not counted.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path


def _measure(fn, meter):
    from torch.utils.flop_counter import FlopCounterMode

    meter.live = meter.peak = 0
    with FlopCounterMode(display=False) as fc, meter.hooks():
        loss = fn()
    with FlopCounterMode(display=False) as fcb:
        loss.backward()
    return fc.get_total_flops() + fcb.get_total_flops(), meter.peak


def main(run_yaml: str, out: str, seq: int, side: int) -> None:
    from mimo_jobs.trainer.main import _init_dist, _install_cpu_shims, _load_run

    run, _doc = _load_run(Path(run_yaml))
    _install_cpu_shims()
    _, timeout = _init_dist(run, True)
    got = {}
    for attention in ("sdpa", "unfused"):
        each = replace(run, trainer=run.trainer.model_copy(update={"attention": attention}))
        got[attention] = _measure_build(each, timeout, seq, side)
    Path(out).write_text(json.dumps(got))


def _measure_build(run, timeout, seq: int, side: int) -> dict:
    import torch

    from mimo_jobs.trainer.build import build_state
    from mimo_jobs.trainer.observe.memory import SavedTensorMeter
    from mimo_jobs.trainer.step.common import _causal_mask

    st = build_state(run, run.rank_layout(), True, timeout)
    enc, llm = st.encoders[0].core, st.language.core
    meter = SavedTensorMeter(list(enc.parameters()) + list(llm.parameters()))
    g = torch.Generator().manual_seed(0)
    vocab = st.preset.llm.vocab_size
    tokens = torch.randint(2, vocab - 1, (1, seq), generator=g)

    def llm_step():
        logits_loss = st.language.model(
            input_ids=tokens,
            position_ids=torch.arange(seq)[None],
            attention_mask=_causal_mask(seq, "cpu"),
            labels=tokens,
        )
        return logits_loss.float().sum()

    img = torch.randn(st.preset.encoder.channels, side, side, generator=g)

    def enc_step():
        return st.encoders[0].model([img]).float().sum()

    llm_flops, llm_peak = _measure(llm_step, meter)
    enc_flops, enc_peak = _measure(enc_step, meter)
    return {
        "params": {
            "encoder": sum(p.numel() for p in enc.parameters()),
            "llm": sum(p.numel() for p in llm.parameters()),
        },
        "flops": {"encoder": enc_flops, "llm": llm_flops},
        "saved_peak_bytes": {"encoder": enc_peak, "llm": llm_peak},
    }


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))

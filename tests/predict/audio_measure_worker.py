"""One process: build the trainer's audio encoder (trainer/model/audio_encoder.py) on a one-rank gloo group
and measure it.

`python audio_measure_worker.py ARCH_JSON FRAMES OUT_JSON [TP]` writes the numel of each parameter in
registration order (and whether it trains), and the FLOPs `torch.utils.flop_counter.FlopCounterMode` counts
for one forward + backward of one clip of FRAMES log-mel frames through the encoder and a projector of the
trainer's kind (megatron-core's MultimodalProjector, encoder width -> LLM width given in ARCH_JSON), and the
peak bytes the trainer's SavedTensorMeter sees autograd keep during that forward (the encoder's own share and
the projector's). Under
torchrun with TP ranks (a TP group of them), TP rank 0 writes its shard's parameters and FLOPs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "weights"))


def main(arch_json: str, frames: int, out: str, tp: int = 1) -> None:
    import torch
    from hf_worker import _grids
    from megatron.core.models.vision.multimodal_projector import MultimodalProjector
    from megatron.core.transformer.transformer_config import TransformerConfig
    from torch.utils.flop_counter import FlopCounterMode

    import mimo_jobs.trainer.model.models as M
    from mimo_jobs.model.audio_arch import AudioArch
    from mimo_jobs.trainer import cuda_shims
    from mimo_jobs.trainer.model.audio_encoder import audio_config, build_audio_encoder
    from mimo_jobs.trainer.model.kernels import Installed, kernels_for
    from mimo_jobs.trainer.observe.memory import SavedTensorMeter

    cuda_shims.install()
    doc = json.loads(Path(arch_json).read_text())
    a, llm_hidden = AudioArch.from_dict(doc["audio"]), doc["llm_hidden"]
    grids, _, _ = _grids(tp, 1, 1)
    pgc = grids.encoders["vision"].pgc
    # the unfused core attention: FlopCounterMode counts its matrix products, and has no formula for the CPU
    # flash attention of trainer.attention: sdpa
    prec = M.Precision(use_gpu=False, bf16=False, kernels=kernels_for(False, Installed(), "unfused"))
    enc = build_audio_encoder(a, audio_config(a, tp, prec), pgc, prec)
    # the projector's config as models.py builds the image encoder's
    cfg = TransformerConfig(
        num_layers=1,
        hidden_size=llm_hidden,
        num_attention_heads=tp,
        ffn_hidden_size=llm_hidden,
        tensor_model_parallel_size=tp,
        **M._base_kwargs(prec),
    )
    _, proj_sub, _ = M.encoder_layer_specs(prec)
    proj = MultimodalProjector(cfg, proj_sub, "mlp", input_size=a.out_width, tp_group=pgc.tp)
    clip = torch.randn(a.num_mel_bins, frames, generator=torch.Generator().manual_seed(0))
    meter = SavedTensorMeter([*enc.parameters(), *proj.parameters()])
    meter.watch("encoder", enc)
    with FlopCounterMode(display=False) as fwd, meter.hooks():
        y = proj(enc([clip])[:, None]).float().sum()
    with FlopCounterMode(display=False) as bwd:
        y.backward()
    if pgc.tp.rank() != 0:
        return
    Path(out).write_text(
        json.dumps(
            {
                "tensors": [[p.numel(), p.requires_grad] for p in enc.parameters()],
                "projector": [p.numel() for p in proj.parameters()],
                "flops": fwd.get_total_flops() + bwd.get_total_flops(),
                "saved_peak_bytes": meter.peak,
                "saved_encoder_peak_bytes": meter.module_peak["encoder"],
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]) if len(sys.argv) > 4 else 1)

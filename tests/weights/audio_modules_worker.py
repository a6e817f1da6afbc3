"""Worker of the per-module trainer.init test (one process, or one rank under torchrun): builds every encoder
module of a vision + audio model the way the trainer does (build._build_encoders, with trainer.init.encoders
naming a Whisper directory for the module `audio`), runs the audio module's encoder on clips of the mock
data's lengths and compares each with transformers' own encoder on the directory's weights.

    python audio_modules_worker.py SPEC_JSON     prints `RESULT {...}` on TP rank 0
SPEC: {"dir": Whisper HF directory, "tp": 1, "frames": [mel frames of each clip], "model": trainer.model}
"""

from __future__ import annotations

import json
import os
import sys

from audio_worker import _by_steps, _reference
from hf_worker import SEED, _grids, _rel


def run(spec: dict) -> dict | None:
    import torch
    from safetensors.torch import load_file

    import mimo_jobs.trainer.model.models as M
    from mimo_jobs.model.families import whisper
    from mimo_jobs.model.resolve import arch_of
    from mimo_jobs.study.spec import TrainerSpec
    from mimo_jobs.trainer.build import _build_encoders

    grids, enc_s, _ = _grids(spec.get("tp", 1), 1, 1)
    t = TrainerSpec(
        model=spec["model"],
        seq_length=32,
        train_iters=1,
        seed=SEED,
        init={"encoders": {"audio": spec["dir"]}},
    )
    arch = arch_of(t.model)
    prec = M.Precision(use_gpu=False, bf16=False)
    mods = {m.modality: m for m in _build_encoders(arch, t, grids.encoders["vision"].pgc, enc_s, prec)}
    enc = mods["audio"].core.encoder.eval()
    a = enc.arch
    tensors = load_file(os.path.join(spec["dir"], "model.safetensors"))
    prefix = whisper.encoder_prefix(tensors)
    state = {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
    g = torch.Generator().manual_seed(1)
    clips = [torch.randn(a.num_mel_bins, n, generator=g) for n in spec["frames"]]
    res: dict = {"rel": [], "rows": []}
    with torch.no_grad():
        got = enc(clips)
        at = 0
        for c in clips:
            want = _by_steps(_reference(a, state, c.shape[1]), c[None])[0]
            res["rel"].append(_rel(got[at : at + want.shape[0]], want))
            res["rows"].append(want.shape[0])
            at += want.shape[0]
    return res if grids.encoders["vision"].pgc.tp.rank() == 0 else None


def main(path: str) -> None:
    from mimo_jobs.trainer import cuda_shims

    cuda_shims.install()
    spec = json.loads(open(path).read())
    try:
        res = run(spec)
    except Exception as e:  # noqa: BLE001 - the test reads the line
        import traceback

        traceback.print_exc()
        print(f"ERROR {type(e).__name__}: {e}", flush=True)
        os._exit(3)
    if res is not None:
        print("RESULT " + json.dumps(res), flush=True)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1])

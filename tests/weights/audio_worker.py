"""Worker of the audio encoder tests (one process, or one rank under torchrun): builds the trainer's
Whisper-class encoder (trainer/model/audio_encoder.py) on a gloo TP group, loads a HuggingFace directory
into it, runs clips of several lengths and compares each with transformers' own encoder on the same
weights, then exports the module back to HF tensor names.

    python audio_worker.py SPEC_JSON     prints `RESULT {...}` on TP rank 0
SPEC: {"dir": HF directory, "tp": 1, "frames": [mel frames of each clip], "pooling": 1, "export": DIR}, or
"arch" overrides AudioArch fields of the directory's (a load refused: `RESULT {"error": ...}`);
{"count": config.json dict, "tp": 1}: the built module's parameter total and its position table after the
trainer's init against transformers' (nothing loaded); or a list
of them (one process runs each in turn).
"""

from __future__ import annotations

import json
import os
import sys

from hf_worker import _grids, _rel, _split_disagreements


def _module(a, tp: int):
    import mimo_jobs.trainer.model.models as M
    from mimo_jobs.trainer.model.audio_encoder import audio_config, build_audio_encoder

    grids, _, _ = _grids(tp, 1, 1)
    pgc = grids.encoders["vision"].pgc
    prec = M.Precision(use_gpu=False, bf16=False)
    enc = build_audio_encoder(a, audio_config(a, tp, prec), pgc, prec).eval()
    return enc, pgc, {"tp_rank": pgc.tp.rank(), "tp_size": tp}


def _reference(a, state: dict, frames: int):
    """transformers' encoder over the first rows of the position table: WhisperEncoder (pooling 1) or
    Qwen2-Audio's encoder (pooling 2) built for exactly this clip's length (both take only clips of
    max_source_positions * 2 frames), with the weights of the directory."""
    import transformers as T

    n = a.positions_for_frames(frames)
    common = dict(
        d_model=a.hidden_size,
        encoder_layers=a.num_layers,
        encoder_attention_heads=a.num_attention_heads,
        encoder_ffn_dim=a.ffn_hidden_size,
        num_mel_bins=a.num_mel_bins,
        max_source_positions=n,
    )
    if a.pooling == 1:
        cfg = T.WhisperConfig(**common, decoder_layers=1, decoder_attention_heads=a.num_attention_heads)
        model = T.models.whisper.modeling_whisper.WhisperEncoder(cfg)
    else:
        assert a.pooling == 2, "Qwen2-Audio pools by 2"
        model = T.Qwen2AudioEncoder(T.Qwen2AudioEncoderConfig(**common))
    own = dict(state, **{"embed_positions.weight": state["embed_positions.weight"][:n]})
    model.load_state_dict(own, strict=True)
    return model.eval()


def _by_steps(model, x):
    """transformers' encoder forward written out step by step with its own modules, for an odd clip (its
    forward refuses any length but 2 x max_source_positions; padding an odd clip by a frame would change
    conv2's last window)."""
    import torch.nn.functional as F

    h = F.gelu(model.conv2(F.gelu(model.conv1(x)))).permute(0, 2, 1) + model.embed_positions.weight
    for layer in model.layers:
        h = layer(h, None)
    if hasattr(model, "avg_pooler"):
        h = model.avg_pooler(h.permute(0, 2, 1)).permute(0, 2, 1)
    return model.layer_norm(h)


def run(spec: dict) -> dict | None:
    import torch
    from safetensors.torch import load_file, save_file

    from mimo_jobs.model.families import whisper
    from mimo_jobs.trainer.weights.audio_hf import export_hf, full_parameters, load_hf

    tp = spec.get("tp", 1)
    if "count" in spec:
        import transformers as T

        from mimo_jobs.trainer.model.models import canonical_init_

        a = whisper.audio_arch(spec["count"])
        enc, pgc, cut = _module(a, tp)
        canonical_init_(enc, 7, "audio", **cut)
        enc.reset_positions_()
        full = full_parameters(enc, cut, pgc.tp)
        cfg = T.WhisperConfig(**spec["count"])
        hf = T.models.whisper.modeling_whisper.WhisperEncoder(cfg)
        gap = (full["embed_positions"] - hf.embed_positions.weight).abs().max()
        held = sum(x.numel() for x in full.values())
        return {"held": held, "positions_max_abs": float(gap)} if cut["tp_rank"] == 0 else None

    from mimo_jobs.model.hf_check import HFInitError

    cfg = json.loads(open(os.path.join(spec["dir"], "config.json")).read())
    a = whisper.audio_arch(cfg, pooling=spec.get("pooling", 1))
    a = type(a).from_dict(a.to_dict() | spec.get("arch", {}))
    enc, pgc, cut = _module(a, tp)
    try:
        loaded = load_hf(enc, spec["dir"], cut)
    except HFInitError as e:
        return {"error": e.describe()}
    tensors = load_file(os.path.join(spec["dir"], "model.safetensors"))
    prefix = whisper.encoder_prefix(tensors)
    state = {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
    g = torch.Generator().manual_seed(1)
    clips = [torch.randn(a.num_mel_bins, n, generator=g) for n in spec["frames"]]
    # the TP cuts the layout restates against the ones megatron-core gave the built module
    split = _split_disagreements(enc, whisper.audio_layout(a), cut)
    res: dict = {"loaded": loaded, "rows": [], "rel": [], "split_disagrees": split}
    with torch.no_grad():
        got = enc(clips)
        res["total_rows"] = got.shape[0]
        at = 0
        for c in clips:
            ref = _reference(a, state, c.shape[1])
            steps = _by_steps(ref, c[None])[0]
            if c.shape[1] % 2:
                want = steps
            else:  # transformers' own forward, and the written-out steps agree with it
                want = ref(c[None]).last_hidden_state[0]
                res["steps_rel"] = max(res.get("steps_rel", 0.0), _rel(steps, want))
            mine = got[at : at + want.shape[0]]
            at += want.shape[0]
            res["rows"].append(want.shape[0])
            res["rel"].append(_rel(mine, want))
    out = export_hf(enc, cut, pgc.tp)
    if cut["tp_rank"] != 0:
        return None
    d = spec["export"]
    os.makedirs(d, exist_ok=True)
    save_file(out, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(whisper.audio_config(a), f)
    return res


def main(path: str) -> None:
    from mimo_jobs.trainer import cuda_shims

    cuda_shims.install()
    specs = json.loads(open(path).read())
    for spec in specs if isinstance(specs, list) else [specs]:
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

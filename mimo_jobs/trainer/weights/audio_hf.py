"""The audio encoder's HuggingFace weights (trainer/model/audio_encoder.py's AudioEncoder): a Whisper
directory loaded into a built module (hf_load.py reads it), and a built module's parameters, gathered over
its TP group, as Whisper encoder tensors (names and layouts: mimo_jobs/model/families/whisper.py)."""

from __future__ import annotations

import torch

from mimo_jobs.model import families
from mimo_jobs.model.hf_weights import HFLayout
from mimo_jobs.trainer.model.audio_encoder import AudioEncoder
from mimo_jobs.trainer.model.models import param_shards
from mimo_jobs.trainer.weights.hf_load import load_audio_dir


def load_hf(module: AudioEncoder, path, cut: dict, where: str = "audio encoder weights") -> int:
    """A Whisper HF directory (a WhisperModel, WhisperForConditionalGeneration or WhisperEncoder save) into
    this rank's shard of `module`; `cut` is models.param_shards' keyword arguments (tp_rank, tp_size).
    Its config must describe the module's encoder (the first differing field is named) and every tensor
    must be there with its shape (model/hf_check.py's check_audio, which validate applies too). Returns the
    number of parameters loaded."""
    return load_audio_dir(module, path, cut, where)


def full_parameters(module: AudioEncoder, cut: dict, tp_group) -> dict[str, torch.Tensor]:
    """Every parameter whole (its TP shards gathered over `tp_group`), by canonical name."""
    import torch.distributed as dist

    out = {}
    for _, p, sh in param_shards(module, **cut):
        x = p.detach()
        if sh.dim is not None:
            parts = [torch.empty_like(x) for _ in range(sh.size)]
            dist.all_gather(parts, x.contiguous(), group=tp_group)
            # a rank holds its slice of each of `parts` blocks: put block b of every rank back together
            blocks = [
                torch.cat([r.chunk(sh.parts, sh.dim)[b] for r in parts], sh.dim) for b in range(sh.parts)
            ]
            x = torch.cat(blocks, sh.dim)
        out[sh.cname] = x.clone()
    return out


def hf_tensors(layout: HFLayout, full: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The HF tensors of `layout` cut from whole parameters by canonical name. Rows with no HF tensor (the
    k rows of Whisper's fused QKV bias) are dropped."""
    out: dict[str, torch.Tensor] = {}
    for t in layout.targets.values():
        rows = full[t.name].reshape(t.rows_shape)
        at = 0
        for pc in t.pieces:
            if pc.hf is not None:
                shape = layout.hf_shapes[pc.hf]
                if pc.hf not in out:
                    out[pc.hf] = torch.empty(shape, dtype=rows.dtype)
                part = rows[at : at + pc.rows]
                if pc.whole:
                    out[pc.hf].copy_(part.reshape(shape))
                else:
                    out[pc.hf][pc.start : pc.start + pc.rows] = part.reshape(pc.rows, *shape[1:])
            at += pc.rows
    return out


def export_hf(module: AudioEncoder, cut: dict, tp_group, prefix: str = "") -> dict[str, torch.Tensor]:
    """This module as HF Whisper encoder tensors (names under `prefix`, "" for a WhisperEncoder save);
    every TP rank of `tp_group` must call it."""
    return hf_tensors(
        families.audio(module.arch.kind).layout(module.arch, prefix), full_parameters(module, cut, tp_group)
    )

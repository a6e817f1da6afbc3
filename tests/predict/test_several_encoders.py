"""The planner with several encoders (a vision tower and a Whisper-class audio encoder feeding one LLM):

- the audio encoder's parameters (tensor by tensor, in registration order, the frozen position table
  apart) and FLOPs against the trainer's built module (trainer/model/audio_encoder.py) and torch's
  FlopCounterMode, through the one-process worker audio_measure_worker.py;
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.launch import worker_env
from mimo_jobs.model.audio_arch import AudioArch
from mimo_jobs.predict.flops import audio_clip_flops
from mimo_jobs.predict.params import audio_tensors, projector_of

WORKER = Path(__file__).with_name("audio_measure_worker.py")
# a small Whisper-class encoder; pooling 2 as Qwen2-Audio's audio tower pools
AUDIO = dict(
    kind="whisper",
    num_layers=2,
    hidden_size=32,
    num_attention_heads=4,
    ffn_hidden_size=64,
    num_mel_bins=8,
    max_source_positions=16,
)
LLM_HIDDEN = 48


@pytest.mark.parametrize(("pooling", "frames"), [(1, 32), (2, 31), (2, 10)])
def test_audio_params_and_flops_equal_the_built_module(tmp_path, pooling, frames):
    a = AudioArch(**AUDIO, pooling=pooling)
    spec = tmp_path / "arch.json"
    spec.write_text(json.dumps({"audio": a.to_dict(), "llm_hidden": LLM_HIDDEN}))
    out = tmp_path / "out.json"
    p = subprocess.run(
        [sys.executable, str(WORKER), str(spec), str(frames), str(out)],
        capture_output=True,
        text=True,
        timeout=240,
        env=worker_env(),
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    got = json.loads(out.read_text())
    assert got["tensors"] == [[t.numel, not t.frozen] for t in audio_tensors(a, 1)]
    assert got["projector"] == [t.numel for t in projector_of(a.out_width, LLM_HIDDEN, 1)]
    # the CPU attention is unfused and computes the whole n x n matrix, as the formula prices it (the
    # encoder is bidirectional); conv1's input needs no gradient, conv2's does
    assert audio_clip_flops(a, LLM_HIDDEN, frames) == got["flops"]

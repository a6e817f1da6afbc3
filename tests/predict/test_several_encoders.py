"""The planner with several encoders (a vision tower and a Whisper-class audio encoder feeding one LLM):

- the audio encoder's parameters (tensor by tensor, in registration order, the frozen position table
  apart) and FLOPs against the trainer's built module (trainer/model/audio_encoder.py) and torch's
  FlopCounterMode, and its activation term (activations.audio_bytes) within ACTIVATION_TOLERANCE of the bytes
  the trainer's SavedTensorMeter counts autograd keep in the built encoder and projector, as the vision
  encoder's is measured (test_predict_vs_trainer.py), through the worker audio_measure_worker.py (one
  process; a TP2 group under torchrun);
- a two-encoder study predicted: each module's rank class holds that module's tensors (the audio one's
  gradients and optimizer state without its frozen table), the vision module exactly as the one-encoder
  planner prices it on the same sizes, colocated ranks every module, the step bounded by the slowest module,
  the audio tokens from dataset statistics or the stated prior (said which);
- plan over two encoders: tiling split layouts and a colocated one, within the stated bound;
- the one-encoder figures unchanged (a one-encoder model never takes the module-by-module path).
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from helpers.launch import torchrun, worker_env
from mimo_jobs.contract.datastats import geometry_record
from mimo_jobs.model.attention import UNFUSED
from mimo_jobs.model.audio_arch import AudioArch
from mimo_jobs.model.presets import PRESETS
from mimo_jobs.model.tiling import ImageGeometry
from mimo_jobs.predict import activations, steptime
from mimo_jobs.predict.estimate import modules_json, predict_run, predict_shape
from mimo_jobs.predict.flops import audio_clip_flops
from mimo_jobs.predict.hardware import get_gpu
from mimo_jobs.predict.layouts import MAX_MODULE_SHAPES, best_layouts, candidate_layouts, module_shapes
from mimo_jobs.predict.memory import GRAD_BYTES
from mimo_jobs.predict.params import audio_tensors, module_tensors, projector_of
from mimo_jobs.predict.run import shape_of
from mimo_jobs.predict.start import start_of
from mimo_jobs.predict.steptime import efficiency_for
from mimo_jobs.study.expand import runs_of
from mimo_jobs.study.load import parse_study
from mimo_jobs.study.topology import check

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
# the planner's audio activation bytes against the measured saved tensors: the formula counts per tensor
# what autograd keeps; what it leaves out (a view's own storage, the loss's scalars) is a few percent
ACTIVATION_TOLERANCE = 0.05


def _measure(tmp_path: Path, a: AudioArch, frames: int, tp: int = 1) -> dict:
    spec = tmp_path / "arch.json"
    spec.write_text(json.dumps({"audio": a.to_dict(), "llm_hidden": LLM_HIDDEN}))
    out = tmp_path / "out.json"
    args = (str(WORKER), str(spec), str(frames), str(out), str(tp))
    cmd = torchrun(tp, *args) if tp > 1 else [sys.executable, *args]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=worker_env())
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize(("pooling", "frames"), [(1, 32), (2, 31), (2, 10)])
def test_audio_params_and_flops_equal_the_built_module(tmp_path, pooling, frames):
    a = AudioArch(**AUDIO, pooling=pooling)
    got = _measure(tmp_path, a, frames)
    assert got["tensors"] == [[t.numel, not t.frozen] for t in audio_tensors(a, 1)]
    assert got["projector"] == [t.numel for t in projector_of(a.out_width, LLM_HIDDEN, 1)]
    # the CPU attention is unfused and computes the whole n x n matrix, as the formula prices it (the
    # encoder is bidirectional); conv1's input needs no gradient, conv2's does
    assert audio_clip_flops(a, LLM_HIDDEN, frames) == got["flops"]
    # one microbatch of one clip, fp32, the CPU's unfused attention, no recompute, TP 1
    rs, mix = _audio_shape(a, frames)
    rs = replace(rs, attention=UNFUSED)  # what audio_measure_worker builds
    predicted = activations.audio_bytes(rs, rs.preset.encoders["audio"], mix, 1, 1, "local")
    assert predicted == pytest.approx(got["saved_peak_bytes"], rel=ACTIVATION_TOLERANCE)


def _audio_shape(a: AudioArch, frames: int):
    """The planner's shape of a run of `a` feeding an LLM LLM_HIDDEN wide (an audio-only study, fp32), and
    its audio module's mix at one clip of `frames` frames per sample."""
    from dataclasses import replace

    doc = {
        "name": "a",
        "cluster": {"executor": "local", "accelerator": "cpu", "gpus_per_node": 2},
        "trainer": {
            "model": {
                "encoders": {"audio": a.to_dict()},
                "llm": {"preset": "tiny", "hidden_size": LLM_HIDDEN, "num_attention_heads": 4},
            },
            "train_iters": 2,
            "seq_length": 32,
        },
        "matrix": {"points": [{"nodes": 1, "encoders": {"audio": {"dp": 1}}, "llm": {"dp": 1}, "gbs": 1}]},
    }
    (run,) = runs_of(parse_study(doc, env={}))
    rs = shape_of(run.layout, run.trainer, run.point.command)
    assert rs.preset.encoders["audio"] == a and rs.dtype_bytes == 4 and rs.recompute.encoder == "none"
    tokens = a.tokens_for_frames(frames)
    (mix,) = rs.modules
    return rs, replace(mix, frames=frames, tokens_max=tokens, tokens_per_item=tokens)


@pytest.mark.slow
def test_audio_tensors_per_rank_of_a_tp2_group_equal_the_built_shard(tmp_path):
    a = AudioArch(**AUDIO)
    got = _measure(tmp_path, a, 32, tp=2)
    assert got["tensors"] == [[t.numel, not t.frozen] for t in audio_tensors(a, 2)]
    assert got["projector"] == [t.numel for t in projector_of(a.out_width, LLM_HIDDEN, 2)]


# ---------------------------------------------------------------- a two-encoder study predicted

# openai/whisper-small's published config.json (its encoder's fields)
WHISPER_SMALL = {
    "model_type": "whisper",
    "architectures": ["WhisperForConditionalGeneration"],
    "d_model": 768,
    "encoder_layers": 12,
    "encoder_attention_heads": 12,
    "encoder_ffn_dim": 3072,
    "num_mel_bins": 80,
    "max_source_positions": 1500,
    "activation_function": "gelu",
}
H100 = get_gpu("h100")


def study(tmp: Path, data: dict | None = None, points: list | None = None) -> dict:
    cfg = tmp / "models" / "whisper-small" / "config.json"
    cfg.parent.mkdir(parents=True, exist_ok=True)
    cfg.write_text(json.dumps(WHISPER_SMALL))
    trainer = {
        "model": {
            "encoders": {"vision": {"preset": "tiny"}, "audio": {"hf_config": str(cfg)}},
            "llm": {"preset": "tiny"},
        },
        "train_iters": 10,
        "seq_length": 32,
    }
    if data:
        trainer["data"] = data
    return {
        "name": "av",
        "cluster": {"gpus_per_node": 8},
        "trainer": trainer,
        "matrix": {
            "points": points
            or [
                {
                    "nodes": 2,
                    "encoders": {"vision": {"dp": 4}, "audio": {"tp": 2, "dp": 2}},
                    "llm": {"dp": 8},
                },
                {"nodes": 2, "colocated": True, "llm": {"tp": 2, "dp": 8}},
            ],
            "defaults": {"gbs": 32},
        },
    }


def _runs(doc: dict):
    return {("colo" if r.layout.colocated else "split"): r for r in runs_of(parse_study(doc, env={}))}


def test_each_module_class_holds_its_own_module(tmp_path):
    runs = _runs(study(tmp_path))
    p = predict_run(runs["split"], H100)
    audio = p.shape.preset.encoders["audio"]
    classes = [[m.module for m in c.modules] for c in p.memory.classes]
    assert classes == [["vision"], ["audio"], ["llm"]]
    vis, aud, _ = (c.modules[0] for c in p.memory.classes)
    assert (vis.ranks, aud.ranks) == ((0, 3), (4, 7))
    tensors = module_tensors(audio, p.shape.preset.llm.hidden_size, 2)
    assert aud.params == sum(t.numel for t in tensors)
    # the frozen position table: weights, but no gradient and no optimizer state (fp32 Adam, no dist-opt)
    trainable = sum(t.numel for t in tensors if not t.frozen)
    assert trainable < aud.params
    assert aud.grad_bytes == GRAD_BYTES * trainable
    assert aud.optimizer_bytes == 8 * trainable + 4 * sum(1 for t in tensors if not t.frozen)
    # the vision module is priced as the one-encoder planner prices it on the same sizes
    one = dict(study(tmp_path / "one"))
    one["trainer"]["model"] = {"encoder": {"preset": "tiny"}, "llm": {"preset": "tiny"}}
    one["cluster"] = {"gpus_per_node": 4}  # the same encoder and LLM DP: 2 samples per encoder microbatch
    one["matrix"] = {"points": [{"nodes": 3, "encoder": {"dp": 4}, "llm": {"dp": 8}, "gbs": 32}]}
    (single,) = runs_of(parse_study(one, env={}))
    ref = predict_run(single, H100).memory.classes[0].modules[0]
    assert ref.module == "vision"
    assert (vis.params, vis.grad_bytes, vis.optimizer_bytes) == (
        ref.params,
        ref.grad_bytes,
        ref.optimizer_bytes,
    )
    assert vis.activation_bytes == ref.activation_bytes
    assert vis.bridge_bytes == ref.bridge_bytes


def test_colocated_ranks_hold_every_module_and_run_each_in_turn(tmp_path):
    runs = _runs(study(tmp_path))
    p = predict_run(runs["colo"], H100)
    (cls,) = p.memory.classes
    assert [m.module for m in cls.modules] == ["vision", "audio", "llm"]
    assert all(m.ranks == (0, 15) for m in cls.modules)
    t = p.time
    mb = t.modules
    assert set(mb) == {"vision", "audio", "llm"} and t.bottleneck == "audio"
    m = p.shape.microbatches
    pipe = m * sum(mb.values())  # every rank runs every module's microbatch in turn
    assert t.iteration_s == pytest.approx(
        pipe + t.parts["dp"] + t.parts["optimizer"] + _dp_latency(p), rel=1e-9
    )
    assert t.idle_fraction == 0.0


def test_the_step_is_bounded_by_the_slowest_module(tmp_path):
    runs = _runs(study(tmp_path))
    p = predict_run(runs["split"], H100)
    t, m = p.time, p.shape.microbatches
    mb = t.modules
    assert max(mb, key=mb.get) == "audio" == t.bottleneck  # whisper-small's full clips, a tiny LLM
    pipe = m * mb["audio"] + mb["llm"]  # the LLM's last microbatch drains once; pp 1: no bubble
    assert t.iteration_s == pytest.approx(
        pipe + t.parts["dp"] + t.parts["optimizer"] + _dp_latency(p), rel=1e-9
    )
    assert t.idle_fraction == pytest.approx(1 - min(mb.values()) / mb["audio"])


def _dp_latency(p) -> float:
    return steptime._dp_s(p.shape, p.memory, p.gpu, efficiency_for(p.gpu))[1]


def _stats(tmp: Path, clips: dict, tokens_mean: float, tokens_max: int) -> Path:
    """A `mimo-jobs data stats` file of this shape (format 2), measured for the tiny vision encoder."""
    doc = {
        "format": 2,
        "samples": sum(clips.values()),
        "geometry": geometry_record(ImageGeometry.of(PRESETS["tiny"].encoder, 1, False)),
        "image_tokens": {"mean": 4.0, "p99": 4, "max": 4},
        "text_tokens": {"mean": 20.0, "max": 24},
        "tiles": {"mean": 1.0, "max": 1},
        "tokens_per_tile": 4.0,
        "audio_tokens": {"mean": tokens_mean, "max": tokens_max},
        "audio_clips_per_sample": clips,
    }
    f = tmp / "stats.json"
    f.write_text(json.dumps(doc))
    return f


def test_audio_tokens_from_dataset_statistics_else_the_stated_prior(tmp_path):
    prior = predict_run(_runs(study(tmp_path))["split"], H100)
    (aud,) = [m for m in prior.shape.modules if m.name == "audio"]
    assert aud.assumed and "assumed: one full-length clip per sample" in aud.source
    assert (aud.tokens_mean, aud.frames) == (1500, 3000)
    stats = _stats(tmp_path, {"0": 50, "1": 25, "2": 25}, 75.0, 200)  # 0.75 clips, 100 tokens a clip
    doc = study(tmp_path, data={"provider": "energon", "path": str(tmp_path), "stats": str(stats)})
    measured = predict_run(_runs(doc)["split"], H100)
    (aud,) = [m for m in measured.shape.modules if m.name == "audio"]
    assert not aud.assumed and aud.source.startswith(f"dataset statistics {stats}")
    assert (aud.items_mean, aud.tokens_per_item, aud.frames, aud.tokens_max) == (0.75, 100, 200, 200)
    # shorter clips, fewer of them: less audio work per step, its FLOPs those of 0.75 clips of 200 frames
    assert measured.time.modules["audio"] < prior.time.modules["audio"] / 2
    a, hl = measured.shape.preset.encoders["audio"], measured.shape.preset.llm.hidden_size
    (got,) = [m for m in modules_json(measured) if m["module"] == "audio"]
    assert got["flops_per_iteration"] == 32 * 0.75 * audio_clip_flops(a, hl, 200)
    assert got["tokens"]["source"] == aud.source and not got["tokens"]["assumed"]


# ---------------------------------------------------------------- plan over N+1 modules


def test_plan_over_two_encoders_gives_split_and_colocated_layouts(tmp_path):
    doc = study(tmp_path)
    spec = parse_study(doc, env={})
    shape = start_of(spec.trainer, 8, 32)
    cands = candidate_layouts(shape.layout, 2)
    # the bound: (TPs x PPs) x MAX_MODULE_SHAPES^2 heterogeneous layouts before the rules, plus colocated
    assert len(module_shapes(shape.layout, 2)) <= MAX_MODULE_SHAPES
    assert len(cands) <= 4 * 1 * MAX_MODULE_SHAPES**2 + 4
    assert all(not check(lay) for lay in cands)
    best, priced = best_layouts(shape, H100, 2, efficiency_for(H100), top=400)
    assert priced >= len(cands)  # and the mbs variants of the fastest
    split = [c for c in best if not c.layout.colocated]
    colo = [c for c in best if c.layout.colocated]
    assert split and colo
    for c in split:
        lay = c.layout
        assert [m.name for m in lay.encoders] == ["vision", "audio"]
        assert lay.encoder_ranks + lay.llm_ranks == lay.world == 16
    # the bottleneck audio encoder gets more GPUs than the tiny vision tower in the fastest split
    top = split[0].layout
    vision, audio = top.encoders
    assert audio.ranks > vision.ranks and split[0].prediction.time.bottleneck in ("audio", "llm")


def test_a_one_encoder_model_is_priced_as_it_always_was(tmp_path):
    doc = study(tmp_path)
    doc["trainer"]["model"] = {"encoder": {"preset": "tiny"}, "llm": {"preset": "tiny"}}
    doc["matrix"] = {"points": [{"nodes": 1, "encoder": {"dp": 4}, "llm": {"dp": 4}, "gbs": 32}]}
    (run,) = runs_of(parse_study(doc, env={}))
    rs = shape_of(run.layout, run.trainer)
    assert [m.name for m in rs.modules] == ["vision"]  # a model of one module, priced as every model is
    p = predict_shape(rs, H100, efficiency_for(H100))
    assert [m.module for c in p.memory.classes for m in c.modules] == ["vision", "llm"]
    assert set(p.time.modules) == {"vision", "llm"} and p.time.bottleneck in ("vision", "llm")


def test_the_mock_audio_mix_a_study_states_is_priced(tmp_path):
    """Half the samples with a 10 s clip (1000 mel frames) against one 30 s clip (3000) per sample: fewer
    audio tokens and less audio time, by the family's token rule (model/audio_arch.py)."""

    tmp = tmp_path
    full = study(tmp, data={"audio_fraction": 1.0, "audio_frames": [3000]})
    half = study(tmp, data={"audio_fraction": 0.5, "audio_frames": [1000]})
    p_full, p_half = (predict_run(_runs(d)["split"], H100) for d in (full, half))
    (a_full,) = [m for m in p_full.shape.modules if m.name == "audio"]
    (a_half,) = [m for m in p_half.shape.modules if m.name == "audio"]
    a = p_half.shape.preset.encoders["audio"]
    assert not a_half.assumed and a_half.source.startswith("the mock provider's clips (0.5 of the samples")
    assert (a_full.tokens_mean, a_full.frames, a_full.items_mean) == (a.tokens_for_frames(3000), 3000, 1.0)
    assert (a_half.tokens_mean, a_half.frames, a_half.items_mean) == (
        0.5 * a.tokens_for_frames(1000),
        1000,
        0.5,
    )
    assert a_half.tokens_max == a.tokens_for_frames(1000)
    assert p_half.time.modules["audio"] < p_full.time.modules["audio"] / 2
    hl = p_half.shape.preset.llm.hidden_size
    (got,) = [m for m in modules_json(p_half) if m["module"] == "audio"]
    assert got["flops_per_iteration"] == 32 * 0.5 * audio_clip_flops(a, hl, 1000)
    assert got["tokens"]["source"] == a_half.source


def test_a_per_module_statistics_entry_prices_its_module_and_is_named(tmp_path):
    """A stats file with a `modules:` map: the audio module's own entry wins over the older flat audio keys
    (here the flat keys say one 30 s clip a sample), and the source says which entry priced it."""
    stats = _stats(tmp_path, {"1": 100}, 1500.0, 1500)
    doc = json.loads(stats.read_text())
    doc["modules"] = {"audio": {"items": {"0": 50, "1": 25, "2": 25}, "tokens": {"mean": 75.0, "max": 200}}}
    stats.write_text(json.dumps(doc))
    run = _runs(study(tmp_path, data={"provider": "energon", "path": str(tmp_path), "stats": str(stats)}))
    (aud,) = [m for m in predict_run(run["split"], H100).shape.modules if m.name == "audio"]
    assert aud.source.startswith(f"dataset statistics {stats} module 'audio' (")
    assert (aud.items_mean, aud.tokens_per_item, aud.frames, aud.tokens_max) == (0.75, 100, 200, 200)
    doc["modules"] = {"audio": {"tokens": {"mean": 75.0, "max": 200}}}
    stats.write_text(json.dumps(doc))
    (aud,) = [m for m in predict_run(run["split"], H100).shape.modules if m.name == "audio"]
    assert aud.assumed and "modules.audio: field 'items' is missing" in aud.source

"""The operator-term model prices encoder modules (predict/encops.py, optime.py):

- an image module's and an audio module's FLOPs, as the operator terms count them (every GEMM and the
  bidirectional attention core per image or clip), equal the FLOPs model's count for the same module
  (predict/flops.py, itself checked against torch's FlopCounterMode on the built modules in
  test_predict_vs_trainer.py and test_several_encoders.py), on one rank and summed over a TP group;
- a study with an encoder on Transformer Engine layers is priced by the operator model, and its iteration
  is rebuilt from its module times by the pipeline rule (heterogeneous: M x the slowest + the other side
  once + the LLM's bubble; colocated: M x every module in turn + the bubble), each module's time being the
  operator terms' of its microbatch;
- a frozen encoder runs its forward only: cheaper than the same encoder trained, with no DP transfers or
  optimizer pass of its own; a frozen LLM computes no weight gradients;
- predict and plan name the operator model's band for such a study.
"""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import yaml

from helpers import REPO
from mimo_jobs.contract.modules import LLM
from mimo_jobs.model.audio_arch import CONVS, AudioArch, conv_frames
from mimo_jobs.model.presets import ENCODERS, LLMS
from mimo_jobs.predict import encops, optime
from mimo_jobs.predict import operators as ops
from mimo_jobs.predict.estimate import predict_run, predict_shape
from mimo_jobs.predict.flops import audio_clip_flops, encoder_flops_per_token
from mimo_jobs.predict.hardware import GPUS, with_layers
from mimo_jobs.predict.opdata import OP_GPUS
from mimo_jobs.predict.planning import band_lines, plan_many
from mimo_jobs.predict.run import shape_of
from mimo_jobs.predict.steptime import efficiency_for
from mimo_jobs.study.diagnose import diagnose_data

H100 = OP_GPUS["H100"]
GPU = replace(GPUS["H100"], time_model="operators")
STUDY = REPO / "studies" / "scale_33n_68n_100n.yaml"
# openai/whisper-small's encoder (its published config.json: d_model 768, 12 layers, 12 heads, ffn 3072,
# 80 mel bins, 1500 positions), pooled 2 as Qwen2-Audio's tower pools
WHISPER_SMALL = AudioArch("whisper", 12, 768, 12, 3072, 80, 1500, pooling=2)


def _at(tp: int, grads: str = "all") -> encops.On:
    return encops.On(tp, H100, grads=grads)


@pytest.mark.parametrize("name", ["siglip-so400m-14-384", "clip-vit-l-14-336", "internvit-300m-448"])
@pytest.mark.parametrize("tp", [1, 2])
def test_image_module_flops_counted_by_the_operator_terms_equal_the_flops_model(name, tp):
    a, hl = ENCODERS[name], 4096
    for per_image in (a.tokens_per_image, a.tokens_per_image / 4, 3.0 * a.tokens_per_image):
        tokens = 2.5 * per_image  # images of several sizes: tokens in images of E[n^2]/E[n] each
        t = encops.image_terms(a, tokens, per_image, _at(tp))
        encops.projector_terms(t, tokens, a.out_width, hl, _at(tp))
        want = tokens * encoder_flops_per_token(a, hl, per_image)
        assert t.flops * tp == pytest.approx(want, rel=1e-9)
        assert t.gemm > 0 and t.attention > 0 and t.elementwise > 0 and (t.tp > 0) == (tp > 1)


@pytest.mark.parametrize("frames", [3000, 1000, 17])
def test_audio_module_flops_counted_by_the_operator_terms_equal_the_flops_model(frames):
    a, hl, clips = WHISPER_SMALL, 2048, 1.5
    got = {}
    for tp in (1, 2):
        t, tokens = encops.audio_terms(a, clips, frames, _at(tp))
        assert tokens == clips * a.tokens_for_frames(frames)
        encops.projector_terms(t, tokens, a.out_width, hl, _at(tp))
        got[tp] = t.flops
    assert got[1] == pytest.approx(clips * audio_clip_flops(a, hl, frames), rel=1e-9)
    # the convolutions run whole on every TP rank (conv1 without its input's gradient), the rest is split
    c1, c2 = CONVS
    convs = (
        clips
        * 2
        * (
            2 * c1.out_frames(frames) * c1.kernel * a.num_mel_bins * a.hidden_size
            + 3 * conv_frames(frames) * c2.kernel * a.hidden_size**2
        )
    )
    assert got[2] == pytest.approx(convs + (got[1] - convs) / 2, rel=1e-9)


def _runs(points: list, llm: str = "qwen3-8b", **trainer) -> list:
    """The scale study's trainer (SigLIP-so400m) on another LLM and points, on H100 Transformer Engine
    layers, as diagnose reads it."""
    doc = yaml.safe_load(STUDY.read_text())
    doc["trainer"]["model"] = {"name": "t", "encoder": "siglip-so400m-14-384", "llm": llm}
    doc["trainer"].update(trainer)
    doc["matrix"] = {"defaults": {"mbs": 1, "encoder": {"tp": 1, "pp": 1}}, "points": copy.deepcopy(points)}
    diag = diagnose_data(doc, "encops", env={})
    assert diag.ok, diag.problems[:3]
    return diag.runs


HETERO = {"nodes": 4, "gbs": 64, "encoder": {"tp": 2, "dp": 4}, "llm": {"tp": 2, "pp": 3, "dp": 4}}
COLO = {"nodes": 4, "gbs": 64, "colocated": True, "llm": {"tp": 2}}


def test_a_study_with_an_encoder_is_priced_by_the_operator_model_and_composed_by_the_pipeline_rule():
    het, colo = (predict_run(r, GPU) for r in _runs([HETERO, COLO]))
    for p in (het, colo):
        rs, t = p.shape, p.time
        assert optime.supports(rs, GPU) and t.model == "operators"
        # each module's microbatch is its operator terms' (the LLM: one stage's, its sends included)
        og, res = optime.op_gpu(GPU), optime.residual_for(GPU)
        terms, bridge = encops.module_mb(rs, og, res, 0, GPU.step_s)
        assert t.modules["vision"] == pytest.approx(terms.total + bridge, rel=1e-12)
        llm = optime.op_step(rs, p.memory, GPU, res).stage_mb_s
        assert t.modules[LLM] == pytest.approx(llm, rel=1e-12)
        assert (bridge > 0) == (not rs.layout.colocated)
        m, fill = rs.microbatches, (rs.layout.llm_pp - 1) / rs.virtual_stages
        enc = t.modules["vision"]
        if rs.layout.colocated:
            pipe = m * (enc + llm) + fill * llm
        else:
            slow, other = max(enc, llm), min(enc, llm)
            pipe = m * slow + other + fill * llm
        assert t.iteration_s == pytest.approx(pipe + t.parts["dp"] + t.parts["optimizer"], rel=1e-12)
        assert t.parts["compute"] > 0 and t.encoder_compute_s > 0 and t.flops.encoder > 0
    assert colo.shape.layout.colocated and not het.shape.layout.colocated and het.shape.layout.llm_pp == 3


def test_local_layers_keep_the_flops_model():
    (run,) = _runs([HETERO])
    local = with_layers(GPU, "local")
    assert not optime.supports(shape_of(run.layout, run.trainer), local)
    assert predict_run(run, local).time.model == "flops"


def test_a_frozen_encoder_runs_its_forward_only():
    (run,) = _runs([HETERO])
    trained = shape_of(run.layout, run.trainer)
    frozen = replace(trained, frozen_encoder=True)
    a, b = (predict_shape(s, GPU, efficiency_for(GPU)) for s in (trained, frozen))
    assert a.time.model == b.time.model == "operators"
    # the forward alone: about a third of the trained module's compute (the backward is twice the forward)
    ratio = b.time.modules["vision"] / a.time.modules["vision"]
    assert 0.2 < ratio < 0.5, ratio
    assert b.time.iteration_s < a.time.iteration_s
    # no backward GEMM of any kind, no attention backward
    t = encops.image_terms(ENCODERS["siglip-so400m-14-384"], 729.0, 729.0, _at(2, "none"))
    u = encops.image_terms(ENCODERS["siglip-so400m-14-384"], 729.0, 729.0, _at(2))
    assert t.flops * 3 == pytest.approx(u.flops, rel=1e-12)
    # the encoder's rank class moves no gradient and steps no optimizer
    og, res = optime.op_gpu(GPU), optime.residual_for(GPU)
    enc_class = next(c for c in b.memory.classes if all(m.module == "vision" for m in c.modules))
    (vm,) = enc_class.modules
    assert vm.grad_bytes == 0 and optime._stepped_bytes(vm) == 0
    assert optime._module_dp_s(frozen, og, res, vm, {"vision": {"compute": 0.0}}, 0.0) == 0.0


def test_a_frozen_llm_computes_no_weight_gradients():
    p = LLMS["qwen3-8b"]
    kw = dict(gpu=H100, moe=False)
    all_, data, none = (ops.layer_terms(p, 1, 4096, ops.Split(), grads=g, **kw) for g in ops.GRADS)
    # per linear: forward, data gradient, weight gradient, each 2 M N K; the attention core has no weights
    gemms = all_.flops - 3 * ops.attention_flops(1, p.num_attention_heads, p.head_dim, 4096, 4096, True)
    assert data.flops == pytest.approx(all_.flops - gemms / 3, rel=1e-12)
    assert none.flops * 3 == pytest.approx(all_.flops, rel=1e-12)
    assert none.gemm < data.gemm < all_.gemm
    (run,) = _runs([HETERO])
    trained = shape_of(run.layout, run.trainer)
    a, b = (predict_shape(s, GPU, efficiency_for(GPU)) for s in (trained, replace(trained, frozen_llm=True)))
    assert b.time.modules[LLM] < a.time.modules[LLM] and b.time.iteration_s < a.time.iteration_s


def test_plan_names_the_operator_model_band_for_a_study_with_an_encoder():
    (run,) = _runs([HETERO])
    shape = shape_of(run.layout, run.trainer, checked=False)
    r = plan_many(shape, GPU, [4], [64], efficiency_for(GPU), 3, 0)
    assert "(operator model)" in band_lines(r)[0]
    assert {c.prediction.time.model for p in r.plans for c in p.ranked} == {"operators"}

"""The heterogeneous trainer (real torchrun, CPU/gloo) reproduces the one-process --reference run: losses and
grad norms over 3 steps agree to rtol 1e-5 (fp32). The reference shares the model code but has no bridge,
no process groups beyond one rank, no DDP reduction across ranks and no split of the batch across encoder
replicas, so a wrong split, a wrong gradient scale or a misaligned sample shows up as a mismatch."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch
import yaml

from helpers.runs import reference_key
from helpers.trainer import (
    OMNI,
    OMNI_DATA,
    OMNI_STUDY,
    assert_ok,
    iterations,
    make_run_yaml,
    run_reference,
    study_run_yaml,
)
from mimo_jobs.contract.manifest import latest_checkpoint
from mimo_jobs.contract.memory import facts_path
from mimo_jobs.data.mock import MockProvider, mock_config
from mimo_jobs.study.runspec import load_run_yaml
from mimo_jobs.trainer.parallel.bridge import segments_of_encoder

RTOL = 1e-5
LINE_RE = re.compile(
    r"^ \[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+\] iteration +(\d+)/ +3 \| consumed samples: +(\d+) \| "
    r"elapsed time per iteration \(ms\): [\d.]+ \| throughput per GPU \(TFLOP/s/GPU\): [\d.]+ \| "
    r"learning rate: [\d.E+-]+ \| global batch size: +\d+ \| lm loss: ([\d.E+-]+) \|"
    r"( load_balancing_loss: [\d.E+-]+ \|)? loss scale: 1\.0 \| grad norm: [\d.]+ \| "
    # then the trainer's own figures (tokens/s, padding), each " name: value |"
    r"number of skipped iterations: +0 \| number of nan iterations: +0 \|( [^|\n]+\|)*$",
    re.MULTILINE,
)


def _parity(shared_runs, tmp_path, nproc: int, **kw):
    ry = make_run_yaml(tmp_path / "run", **kw)
    r = shared_runs.reference(ry).ok("reference").iterations()
    het = shared_runs.world(ry, nproc).ok("torchrun")
    h = het.iterations()
    assert [x["iteration"] for x in h] == [1, 2, 3] == [x["iteration"] for x in r]
    for a, b in zip(r, h):
        assert b["loss"] == pytest.approx(a["loss"], rel=RTOL), (a, b)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=RTOL), (a, b)
        assert b["lr"] == pytest.approx(a["lr"], rel=1e-12)
        assert b["tokens"] == a["tokens"] and b["consumed_samples"] == a["consumed_samples"]
    # an untrained model with 0.02-std weights predicts ~uniformly over the 128-token vocabulary
    assert abs(h[0]["loss"] - math.log(128)) < 0.1
    # Megatron-format lines on the last LLM rank, after the layout line
    lines = LINE_RE.findall(het.stdout)
    assert [int(x[0]) for x in lines] == [1, 2, 3], het.stdout[-3000:]
    assert het.stdout.index("mimo-jobs trainer: run ") < het.stdout.index("iteration        1/")
    return ry, r, h, het


@pytest.mark.slow  # multi-process or real jobs: CI runs it, the fast local default does not
def test_fan_out_enc_dp1_to_llm_dp2(shared_runs, tmp_path):
    _, _, h, het = _parity(shared_runs, tmp_path, 3, gpn=3, gbs=4, enc={"dp": 1}, llm={"dp": 2})
    assert "fan-out 1->2" in het.stdout
    assert all(x["phases_ms"]["llm_fwd"] > 0 and "bridge_wait" in x["phases_ms"] for x in h)
    # no save_interval: the run still ends with a checkpoint of its last iteration (what a continued run
    # starts from)
    saved = re.findall(r"saved checkpoint (\S+) \(iteration (\d+),", het.stdout)
    assert [int(i) for _, i in saved] == [3], het.stdout[-3000:]
    assert latest_checkpoint(Path(saved[0][0]).parent).iteration == 3


@pytest.mark.slow
def test_fan_in_enc_dp2_to_llm_dp1_with_text_only_and_imageless_microbatches(shared_runs, tmp_path):
    ry, _, h, het = _parity(
        shared_runs,
        tmp_path,
        3,
        gpn=3,
        gbs=4,
        mbs=2,
        enc={"dp": 2},
        llm={"dp": 1},
        data={"text_only_fraction": 0.5, "image_sizes": [8, 12, 16]},
    )
    assert "fan-in 2->1" in het.stdout
    # the data of these 3 iterations really contains text-only samples, an encoder replica microbatch
    # without any image, and different image token counts
    run, _ = load_run_yaml(ry)
    plan = run.rank_layout()
    prov = MockProvider(mock_config(run, plan), [0], need_images=False, need_text=True)
    counts = [prov.next(0).counts("vision") for _ in range(3 * plan.num_microbatches)]
    per_encoder = [
        sum(c[g.lane_start : g.lane_start + g.n])
        for c in counts
        for e in range(2)
        for g in segments_of_encoder(plan, e)
    ]
    flat = [n for c in counts for n in c]
    assert 0 in flat and len({n for n in flat if n}) >= 2
    assert 0 in per_encoder and any(per_encoder)
    assert sum(x["extras"]["image_tokens"] for x in h) == sum(flat)


@pytest.mark.slow
def test_tp2_on_both_modules(shared_runs, tmp_path):
    _, _, _, het = _parity(shared_runs, tmp_path, 4, gpn=4, gbs=4, enc={"tp": 2}, llm={"tp": 2, "dp": 1})
    assert "llm ranks [2,4) tp=2" in het.stdout


@pytest.mark.slow
def test_moe_ep2(shared_runs, tmp_path):
    _, r, h, het = _parity(
        shared_runs, tmp_path, 3, gpn=3, gbs=4, model="tiny-moe", enc={"dp": 1}, llm={"dp": 2, "ep": 2}
    )
    assert "ep=2" in het.stdout and "load_balancing_loss" in het.stdout
    for a, b in zip(r, h):
        assert b["moe_aux_loss"] == pytest.approx(a["moe_aux_loss"], rel=RTOL)


@pytest.mark.slow
def test_frozen_encoder(shared_runs, tmp_path):
    _, _, h_frozen, het = _parity(
        shared_runs,
        tmp_path / "f",
        3,
        gpn=3,
        gbs=4,
        enc={"dp": 1},
        llm={"dp": 2},
        trainer={"freeze": {"encoder": True}},
    )
    assert "freeze(encoder=True" in het.stdout
    # same weights and data as the trained-encoder run: same first loss, but the encoder contributes no
    # gradient, so the global grad norm is strictly smaller
    ry = make_run_yaml(tmp_path / "t", gpn=3, gbs=4, enc={"dp": 1}, llm={"dp": 2})
    t = shared_runs.reference(ry).ok("reference (trained encoder)").iterations()
    assert h_frozen[0]["loss"] == pytest.approx(t[0]["loss"], rel=1e-9)
    assert h_frozen[0]["grad_norm"] < t[0]["grad_norm"] * (1 - 1e-3)


@pytest.mark.slow
def test_moe_tp2_sequence_parallel_ep2_fan_in(shared_runs, tmp_path):
    # MoE with TP>1 needs sequence parallelism; the EP group spans the two TP ranks of the single lane
    _, r, _, het = _parity(
        shared_runs,
        tmp_path,
        4,
        gpn=4,
        gbs=4,
        mbs=2,
        model="tiny-moe",
        enc={"dp": 2},
        llm={"tp": 2, "dp": 1, "ep": 2},
    )
    assert "tp=2 pp=1 dp=1 ep=2" in het.stdout
    h = iterations(het.metrics)
    for a, b in zip(r, h):
        assert b["moe_aux_loss"] == pytest.approx(a["moe_aux_loss"], rel=RTOL)


@pytest.mark.slow
def test_one_to_one_dp2_with_distributed_optimizer(shared_runs, tmp_path):
    _, _, _, het = _parity(
        shared_runs,
        tmp_path,
        4,
        gpn=4,
        gbs=4,
        enc={"dp": 2},
        llm={"dp": 2},
        trainer={"use_distributed_optimizer": True},
    )
    assert "bridge 1:1" in het.stdout


@pytest.mark.slow
def test_overlapped_dp_transfers_match_the_reference_and_save_what_the_unoverlapped_run_saves(
    shared_runs, tmp_path
):
    """megatron-core DDP with overlap_grad_reduce and overlap_param_gather (two microbatches per DP rank: the
    reduce starts under the last one's backward, the gather runs under the next forward): the same losses
    and grad norms as the reference, and a final checkpoint holding the updated weights, as the same run
    without overlap saves them (the world of test_one_to_one_dp2_with_distributed_optimizer)."""
    kw = {"gpn": 4, "gbs": 4, "enc": {"dp": 2}, "llm": {"dp": 2}}
    plain = {"use_distributed_optimizer": True}
    overlap = {**plain, "overlap_grad_reduce": True, "overlap_param_gather": True}
    _, _, _, het = _parity(shared_runs, tmp_path / "overlap", 4, trainer=overlap, **kw)
    # the DDP the last LLM rank built
    assert "| ddp grad reduce fp32, overlap_grad_reduce overlap_param_gather" in het.stdout
    base = shared_runs.world(make_run_yaml(tmp_path / "plain", trainer=plain, **kw), 4).ok("no overlap")
    assert "| ddp grad reduce fp32, no overlap" in base.stdout
    got, want = _final_weights(het.stdout), _final_weights(base.stdout)
    assert got.keys() == want.keys() and got
    for name, t in want.items():
        assert torch.allclose(got[name], t, rtol=RTOL, atol=0), name


def _final_weights(stdout: str) -> dict:
    """Every weight tensor of a run's last checkpoint, by file and name."""
    saved = re.findall(r"saved checkpoint (\S+) \(iteration (\d+),", stdout)
    d = Path(saved[-1][0])
    out = {}
    for f in sorted(d.glob("*/model-*.pt")):
        for k, v in torch.load(f, map_location="cpu", weights_only=True).items():
            if isinstance(v, torch.Tensor):
                out[f"{f.relative_to(d)}:{k}"] = v
    return out


@pytest.mark.slow  # multi-process or real jobs: CI runs it, the fast local default does not
@pytest.mark.parametrize(("model", "ep"), [("tiny", 1), ("tiny-moe", 2)])
def test_reference_losses_do_not_depend_on_the_layout(tmp_path, model, ep):
    # the same global batches (gbs 4) as 2 lanes x 2 microbatches, or colocated TP2 with every scheduling and
    # memory setting changed: the trainer's figures are per global batch, so both train identically. The
    # test-run-wide cache (helpers.runs) shares one reference among such runs: these references are
    # launched here, apart from it. For a dense model the microbatch size does not matter either (1 lane x
    # mbs 2); for MoE it does (the load-balancing loss is per microbatch), and the cache keys it.
    knobs = {"recompute": "full", "encoder_inflight": 1, "use_distributed_optimizer": True}
    variants = [
        ("fo", {"gpn": 3, "enc": {"dp": 1}, "llm": {"dp": 2, "ep": ep}}),
        ("co", {"gpn": 2, "colocated": True, "llm": {"tp": 2, "ep": ep}, "trainer": knobs}),
    ]
    if ep == 1:
        variants.append(("fi", {"gpn": 3, "mbs": 2, "enc": {"dp": 2}, "llm": {"dp": 1}}))
    out, keys = [], []
    for name, kw in variants:
        ry = make_run_yaml(tmp_path / name, gbs=4, model=model, **kw)
        keys.append(reference_key(yaml.safe_load(ry.read_text())))
        assert_ok(run_reference(ry, tmp_path / f"{name}.jsonl"), name)
        out.append(iterations(tmp_path / f"{name}.jsonl"))
    assert keys[0] == keys[1]  # what the cache shares is what was just shown to be shared
    for other in out[1:]:
        for a, b in zip(out[0], other):
            assert b["loss"] == pytest.approx(a["loss"], rel=RTOL)
            assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=RTOL)
            assert b["tokens"] == a["tokens"]
            if ep > 1:
                assert b["moe_aux_loss"] == pytest.approx(a["moe_aux_loss"], rel=RTOL)


# Today's open-model features at CPU size (model/presets.py): tiny-swiglu has SwiGLU, RMSNorm, QK-norm, GQA,
# head_dim != hidden/heads and a 2x2 pixel-shuffle SigLIP-style encoder; tiny-moe-shared a dense first
# layer, a shared expert and a softmax router without top-k renormalisation. Image sides are multiples of
# patch 4 x downsample 2.
ARCH_DATA = {"image_sizes": [8, 16]}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("model", "nproc", "kw", "shows"),
    [
        # TP2: the gated fc1 cut as [gate; up] shards, KV groups split, q/k-norm grads summed over TP
        ("tiny-swiglu", 4, {"gpn": 4, "enc": {"tp": 2}, "llm": {"tp": 2, "dp": 1}}, "tp=2"),
        ("tiny-swiglu", 3, {"gpn": 3, "enc": {"dp": 1}, "llm": {"pp": 2, "dp": 1}}, "pp=2"),
        # PP2 with the dense layer on the first stage and the MoE layer on the second
        ("tiny-moe-shared", 3, {"gpn": 3, "enc": {"dp": 1}, "llm": {"pp": 2, "dp": 1}}, "pp=2"),
        ("tiny-moe-shared", 3, {"gpn": 3, "enc": {"dp": 1}, "llm": {"dp": 2, "ep": 2}}, "ep=2"),
        # sequence parallel (MoE with TP2): RMSNorm and q/k-norm on the local backend's SP norms
        (
            "tiny-moe-shared",
            4,
            {"gpn": 4, "mbs": 2, "enc": {"dp": 2}, "llm": {"tp": 2, "dp": 1, "ep": 2}},
            "ep=2",
        ),
        ("tiny-swiglu", 2, {"gpn": 2, "colocated": True, "llm": {"tp": 2}}, "colocated"),
    ],
    ids=[
        "swiglu-tp2",
        "swiglu-pp2",
        "moe-shared-pp2",
        "moe-shared-ep2",
        "moe-shared-tp2-sp-ep2",
        "swiglu-colocated",
    ],
)
def test_architecture_features_match_the_reference(shared_runs, tmp_path, model, nproc, kw, shows):
    _, r, h, het = _parity(shared_runs, tmp_path, nproc, gbs=4, model=model, data=ARCH_DATA, **kw)
    assert shows in het.stdout
    assert sum(x["extras"]["image_tokens"] for x in h) == sum(x["extras"]["image_tokens"] for x in r) > 0
    if "moe" in model:
        for a, b in zip(r, h):
            assert b["moe_aux_loss"] == pytest.approx(a["moe_aux_loss"], rel=RTOL)


def _sample_kinds(ry) -> tuple[set[tuple[bool, bool]], int]:
    """(has an image, has audio) of every sample the run's 3 iterations draw, and their audio tokens."""
    run, _ = load_run_yaml(ry)
    plan = run.rank_layout()
    lanes = list(range(plan.layout.llm_dp))
    prov = MockProvider(mock_config(run, plan), lanes, need_images=False, need_text=True)
    out, audio = set(), 0
    for _ in range(3 * plan.num_microbatches):
        for lane in lanes:
            b = prov.next(lane)
            out |= {(i > 0, a > 0) for i, a in zip(b.counts("vision"), b.counts("audio"))}
            audio += sum(b.counts("audio"))
    return out, audio


# Several encoder modules, colocated: the packaged study studies/cpu_omni.yaml (a vision tower and a
# Whisper-class audio encoder), each of its points for 3 iterations; every sample kind in the same iterations
@pytest.mark.slow
@pytest.mark.parametrize("index", [0, 1], ids=["tp1-dp2", "tp2-dp1"])
def test_the_vision_and_audio_study_matches_the_reference(shared_runs, tmp_path, index):
    ry = study_run_yaml(tmp_path / "run", OMNI_STUDY, index, train_iters=3)
    r = shared_runs.reference(ry).ok("reference").iterations()
    p = shared_runs.world(ry, 2).ok("colocated torchrun")
    h = p.iterations()
    assert [x["iteration"] for x in h] == [1, 2, 3] == [x["iteration"] for x in r]
    for a, b in zip(r, h):
        assert b["loss"] == pytest.approx(a["loss"], rel=RTOL), (a, b)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=RTOL), (a, b)
        assert b["tokens"] == a["tokens"] and b["consumed_samples"] == a["consumed_samples"]
    assert abs(h[0]["loss"] - math.log(128)) < 0.1
    # the vision and audio modules' FLOPs together (predict/flops.flops_per_sample) give the TFLOP/s field
    assert [int(x[0]) for x in LINE_RE.findall(p.stdout)] == [1, 2, 3], p.stdout[-3000:]
    assert all(x["tflops_per_gpu"] > 0 for x in h)
    assert "vision:tp=" in p.stdout and "audio:tp=" in p.stdout and "bridge none (colocated" in p.stdout
    # each module's forward timed under its own name (the one-encoder record's enc_fwd is not written)
    assert all({"vision_fwd", "audio_fwd"} <= set(x["phases_ms"]) for x in h), h[0]["phases_ms"]
    assert not any("enc_fwd" in x["phases_ms"] for x in h)
    # and each module's backward under its own name, apart from the LLM's (step/colocated.py: its own
    # autograd call from the embeddings' gradient)
    assert all(x["phases_ms"].get(f"{m}_bwd", 0) > 0 for x in h for m in ("vision", "audio")), h[0][
        "phases_ms"
    ]
    kinds, audio = _sample_kinds(ry)
    assert kinds == {(True, True), (True, False), (False, True), (False, False)}
    for kind in ("image_tokens", "audio_tokens"):
        assert sum(x["extras"][kind] for x in h) == sum(x["extras"][kind] for x in r) > 0
    assert sum(x["extras"]["audio_tokens"] for x in h) == audio  # every clip's tokens reached the LLM
    # the audio embeddings reach the loss: with the audio encoder frozen the first loss is the same and the
    # global grad norm strictly smaller (the audio module's gradient is missing)
    frozen = {"encoders": {"audio": True}}
    fy = study_run_yaml(tmp_path / "frozen-audio", OMNI_STUDY, index, train_iters=3, freeze=frozen)
    f = shared_runs.reference(fy).ok("reference, audio frozen").iterations()
    assert f[0]["loss"] == pytest.approx(r[0]["loss"], rel=1e-9)
    assert f[0]["grad_norm"] < r[0]["grad_norm"] * (1 - 1e-3)


# Several encoder modules, each on ranks of its own (vision first, then audio, then the LLM), each with its
# own bridge into the LLM's first stage: the vision+audio model of studies/cpu_omni.yaml at 4-5 processes.
# Both 1:1 into LLM TP 2 (the LLM's TP pair starts on an even rank: tp-within-node), vision fan-in with
# audio 1:1 into LLM PP 2, and both fanning out into an MoE LLM at EP 2.
OMNI_MOE = {**OMNI, "llm": "tiny-moe"}
MODULE_CASES = [
    (
        OMNI,
        {"gpn": 4, "enc": {"vision": {"dp": 1}, "audio": {"dp": 1}}, "llm": {"tp": 2}},
        ["vision 1:1", "audio 1:1", "tp=2"],
    ),
    (
        OMNI,
        {"gpn": 5, "mbs": 2, "enc": {"vision": {"dp": 2}, "audio": {"dp": 1}}, "llm": {"pp": 2}},
        ["vision fan-in 2->1", "audio 1:1", "pp=2"],
    ),
    (
        OMNI_MOE,
        {"gpn": 4, "enc": {"vision": {"dp": 1}, "audio": {"dp": 1}}, "llm": {"dp": 2, "ep": 2}},
        ["vision fan-out 1->2", "audio fan-out 1->2", "ep=2"],
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize(("model", "kw", "shows"), MODULE_CASES, ids=["tp2", "fan-in-pp2", "fan-out-moe-ep2"])
def test_vision_and_audio_on_ranks_of_their_own_match_the_reference(shared_runs, tmp_path, model, kw, shows):
    ry, r, h, het = _parity(shared_runs, tmp_path, kw["gpn"], gbs=4, model=model, data=OMNI_DATA, **kw)
    assert all(s in het.stdout for s in shows), het.stdout[:3000]
    for kind in ("image_tokens", "audio_tokens"):
        assert sum(x["extras"][kind] for x in h) == sum(x["extras"][kind] for x in r) > 0
    _kinds, audio = _sample_kinds(ry)
    assert sum(x["extras"]["audio_tokens"] for x in h) == audio  # every clip's tokens reached the LLM
    if model is OMNI_MOE:
        for a, b in zip(r, h):
            assert b["moe_aux_loss"] == pytest.approx(a["moe_aux_loss"], rel=RTOL)
    # each encoder rank times its own module's phases (the record's last LLM rank has none of them)
    run, _ = load_run_yaml(ry)
    for m in run.rank_layout().encoders:
        for rank in range(m.rank_start, m.rank_end):
            facts = json.loads(facts_path(het.run_dir, rank).read_text())
            assert {f"{m.name}_fwd", f"{m.name}_bwd"} <= set(facts["phases_s"]), (m.name, facts["phases_s"])
            others = {"enc_fwd", "vision_fwd", "audio_fwd"} - {f"{m.name}_fwd"}
            assert not others & set(facts["phases_s"]), (m.name, facts["phases_s"])


@pytest.mark.slow
def test_moe_expert_tp2_colocated(shared_runs, tmp_path):
    # expert-TP 2: the alltoall dispatcher gathers and reduce-scatters the expert-TP ranks' uneven token counts
    # (gloo takes them through the CPU shims' padded collectives); the gated fc1 cut with stride 2
    _, r, _, het = _parity(
        shared_runs,
        tmp_path,
        4,
        gpn=4,
        gbs=8,
        mbs=2,
        model="tiny-moe-shared",
        colocated=True,
        llm={"tp": 2, "ep": 2, "etp": 2},
    )
    assert "ep=2 etp=2" in het.stdout
    h = iterations(het.metrics)
    for a, b in zip(r, h):
        assert b["moe_aux_loss"] == pytest.approx(a["moe_aux_loss"], rel=RTOL)

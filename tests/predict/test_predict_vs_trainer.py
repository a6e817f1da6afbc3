"""The planner against the trainer's real megatron-core models (CPU, fp32):

- one process (the --reference build, measure_worker.py): parameter counts and FLOPs exact against the
  built modules and torch's FlopCounterMode, for the plain toys and for the features of today's open models
  (SwiGLU, RMSNorm, QK-norm, GQA, head_dim != hidden/heads; MoE with a shared expert and a dense first
  layer; a pixel-shuffle encoder), saved-activation bytes within 15% of the trainer's SavedTensorMeter
  (byte for byte for `tiny`) under both core attentions of the local layers (trainer.attention);
- torchrun (slow): per-rank parameter counts, gradient-buffer and optimizer-state bytes EXACT against the
  memory facts each rank writes, for TP2, EP2, PP2 and the distributed optimizer; the LLM ranks' measured
  saved-activation peak within 15% of the prediction.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.launch import worker_env
from helpers.trainer import assert_ok, make_run_yaml
from mimo_jobs.model.presets import PRESETS
from mimo_jobs.predict import activations as A
from mimo_jobs.predict.flops import flops_per_sample
from mimo_jobs.predict.hardware import get_gpu
from mimo_jobs.predict.memory import memory_plan
from mimo_jobs.predict.params import encoder_tensors, llm_tensors
from mimo_jobs.predict.run import shape_of
from mimo_jobs.study.runspec import load_run_yaml

WORKER = Path(__file__).with_name("measure_worker.py")
SEQ, SIDE = 32, 16  # one 16x16 image: (16/4)^2 = 16 patches (4 image tokens after a 2x2 pixel shuffle)
CPU = get_gpu("cpu")


def _measure(tmp_path: Path, model: str) -> dict:
    # image sides that divide into patch 4 x downsample 2 blocks, for every model measured here
    ry = make_run_yaml(tmp_path / model, gpn=2, gbs=1, model=model, iters=4, data={"image_sizes": [8, 16]})
    out = tmp_path / f"{model}.json"
    p = subprocess.run(
        [sys.executable, str(WORKER), str(ry), str(out), str(SEQ), str(SIDE)],
        capture_output=True,
        text=True,
        timeout=240,
        env=worker_env(),
    )
    assert_ok(p, f"measure {model}")
    return json.loads(out.read_text()), ry


@pytest.mark.parametrize("model", ["tiny", "tiny-moe", "tiny-swiglu", "tiny-moe-shared"])
def test_one_process_params_flops_and_activations(tmp_path, model):
    both, ry = _measure(tmp_path, model)
    preset = PRESETS[model]
    for got in both.values():
        assert got["params"]["encoder"] == sum(t.numel for t in encoder_tensors(preset, 1))
        assert got["params"]["llm"] == sum(t.numel for t in llm_tensors(preset, 1, 1, 1, 1, 0))
    # the unfused attention computes the whole s x s matrix as matrix products: compare without the causal
    # halving; FlopCounterMode counts the matrix products (2 per multiply-add), which is what the model
    # prices (it has no formula for the CPU flash attention of trainer.attention: sdpa)
    tokens = preset.encoder.tokens_for(SIDE, SIDE)
    fl = flops_per_sample(preset, SEQ, tokens, causal_halved=False)
    assert fl.llm == both["unfused"]["flops"]["llm"]
    assert fl.encoder == both["unfused"]["flops"]["encoder"]
    run, _ = load_run_yaml(ry)
    from dataclasses import replace

    for attention, got in both.items():
        rs = shape_of(run.layout, run.trainer)
        rs = replace(
            rs, seq_length=SEQ, modules=(replace(rs.modules[0], tokens_max=tokens),), attention=attention
        )
        saved = got["saved_peak_bytes"]
        assert A.llm_bytes(rs, 0, "local") == pytest.approx(saved["llm"], rel=0.15), attention
        assert A.module_bytes(rs, 0, "local") == pytest.approx(saved["encoder"], rel=0.15), attention
        if model == "tiny":  # the plain model (no GQA, QK-norm or experts): byte for byte
            assert (A.llm_bytes(rs, 0, "local"), A.module_bytes(rs, 0, "local")) == (
                saved["llm"],
                saved["encoder"],
            )


def _facts(run_dir: Path) -> dict[int, dict]:
    return {
        f["rank"]: f
        for f in (json.loads(p.read_text()) for p in sorted((run_dir / "memory").glob("rank-*.json")))
    }


def _check_ranks(shared_runs, ry: Path, nproc: int) -> dict:
    """Run the layout and compare every rank's facts with the prediction; returns the activation ratios."""
    launched = shared_runs.world(ry, nproc).ok("torchrun")
    run, _ = load_run_yaml(ry)
    rs = shape_of(run.layout, run.trainer)
    mem = memory_plan(rs, CPU)
    facts = _facts(launched.run_dir)
    assert sorted(facts) == list(range(nproc))
    ratios = {}
    for rank, f in facts.items():
        for name, m in f["modules"].items():
            module = "vision" if name == "encoder" else "llm"  # the trainer's slot of the study's vision
            pred = [
                x
                for c in mem.classes
                for x in c.modules
                if x.module == module and x.ranks[0] <= rank <= x.ranks[1]
            ]
            pred = [x for x in pred if module == "vision" or x.stage == f["pp_rank"]][0]
            assert m["params"] == pred.params, (rank, name)
            assert m["grad_buffer_bytes"] == pred.grad_bytes, (rank, name)
            from mimo_jobs.predict.memory import buffers_of, optimizer_bytes

            lay = rs.layout
            if module == "llm":
                tensors = llm_tensors(rs.preset, lay.llm_tp, lay.llm_ep, lay.llm_etp, lay.llm_pp, pred.stage)
                dp, edp = lay.llm_dp, max(1, lay.llm_tp * lay.llm_dp // (lay.llm_ep * lay.llm_etp))
            else:
                (enc,) = lay.encoders
                tensors, dp, edp = encoder_tensors(rs.preset, enc.tp), enc.dp, enc.dp
            bufs = buffers_of(tensors, dp, edp, rs.distributed_optimizer)
            want = optimizer_bytes(bufs, rs.distributed_optimizer, rs.optimizer, rs.bf16, f["dp_rank"])
            assert m["optimizer_state_bytes"] == want, (rank, name)
            if module == "llm":
                ratios[rank] = f["saved_activation_peak_bytes"] / (pred.activation_bytes)
    return ratios


@pytest.mark.slow
def test_moe_ep2_encoder_tp2_distributed_optimizer(shared_runs, tmp_path):
    ry = make_run_yaml(
        tmp_path / "r1",
        gpn=4,
        gbs=4,
        model="tiny-moe",
        enc={"tp": 2, "dp": 1},
        llm={"tp": 1, "ep": 2, "dp": 2},
        trainer={"use_distributed_optimizer": True},
    )
    ratios = _check_ranks(shared_runs, ry, 4)
    # dropless routing moves tokens between the EP ranks from one batch to the next; the prediction prices
    # balanced routing, which is what the EP group holds on average
    assert len(ratios) == 2 and 0.85 <= sum(ratios.values()) / 2 <= 1.15, ratios


@pytest.mark.slow
def test_dense_pp2_tp2(shared_runs, tmp_path):
    ry = make_run_yaml(tmp_path / "r2", gpn=6, gbs=4, enc={"tp": 2, "dp": 1}, llm={"tp": 2, "pp": 2, "dp": 1})
    ratios = _check_ranks(shared_runs, ry, 6)
    assert ratios and all(0.85 <= r <= 1.15 for r in ratios.values()), ratios


@pytest.mark.slow
@pytest.mark.parametrize(
    ("model", "nproc", "enc", "llm"),
    [
        ("tiny-swiglu", 6, {"tp": 2, "dp": 1}, {"tp": 2, "pp": 2, "dp": 1}),
        ("tiny-moe-shared", 4, {"tp": 2, "dp": 1}, {"tp": 1, "ep": 2, "dp": 2}),
    ],
)
def test_open_model_features_per_rank(shared_runs, tmp_path, model, nproc, enc, llm):
    # image sides that are multiples of patch 4 x downsample 2 (tiny-swiglu's pixel shuffle)
    ry = make_run_yaml(
        tmp_path / model, gpn=nproc, gbs=4, model=model, enc=enc, llm=llm, data={"image_sizes": [8, 16]}
    )
    ratios = _check_ranks(shared_runs, ry, nproc)
    assert ratios and 0.85 <= sum(ratios.values()) / len(ratios) <= 1.15, ratios


@pytest.mark.slow
def test_moe_tp2_ep1_experts_in_their_own_part(shared_runs, tmp_path):
    """LLM TP2 with EP1 (expert TP 1): the experts' gradients are reduced over the expert-DP group (the two
    TP ranks), so they get their own buffer and distributed-optimizer part, sharded over 2 where the dense
    part is not sharded at all (DP 1): the predictor's buffers and optimizer bytes must follow."""
    ry = make_run_yaml(
        tmp_path / "r3",
        gpn=2,
        gbs=4,
        model="tiny-moe",
        llm={"tp": 2, "ep": 1, "dp": 1},
        trainer={"use_distributed_optimizer": True},
        colocated=True,
    )
    _check_ranks(shared_runs, ry, 2)

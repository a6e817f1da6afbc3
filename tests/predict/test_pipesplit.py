"""The layer split over pipeline stages and model chunks (predict/pipesplit.py) against megatron-core 0.19.2's
own functions, the stage's activations held at the peak of the interleaved schedule, and the fused SwiGLU's
saved tensors against megatron-core's kernel."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from megatron.core.fusions.fused_bias_swiglu import bias_swiglu_impl
from megatron.core.transformer.transformer_block import get_num_layers_to_build
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

from mimo_jobs.predict import activations as A
from mimo_jobs.predict import operators as ops
from mimo_jobs.predict.flops import flops_per_sample
from mimo_jobs.predict.hardware import GPUS
from mimo_jobs.predict.memory import llm_memory
from mimo_jobs.predict.optime import op_gpu
from mimo_jobs.predict.pipesplit import EVEN, PipelineSplit, chunk_layers, slowest_stage_layers, stage_layers
from mimo_jobs.predict.run import study_settings
from mimo_jobs.predict.steptime import Efficiency, _llm_mb
from mimo_jobs.study.runtime_rules import pipeline_split_problem
from mimo_jobs.study.spec import TrainerSpec
from mimo_jobs.study.topology import Layout, Trainer, check

REPO = Path(__file__).resolve().parents[2]
BOTH = PipelineSplit(embedding=True, loss=True)


def _core_split(layers: int, pp: int, vp: int, split: PipelineSplit) -> tuple:
    """(offset, layers built) per stage and chunk, from megatron-core's functions on a CPU-built config."""
    cfg = TransformerConfig(
        num_layers=layers,
        hidden_size=64,
        num_attention_heads=4,
        pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=vp if vp > 1 else None,
        pipeline_dtype=torch.float32,
        account_for_embedding_in_pipeline_split=split.embedding,
        account_for_loss_in_pipeline_split=split.loss,
    )
    chunk = (lambda v: v) if vp > 1 else (lambda v: None)
    return tuple(
        tuple(
            (get_transformer_layer_offset(cfg, chunk(v), r), get_num_layers_to_build(cfg, chunk(v), r))
            for v in range(vp)
        )
        for r in range(pp)
    )


@pytest.mark.parametrize(
    "layers,pp,vp,split",
    [
        (126, 8, 8, BOTH),  # Llama 3.1 405B as NeMo's llama31_405b recipe runs it
        (30, 4, 1, BOTH),
        (31, 4, 1, PipelineSplit(embedding=True)),
        (15, 2, 2, PipelineSplit(loss=True)),
        (62, 4, 4, BOTH),
        (32, 4, 2, EVEN),
    ],
)
def test_split_is_megatron_cores(layers, pp, vp, split):
    ours = chunk_layers(layers, pp, vp, split)
    assert tuple(tuple((c.start, len(c)) for c in row) for row in ours) == _core_split(layers, pp, vp, split)
    assert sorted(i for row in ours for c in row for i in c) == list(range(layers))  # each layer once


def test_405b_split():
    chunks = chunk_layers(126, 8, 8, BOTH)
    sizes = [len(c) for row in chunks for c in row]
    assert len(sizes) == 64
    assert chunks[0][0] == range(0, 1) and len(chunks[7][7]) == 1
    assert sorted(sizes) == [1, 1] + [2] * 62
    assert [len(stage_layers(126, 8, 8, BOTH, s)) for s in range(8)] == [15] + [16] * 6 + [15]
    assert chunk_layers(126, 8, 8, EVEN) is None  # megatron-core refuses 126 layers over 64 even chunks


def test_interleaved_peak_plays_the_schedule():
    """Rank 0 of PP 8, VP 8 with 64 microbatches: 71 chunk forwards before its first backward, in groups of 8
    microbatches per chunk (chunk 0 fifteen times, chunks 1-7 eight times), so with one layer in chunk 0 and
    two in the others 15 + 7 x 8 x 2 = 127 layers; rank 1 runs 69, all of two layers: 138. The steady state
    swaps a forward for a backward and never holds more. Equal chunks: inflight_chunks of them."""
    stage0 = (1.0,) + (2.0,) * 7
    assert A.interleaved_peak(8, 8, 64, 0, stage0) == 127
    assert A.inflight_chunk_bytes(8, 8, 64, 1, (2.0,) * 8) == 138
    assert A.interleaved_peak(8, 8, 64, 1, (2.0,) * 8) == 138
    # a heavier late chunk: the steady state brings in its forwards while chunk 0's backwards leave
    late = (1.0,) * 7 + (5.0,)
    assert A.interleaved_peak(2, 2, 6, 0, (1.0, 5.0)) == 1 * 2 + 5 * 2 + 1  # F: c0 c0 c1 c1 | c0 ...
    assert A.interleaved_peak(8, 8, 64, 0, late) >= A.inflight_chunks(8, 8, 64, 0) + 4 * 8


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("pipesplit_bench", REPO / "benchmarks" / "published.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["pipesplit_bench"] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def row405(bench):
    return next(r for r in bench.load_rows()[1] if r.id == "dgxc-llama31-405b-512gpu")


def test_405b_stages_hold_their_split(row405):
    rs, gpu = row405.shape, GPUS["H100"]
    assert rs.pipeline_split == BOTH
    even = replace(rs, pipeline_split=EVEN)
    per_layer = sum(A.llm_stage(rs, 1, gpu.layers).chunks) / 16
    # stage 0: 127 layers in flight where an even spread of its 15 over 8 chunks held 71 x 15 / 8
    s0, e0 = llm_memory(rs, gpu, 0), llm_memory(even, gpu, 0)
    assert e0.activation_bytes - s0.activation_bytes == pytest.approx(
        (71 * 15 / 8 - 127) * per_layer, rel=1e-3
    )
    # stage 1 holds 16 layers and their weights: the fullest stage
    assert llm_memory(rs, gpu, 1).params > llm_memory(even, gpu, 1).params


def test_slowest_stage_takes_its_layers(row405):
    rs, gpu = row405.shape, GPUS["H100"]
    fl = flops_per_sample(rs.preset, rs.seq_length, 0.0)
    even = _llm_mb(replace(rs, pipeline_split=EVEN), gpu, Efficiency(), fl)
    split = _llm_mb(rs, gpu, Efficiency(), fl)
    assert split["compute"] / even["compute"] == pytest.approx(16 / (126 / 8))
    assert split["tp"] > even["tp"]  # 16 layers' TP collectives, not 126 // 8 = 15
    gpu_ops = op_gpu(gpu)
    kw = dict(seq=8192, mbs=1, microbatches=64, tp=8, pp=8, cp=2, ep=1, dp=4, vp=8, sp=True, gpu=gpu_ops)
    kw |= dict(params_per_rank=6e9)
    mean = ops.step(rs.preset.llm, **kw)
    fullest = ops.step(rs.preset.llm, **kw, layers_per_stage=slowest_stage_layers(126, 8, 8, BOTH))
    assert fullest.stage.compute > mean.stage.compute  # the operator model prices the fullest stage too


def _saved_bytes(fn, x: torch.Tensor) -> int:
    """Bytes autograd keeps for fn(x)'s backward, each storage once."""
    seen: dict[int, int] = {}

    def pack(t):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(x)
    return sum(seen.values())


def test_fused_swiglu_keeps_fc1_output_only():
    """megatron-core's fused SwiGLU keeps fc1's output (2f), the unfused silu(gate) * up also the gate's
    activation (f); the product (f) is fc2's input either way: 3 width-f tensors against 4."""
    f = 64
    x = torch.randn(8, 2 * f, dtype=torch.bfloat16, requires_grad=True)
    fused = _saved_bytes(lambda t: bias_swiglu_impl(t, None, False, False), x)

    def unfused(t):
        gate, up = torch.chunk(t, 2, dim=-1)
        return torch.nn.functional.silu(gate) * up

    plain = _saved_bytes(unfused, x)
    assert fused == x.numel() * 2
    assert plain - fused == 8 * f * 2  # the gate's activation
    assert (A.mlp_tensors(True, False), A.mlp_tensors(True, True)) == (4, 3)


def test_a_study_of_its_own_command_states_the_split():
    """trainer.account_for_embedding/loss_in_pipeline_split reach the planner; topology divides the layers
    with the two the split counts (126 + 2 over PP 8 x VP 8), and the packaged trainer, which splits evenly,
    refuses them."""
    t = TrainerSpec(
        train_iters=10, account_for_embedding_in_pipeline_split=True, account_for_loss_in_pipeline_split=True
    )
    assert study_settings(t)["pipeline_split"] == BOTH
    lay = Layout(
        nodes=64, gpus_per_node=8, llm_tp=8, llm_pp=8, llm_dp=8, llm_vp=8, llm_layers=126, colocated=True
    )
    own = Trainer(text_only=True, packaged=False, split_layers=t.pipeline_split_layers)
    assert not [v for v in check(lay, own) if v.rule in ("pp-layers", "vp")]
    even = [v.rule for v in check(lay, Trainer(text_only=True, packaged=False))]
    assert "pp-layers" in even and "vp" in even
    assert pipeline_split_problem(t, packaged=False) is None
    refused = pipeline_split_problem(t, packaged=True)
    assert refused.rule == "pipeline-split" and "trainer.command" in refused.fit
    assert pipeline_split_problem(TrainerSpec(train_iters=10), packaged=True) is None

"""`plan`'s shortcuts change no answer. The gradient buffers memory.py lays out and shards once per DP (its
memoised functions) against every figure computed afresh (memory.unmemoised), with several studies planned one
after another in the same process (a later study must not read what an earlier one left); the splits dropped
by the rules of the LLM alone before they are built (layouts.candidate_layouts) against every split built and
checked; the memory savers a text-only model skips (layouts.settings_priced) against every saver priced; the
one-pass shard count against each DP rank's shard and a buffer laid out tensor by tensor."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest
import yaml

from helpers import REPO
from mimo_jobs.predict import memory
from mimo_jobs.predict.estimate import predict_shape
from mimo_jobs.predict.hardware import study_gpu
from mimo_jobs.predict.layouts import MEMORY_SAVERS, candidate_layouts, price_layouts, settings_priced
from mimo_jobs.predict.planning import candidate_json
from mimo_jobs.predict.run import on_layout, trainer_of
from mimo_jobs.predict.start import study_start
from mimo_jobs.predict.steptime import efficiency_for
from mimo_jobs.study.diagnose import diagnose_data
from mimo_jobs.study.topology import check, llm_check

STUDIES = REPO / "studies"


def _text_only_moe() -> dict:
    """Megatron-LM's GPT study with Mixtral-8x7B alone, priced by the operator model on TE layers
    (cluster.hardware.time_model: operators): PP, virtual stages, CP and EP all searched."""
    doc = yaml.safe_load((STUDIES / "megatron_gpt_mock.yaml").read_text())
    doc["trainer"]["model"] = {"name": "mixtral-8x7b-text", "llm": "mixtral-8x7b"}
    doc["trainer"]["seq_length"] = 4096
    doc["cluster"]["hardware"] = {"gpu": "H100", "time_model": "operators", "layers": "te"}
    doc["matrix"] = {"defaults": {"colocated": True, "gbs": 2400}, "points": [{"nodes": 4, "llm": {"tp": 2}}]}
    return doc


def _study(name: str) -> dict:
    return yaml.safe_load((STUDIES / f"{name}.yaml").read_text())


# (study, node counts): the MoE VLM of the production study, three encoder modules on the CPU, a text-only
# MoE on the operator model, Megatron-LM's small GPT (the production study on one node: afresh, every layout
# lays out the buffers of 128 experts a layer for every memory saver tried, seconds a node count)
CASES = {
    "scale_33n_68n_100n": ((_study, "scale_33n_68n_100n"), (1,)),
    "cpu_omni": ((_study, "cpu_omni"), (1, 2)),
    "text_only_moe": ((lambda _: _text_only_moe(), None), (1, 2)),
    "megatron_gpt_mock": ((_study, "megatron_gpt_mock"), (1, 2)),
}


def _start(key: str):
    """(the plan's start shape, the study's GPU) of a study, as `plan --from` reads them."""
    (load, arg), _ = CASES[key]
    diag = diagnose_data(load(arg), key, env={})
    assert diag.study is not None, diag.problems[:3]
    return study_start(diag.study, diag.points, diag.problems).shape, study_gpu(diag.study.cluster)


def _figures(shape, gpu, nodes: int) -> list[dict]:
    """Every priced layout (fitting, then not) with every figure plan --json gives a candidate."""
    fit, over = price_layouts(shape, gpu, nodes, efficiency_for(gpu))
    return [candidate_json(shape, c, None) for c in fit + over]


def test_memoised_plan_prices_every_layout_as_computed_afresh():
    starts = {key: _start(key) for key in CASES}
    for f in vars(memory).values():
        if hasattr(f, "cache_clear"):
            f.cache_clear()
    memoised = {(key, n): _figures(*starts[key], n) for key in CASES for n in CASES[key][1]}
    assert memory._buffer_held.cache_info().hits > 0 and memory._llm_held.cache_info().hits > 0
    with memory.unmemoised():
        assert not hasattr(memory._buffer_held, "cache_info")
        fresh = {(key, n): _figures(*starts[key], n) for key in CASES for n in CASES[key][1]}
    assert hasattr(memory._buffer_held, "cache_info")  # the memoised functions are back
    assert all(memoised[k] for k in memoised)  # every study and node count priced layouts
    for k in memoised:
        assert memoised[k] == fresh[k], k


@pytest.mark.parametrize("key", list(CASES))
def test_pruned_search_keeps_every_feasible_layout_in_order(key):
    shape, _ = _start(key)
    who = trainer_of(shape)
    for nodes in (*CASES[key][1], 33, 100):
        for gbs in sorted({shape.layout.gbs, 96, 768}):
            base = replace(shape.layout, gbs=gbs)
            every = candidate_layouts(base, nodes, who, prune=False)
            assert candidate_layouts(base, nodes, who) == every, (nodes, gbs)
    # the rules of the LLM alone are a part of check's, whatever the encoders
    base = replace(shape.layout, gbs=768)
    cut = 0
    for lay in candidate_layouts(base, 9, who, prune=False) + _unchecked_splits(base, 9):
        part, whole = llm_check(lay, who), check(lay, who)
        assert {str(v) for v in part} <= {str(v) for v in whole}
        cut += bool(part)
    assert cut or who.text_only


@pytest.mark.parametrize("key", ["text_only_moe", "megatron_gpt_mock"])
def test_a_text_only_model_is_priced_by_its_llms_saver_settings_alone(key):
    """Every memory saver on every layout of one node: those settings_priced calls alike price alike (the saver
    loop tries one of each), and the LLM's three recompute settings are told apart."""
    shape, gpu = _start(key)
    eff = efficiency_for(gpu)
    layouts = candidate_layouts(shape.layout, 1, trainer_of(shape))
    assert len(layouts) > 10
    for lay in layouts:
        rs = on_layout(shape, lay)
        priced: dict[tuple, tuple] = {}
        for saver in ({}, *MEMORY_SAVERS):
            p = predict_shape(replace(rs, **saver), gpu, eff)
            assert priced.setdefault(settings_priced(p.shape), (p.time, p.memory)) == (p.time, p.memory)
        assert sorted(priced) == [("full",), ("none",), ("selective",)]


def _unchecked_splits(base, nodes: int) -> list:
    """Splits of `base` whatever the rules say: every LLM TP, PP 1 and 2, DP 1 to 8, and expert layout beside
    one encoder shape of each module (tp 1, dp 1), on `nodes` nodes."""
    mods = tuple(replace(m, tp=1, pp=1, dp=1) for m in base.encoders)
    return [
        replace(
            base,
            nodes=nodes,
            encoders=mods,
            colocated=False,
            llm_tp=tp,
            llm_pp=pp,
            llm_dp=dp,
            llm_ep=ep,
            llm_etp=etp,
        )  # fmt: skip
        for tp in (1, 2, 8)
        for pp in (1, 2)
        for dp in range(1, 9)
        for ep, etp in (((1, 1), (8, 1), (8, tp)) if base.num_experts else ((1, 1),))
    ]


def _laid_out(numels: list[int], dp: int, distributed: bool) -> tuple[list[int], list[int], int]:
    """megatron-core's _ParamAndGradBuffer, tensor by tensor: the tensors in reverse order, each starting at
    a multiple of 64 under the distributed optimizer, the end padded to a multiple of lcm(dp, 128)."""
    starts, ends, pos = [], [], 0
    for n in reversed(numels):
        if distributed and pos % 64:
            pos += 64 - pos % 64
        starts.append(pos)
        pos += n
        ends.append(pos)
    if distributed and numels and pos % math.lcm(dp, 128):
        pos += math.lcm(dp, 128) - pos % math.lcm(dp, 128)
    return starts, ends, pos


def test_buffer_and_every_shard_as_laid_out_tensor_by_tensor():
    rng = random.Random(20)
    sizes = (0, 1, 63, 64, 65, 1000, 2048 * 768)
    for _ in range(3000):
        numels = [
            rng.choice(sizes) if rng.random() < 0.7 else rng.randint(0, 10**6)
            for _ in range(rng.randint(0, 40))
        ]
        dp, distributed = rng.choice((1, 2, 3, 8, 24, 96, 384)), rng.random() < 0.8
        b = memory.buffer_of(numels, dp, distributed)
        starts, ends, size = _laid_out(numels, dp, distributed)
        assert (list(b.starts), list(b.ends), b.size) == (starts, ends, size)
        if distributed:
            assert memory.all_shards(b) == [memory.shard_of(b, r) for r in range(dp)], (numels, dp)

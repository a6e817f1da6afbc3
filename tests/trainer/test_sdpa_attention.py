"""The local layers' core attention through torch's SDPA (trainer/model/sdpa.py) against megatron-core 0.19.2's
unfused DotProductAttention, the independent reference: the same output and gradients in fp32 (causal,
packed block-diagonal, grouped-query, bidirectional), dropout from the config, saved bytes that grow with
s rather than s^2, and the layer specs the trainer builds for each `trainer.attention`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.launch import worker_env

WORKER = Path(__file__).with_name("sdpa_worker.py")
# fp32 rounding of two orders of summation over at most 24 keys: far below any real difference (a wrong
# mask, scale or head grouping moves the output by the size of its values, ~1)
FP32_TOL = 1e-5


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    out = tmp_path_factory.mktemp("sdpa") / "sdpa.json"
    p = subprocess.run(
        [sys.executable, str(WORKER), str(out)], capture_output=True, text=True, timeout=300, env=worker_env()
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(out.read_text())


CASES = ["causal", "causal_gqa", "causal_mqa_scale", "causal_no_mask_given", "packed", "packed_gqa"]


@pytest.mark.parametrize("case", [*CASES, "bidirectional"])
def test_forward_and_backward_equal_the_unfused_attention(measured, case):
    got = measured["cases"][case]
    assert got["shape_equal"]
    assert got["max_ref"] > 0.5  # the comparison is on values of size ~1, not on zeros
    for name, diff in got["max_abs"].items():
        assert diff < FP32_TOL, (case, name, diff)


def test_each_mask_becomes_what_the_unfused_softmax_reads(measured):
    assert measured["cases"]["masks"] == {
        "causal": True,
        "all_false": True,
        "none_on_causal_layer": True,
        "none_on_unmasked_layer": True,
        "packed_is_additive": True,
        "packed_read_once": True,
    }


def test_dropout_comes_from_the_config_and_only_in_training(measured):
    d = measured["cases"]["dropout"]
    assert d["p"] == 0.5
    assert d["train_differs_from_eval"] > 0.1
    assert d["eval_max_abs"] < FP32_TOL


def test_saved_bytes_grow_as_s_not_s_squared(measured):
    saved = measured["saved"]
    s, s2 = "256", "512"
    # the unfused core keeps every score matrix: ~4x at twice the sequence (3.7 with q, k, v beside them)
    assert saved["unfused"][s2] / saved["unfused"][s] > 3.5
    # SDPA keeps q, k, v, its output and the per-row log-sum-exp: all linear in s, so exactly 2x
    assert saved["sdpa"][s2] == 2 * saved["sdpa"][s]
    assert saved["sdpa"][s] < saved["unfused"][s] / 4


def test_the_layer_specs_follow_trainer_attention(measured):
    built = measured["built"]
    assert built["sdpa"]["llm"] == ["SDPAttention"] and built["sdpa"]["vit"] == "SDPAttention"
    assert (
        built["unfused"]["llm"] == ["DotProductAttention"]
        and built["unfused"]["vit"] == "DotProductAttention"
    )
    assert built["sdpa"]["describe"].startswith("layers local | attention sdpa | fused ")
    assert built["unfused"]["describe"].startswith("layers local | attention unfused | fused ")

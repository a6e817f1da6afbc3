"""Encoder replicas and LLM lanes see the same samples, each rank in its own process (fan-out and fan-in),
and both agree with the one-process reference that reads every lane."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from helpers.data import run_spec
from helpers.launch import worker_env
from mimo_jobs.data.synth import caption_sample

N = 6  # microbatches per lane


def _spawn(reqs: dict[str, dict]) -> dict[str, dict]:
    env = worker_env()
    procs = {
        name: subprocess.Popen(
            [sys.executable, "-m", "helpers.data", json.dumps(r)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for name, r in reqs.items()
    }
    out = {}
    for name, p in procs.items():
        so, se = p.communicate(timeout=240)
        assert p.returncode == 0, f"{name} failed:\n{se[-3000:]}"
        out[name] = json.loads(so.split("@@RESULT@@", 1)[1])
    return out


def _expected_tokens(key: str, cfg) -> int:
    """Independent expectation: cap-i has the size synth drew for it; patch 4, no resize for these sizes."""
    if key.startswith("txt-"):
        return 0
    _, (h, w), _, _ = caption_sample(cfg.seed, int(key.split("-")[1]), cfg.image_sizes)
    return (h // 4) * (w // 4)


def _check_self_consistent(rec: dict, cfg, image_token_id: int = 127) -> None:
    for i, key in enumerate(rec["keys"]):
        n = _expected_tokens(key, cfg)
        assert rec["counts"][i] == n, (key, rec["counts"][i], n)
        assert rec["tokens"][i].count(image_token_id) == n
        # no loss on image positions, and loss only where a label exists
        for t, m, lab in zip(rec["tokens"][i], rec["loss_mask"][i], rec["labels"][i]):
            assert (m == 1.0) == (lab != -100)
            if t == image_token_id:
                assert m == 0.0


@pytest.mark.slow  # multi-process or real jobs: CI runs it, the fast local default does not
def test_fan_out_and_fan_in_lanes_align_across_processes(synth_blend):
    res, cfg = synth_blend
    blend = str(res.blend)
    out_spec = {
        "path": blend,
        "gpus_per_node": 6,
        "enc_dp": 2,
        "llm_dp": 4,
        "mbs": 2,
        "gbs": 16,
    }  # fan-out k=2
    in_spec = {
        "path": blend,
        "gpus_per_node": 6,
        "enc_dp": 4,
        "llm_dp": 2,
        "mbs": 2,
        "gbs": 8,
    }  # fan-in, 2 replicas/lane
    assert run_spec(**out_spec).rank_layout().fan == "out" and run_spec(**in_spec).rank_layout().fan == "in"
    r = _spawn(
        {
            "out_llm3": {"spec": out_spec, "role": "llm", "rank": 3, "n": N},
            "out_enc1": {"spec": out_spec, "role": "encoder", "rank": 1, "n": N},
            "out_ref": {"spec": out_spec, "role": "reference", "n": N},
            "in_llm1": {"spec": in_spec, "role": "llm", "rank": 1, "n": N},
            "in_enc3": {"spec": in_spec, "role": "encoder", "rank": 3, "n": N},
        }
    )
    # fan-out: encoder replica 1 serves lanes 2 and 3
    assert r["out_enc1"]["lanes"] == [2, 3]
    llm3, enc3, ref3 = (r[k]["draw"]["3"] for k in ("out_llm3", "out_enc1", "out_ref"))
    for a, b, c in zip(llm3, enc3, ref3):
        assert a["keys"] == b["keys"] == c["keys"]
        assert a["counts"] == b["counts"] == c["counts"]
        assert a["tokens"] == b["tokens"] == c["tokens"]
        assert a["images"] is None  # the LLM rank never decodes pixels
        _check_self_consistent(b, cfg)
        for key, shape in zip(b["keys"], b["images"]):
            n = _expected_tokens(key, cfg)
            assert (shape is None) == (n == 0)
            if shape:
                assert shape[0] == 3 and (shape[1] // 4) * (shape[2] // 4) == n
    assert r["out_enc1"]["draw"]["2"] == r["out_ref"]["draw"]["2"]
    assert [m["step"] for m in llm3] == [0, 0, 1, 1, 2, 2] and [m["microbatch"] for m in llm3] == [0, 1] * 3
    # lanes read disjoint samples; images and text are mixed
    lane_keys = [{k for m in r["out_ref"]["draw"][str(x)] for k in m["keys"]} for x in range(4)]
    for i in range(4):
        for j in range(i + 1, 4):
            assert not lane_keys[i] & lane_keys[j]
    every = set().union(*lane_keys)
    assert any(k.startswith("cap-") for k in every) and any(k.startswith("txt-") for k in every)

    # fan-in: encoder replica 3 helps lane 1 and decodes only its half of each microbatch
    assert r["in_enc3"]["lanes"] == [1]
    for a, b in zip(r["in_llm1"]["draw"]["1"], r["in_enc3"]["draw"]["1"]):
        assert a["keys"] == b["keys"] and a["counts"] == b["counts"] and a["tokens"] == b["tokens"]
        _check_self_consistent(a, cfg)
        assert b["images"][0] is None
        assert (b["images"][1] is None) == (b["counts"][1] == 0)
    # a different world size shards differently: fan-in lane 1 is not fan-out lane 1
    assert r["in_llm1"]["draw"]["1"][0]["keys"] != r["out_ref"]["draw"]["1"][0]["keys"]


def test_keys_look_like_synth_keys(synth_blend):
    res, _ = synth_blend
    names = sorted(p.name for p in res.caps.glob("*.tar"))
    assert names == [f"caps-{i:06d}.tar" for i in range(len(names))]
    assert all(re.fullmatch(r"(cap|txt)-\d{7}", caption_sample(0, i, ((8, 8),))[0]) for i in range(3))

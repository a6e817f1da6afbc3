"""A pipeline-parallel LLM (llm.pp > 1): stages of num_layers / pp layers each, 1F1B between them, the
bridge feeding stage 0 and taking the embedding gradients from it, the loss on the last stage. Parity:
real torchrun (CPU/gloo, fp32) against the one-process --reference at rtol 1e-5, for fan-out, fan-in,
PP x TP and PP with MoE expert parallelism; and a resume of a pipelined run is bit-exact."""

from __future__ import annotations

import pytest

from helpers import checkpoint as H
from helpers.trainer import iterations, make_run_yaml
from mimo_jobs.trainer.parallel.pipeline import one_f_one_b

RTOL = 1e-5


def _pp_parity(shared_runs, tmp_path, nproc: int, **kw) -> list[dict]:
    ry = make_run_yaml(tmp_path / "run", **kw)
    r = shared_runs.reference(ry).ok("reference").iterations()
    h = shared_runs.world(ry, nproc).ok("pipelined torchrun").iterations()
    assert [x["iteration"] for x in h] == [1, 2, 3] == [x["iteration"] for x in r]
    for a, b in zip(r, h):
        assert b["loss"] == pytest.approx(a["loss"], rel=RTOL), (a, b)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=RTOL), (a, b)
        assert b["tokens"] == a["tokens"], (a, b)
        # the image embeddings the pipelined LLM consumed: every one the reference's did, over the bridge
        assert b["extras"]["image_tokens"] == a["extras"]["image_tokens"], (a, b)
    assert sum(x["extras"]["image_tokens"] for x in h) > 0
    return h


@pytest.mark.slow  # several torchrun processes: CI runs it, the fast local default does not
def test_pp2_fan_out(shared_runs, tmp_path):
    # encoder DP1 feeds 2 lanes; each lane is 2 stages of 1 layer: 1 + 2x2 = 5 ranks, 4 microbatches
    _pp_parity(shared_runs, tmp_path, 5, gpn=5, gbs=8, enc={"dp": 1}, llm={"pp": 2, "dp": 2})


@pytest.mark.slow
def test_pp2_fan_in(shared_runs, tmp_path):
    _pp_parity(shared_runs, tmp_path, 4, gpn=4, gbs=4, mbs=2, enc={"dp": 2}, llm={"pp": 2, "dp": 1})


@pytest.mark.slow
def test_pp2_tp2(shared_runs, tmp_path):
    # encoder TP2 (ranks 0-1), then one lane of 2 stages x TP2 (ranks 2-5): TP groups stay node-aligned
    _pp_parity(
        shared_runs, tmp_path, 6, gpn=6, gbs=4, enc={"tp": 2, "dp": 1}, llm={"tp": 2, "pp": 2, "dp": 1}
    )


@pytest.mark.slow
def test_pp2_moe_ep2(shared_runs, tmp_path):
    h = _pp_parity(
        shared_runs,
        tmp_path,
        5,
        gpn=5,
        gbs=8,
        model="tiny-moe",
        enc={"dp": 1},
        llm={"pp": 2, "dp": 2, "ep": 2},
    )
    assert all(x["moe_aux_loss"] is not None and x["moe_aux_loss"] > 0 for x in h)


def test_one_f_one_b_order():
    # the last stage alternates from the start; the first runs stages-1 forwards ahead
    assert one_f_one_b(1, 2, 3) == [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2)]
    assert one_f_one_b(0, 2, 3) == [("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1), ("B", 2)]
    assert one_f_one_b(0, 4, 2) == [("F", 0), ("F", 1), ("B", 0), ("B", 1)]  # fewer microbatches than stages
    for stages in (1, 2, 3, 4):
        for s in range(stages):
            sched = one_f_one_b(s, stages, 5)
            assert sorted(m for k, m in sched if k == "F") == list(range(5))
            assert [m for k, m in sched if k == "B"] == list(range(5))  # oldest first
            # never more than stages - s microbatches awaiting their backward
            live = peak = 0
            for k, _ in sched:
                live += 1 if k == "F" else -1
                peak = max(peak, live)
            assert peak <= stages - s


@pytest.mark.slow
def test_pp2_kill9_then_resume_is_exact(tmp_path):
    kw = {"enc_dp": 1, "llm_dp": 1, "gbs": 4, "iters": 4}
    straight = H.make_run(tmp_path / "straight", **kw, llm_pp=2)
    assert H.launch(straight).returncode == 0
    y = H.make_run(tmp_path / "resumed", **kw, llm_pp=2)
    assert H.launch(y, env={"MIMO_CKPT_KILL_AFTER_ITER": "3"}).returncode != 0
    r = H.launch(y)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "(iteration 2, 8 samples)" in r.stdout
    want = H.curve(straight)
    for rec in iterations(y.parent / "metrics.jsonl"):
        assert (rec["loss"], rec["grad_norm"], rec["lr"], rec["consumed_samples"]) == want[rec["iteration"]]

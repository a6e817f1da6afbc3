"""The colocated baseline (every rank runs the encoder and the LLM, no bridge) reproduces the one-process
--reference run of the same model: losses and grad norms over 3 steps agree to rtol 1e-5 (real torchrun,
CPU/gloo, fp32) for data parallelism, tensor parallelism and MoE expert parallelism. And a heterogeneous
run and a colocated run that see the same global batches (same LLM lanes) train the same model the same
way: their losses agree step for step."""

from __future__ import annotations

import pytest

from helpers import checkpoint as H
from helpers.trainer import OMNI, OMNI_DATA, iterations, make_run_yaml
from mimo_jobs.contract.manifest import latest_checkpoint

RTOL = 1e-5


def _colocated_parity(shared_runs, tmp_path, nproc: int, **kw) -> list[dict]:
    ry = make_run_yaml(tmp_path / "run", colocated=True, **kw)
    r = shared_runs.reference(ry).ok("reference").iterations()
    p = shared_runs.world(ry, nproc).ok("colocated torchrun")
    assert "bridge none (colocated" in p.stdout and "| mode colocated |" in p.stdout
    c = p.iterations()
    assert [x["iteration"] for x in c] == [1, 2, 3] == [x["iteration"] for x in r]
    for a, b in zip(r, c):
        assert b["loss"] == pytest.approx(a["loss"], rel=RTOL), (a, b)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=RTOL), (a, b)
        assert b["tokens"] == a["tokens"] and b["consumed_samples"] == a["consumed_samples"]
        assert "bridge_wait" not in b["phases_ms"] and b["phases_ms"]["enc_fwd"] > 0
        assert b["phases_ms"].get("enc_bwd", 0) > 0  # the encoder's backward, apart from llm_bwd
    return c


@pytest.mark.slow  # several torchrun processes: CI runs it, the fast local default does not
def test_colocated_dp2(shared_runs, tmp_path):
    _colocated_parity(shared_runs, tmp_path, 2, gpn=2, gbs=4)


@pytest.mark.slow
def test_colocated_tp2(shared_runs, tmp_path):
    _colocated_parity(shared_runs, tmp_path, 2, gpn=2, gbs=4, llm={"tp": 2})


@pytest.mark.slow
def test_colocated_moe_ep2(shared_runs, tmp_path):
    c = _colocated_parity(shared_runs, tmp_path, 2, gpn=2, gbs=4, model="tiny-moe", llm={"ep": 2})
    assert all(x["moe_aux_loss"] is not None for x in c)


@pytest.mark.slow
def test_heterogeneous_and_colocated_train_alike_on_the_same_batches(shared_runs, tmp_path):
    het_y = make_run_yaml(tmp_path / "het", gpn=3, gbs=4, enc={"dp": 1}, llm={"dp": 2})
    col_y = make_run_yaml(tmp_path / "col", gpn=2, gbs=4, colocated=True)
    h = shared_runs.world(het_y, 3).ok("heterogeneous").iterations()
    c = shared_runs.world(col_y, 2).ok("colocated").iterations()
    assert len(h) == len(c) == 3
    for a, b in zip(h, c):
        assert b["loss"] == pytest.approx(a["loss"], rel=RTOL), (a, b)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=RTOL), (a, b)


COLOCATED_RESUMES = {
    "moe-ep2": {"llm_ep": 2, "model": "tiny-moe"},
    # several encoder modules: the vision tower's and the audio encoder's shards and optimizer states; the
    # straight run's checkpoint 2 also continues at LLM TP 2 (the modules cut anew)
    "vision-audio": {
        "model": OMNI,
        "data": OMNI_DATA,
        "files": ["encoder.audio/model-00000.pt", "encoder.audio/optim-00000.pt"],
        "reshard": {"llm_dp": 1, "llm_tp": 2},
    },
    # the same modules each on ranks of its own (vision on rank 0, audio on rank 1, both fanning out to LLM
    # DP 2, a bridge each): each module's shards written by its own rank; checkpoint 2 also continues with
    # the audio encoder alone on two replicas (1:1 with the LLM's lanes), every other module as it was
    "vision-audio-own-ranks": {
        "model": OMNI,
        "data": OMNI_DATA,
        "colocated": False,
        "encoders": {"vision": {"dp": 1}, "audio": {"dp": 1}},
        "files": ["encoder/model-00000.pt", "encoder.audio/model-00001.pt", "encoder.audio/optim-00001.pt"],
        "reshard": {"encoders": {"vision": {"dp": 1}, "audio": {"dp": 2}}},
    },
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(COLOCATED_RESUMES))
def test_colocated_kill9_then_resume_is_exact(tmp_path, case):
    """Every module's shards on every rank (or, each module on ranks of its own, on its ranks): a job killed
    after iteration 3 resumes from checkpoint 2 and ends with every iteration equal, bit for bit, to a
    straight run of the same run.yaml."""
    kw = {"enc_dp": 0, "llm_dp": 2, "gbs": 4, "iters": 4, "colocated": True, **COLOCATED_RESUMES[case]}
    files, reshard = kw.pop("files", []), kw.pop("reshard", None)
    straight = H.make_run(tmp_path / "straight", **kw)
    assert H.launch(straight).returncode == 0
    y = H.make_run(tmp_path / "resumed", **kw)
    r = H.launch(y, env={"MIMO_CKPT_KILL_AFTER_ITER": "3"})
    assert r.returncode != 0
    r = H.launch(y)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "resumed from checkpoint" in r.stdout and "(iteration 2, 8 samples)" in r.stdout
    assert set(files) <= set(latest_checkpoint(H.ckpt_dir(y)).files)
    want = H.curve(straight)
    for rec in iterations(y.parent / "metrics.jsonl"):
        assert (rec["loss"], rec["grad_norm"], rec["lr"], rec["consumed_samples"]) == want[rec["iteration"]]
    if reshard:
        src = H.ckpt_dir(straight) / "iter_0000002"
        other = H.make_run(tmp_path / "reshard", **{**kw, **reshard}, init={"checkpoint": str(src)})
        r = H.launch(other)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
        got = H.curve(other)
        assert sorted(got) == [3, 4]
        for it, rec in got.items():
            assert rec[0] == pytest.approx(want[it][0], rel=RTOL) and rec[1] == pytest.approx(
                want[it][1], rel=RTOL
            )
            assert rec[2:] == want[it][2:]

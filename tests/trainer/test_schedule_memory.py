"""The encoder's 1F1B schedule across the bridge, activation recompute, and the memory facts every rank
writes. Parity: real torchrun (CPU/gloo, fp32) against the one-process --reference at rtol 1e-5, for every
`encoder_inflight` on a fan-out layout with 4 microbatches, and for selective (with the unfused core attention,
whose scores it drops) and full recompute. Memory:
on a fan-out layout the encoder rank's measured peak of activations saved for backward does not grow with
the microbatch count (before the 1F1B schedule it grew with it: every microbatch's graph was kept until the
first gradient came back), and the LLM's does not either."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers.trainer import make_run_yaml
from mimo_jobs.trainer.observe.memory import SavedTensorMeter

RTOL = 1e-5
FAN_OUT = {"gpn": 3, "enc": {"dp": 1}, "llm": {"dp": 2}}


def _parity(shared_runs, tmp_path: Path, trainer: dict, gbs: int = 8) -> tuple[list[dict], Path]:
    ry = make_run_yaml(tmp_path / "run", gbs=gbs, trainer=trainer, **FAN_OUT)
    r = shared_runs.reference(ry).ok("reference").iterations()
    het = shared_runs.world(ry, 3).ok("torchrun")
    h = het.iterations()
    assert len(h) == len(r) == 3
    for a, b in zip(r, h):
        assert b["loss"] == pytest.approx(a["loss"], rel=RTOL), (a, b)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=RTOL), (a, b)
    return h, het.run_dir


def _facts(run_dir: Path) -> dict[int, dict]:
    return {
        f["rank"]: f
        for f in (json.loads(p.read_text()) for p in sorted((run_dir / "memory").glob("rank-*.json")))
    }


@pytest.mark.slow  # several torchrun processes: CI runs it, the fast local default does not
@pytest.mark.parametrize("inflight", [1, 2])
def test_encoder_inflight_keeps_results_exact(shared_runs, tmp_path, inflight):
    _, run_dir = _parity(shared_runs, tmp_path, {"encoder_inflight": inflight})
    facts = _facts(run_dir)
    assert sorted(facts) == [0, 1, 2]
    assert facts[0]["inflight_peak"] == inflight  # 4 microbatches, never more than `inflight` awaiting
    assert set(facts[0]["modules"]) == {"encoder"} and set(facts[1]["modules"]) == {"language"}
    if inflight == 1:
        _check_ingested(tmp_path, run_dir, facts)


def _check_ingested(tmp_path: Path, run_dir: Path, facts: dict[int, dict]) -> None:
    """ingest stores every rank's facts as written; an unchanged file is not read again."""
    import duckdb

    from mimo_jobs.contract.modules import trainer_slot
    from mimo_jobs.ingest.pipeline import ingest_paths
    from mimo_jobs.store.connection import connect

    con = connect(tmp_path / "s.duckdb")
    try:
        first = ingest_paths(con, [run_dir])
        again = ingest_paths(con, [run_dir])
    finally:
        con.close()
    assert first.memory_rows == 3 and again.memory_rows == 0 and first.problems == []
    con = duckdb.connect(str(tmp_path / "s.duckdb"), read_only=True)
    rows = con.execute(
        "SELECT rank, module, params, optimizer_state_bytes, saved_activation_peak_bytes, inflight_peak "
        "FROM rank_memory ORDER BY rank"
    ).fetchall()
    con.close()
    assert [module for _, module, *_ in rows] == ["vision", "llm", "llm"]  # the study's names
    for rank, module, params, opt_bytes, saved, inflight in rows:
        f = facts[rank]
        slot = trainer_slot(module)  # the trainer writes its facts under its slot names
        assert params == f["modules"][slot]["params"] > 0
        assert opt_bytes == f["modules"][slot]["optimizer_state_bytes"] > 0  # Adam's two moments at least
        assert (saved, inflight) == (f["saved_activation_peak_bytes"], f["inflight_peak"])


@pytest.mark.slow
@pytest.mark.parametrize("recompute", ["selective", "full"])
def test_recompute_keeps_results_exact(shared_runs, tmp_path, recompute):
    # selective recompute drops the core attention's s x s scores: only the unfused core keeps any (torch's
    # SDPA, the default, keeps none, and selective recompute saves it nothing); this also runs the unfused
    # core across processes against the reference
    base = {"attention": "unfused"} if recompute == "selective" else {}
    _, run_dir = _parity(shared_runs, tmp_path, {**base, "recompute": recompute})
    _, plain_dir = _parity(shared_runs, tmp_path / "plain", base)
    # recompute trades activations kept for compute: the LLM ranks keep fewer bytes for backward
    assert (
        _facts(run_dir)[1]["saved_activation_peak_bytes"]
        < _facts(plain_dir)[1]["saved_activation_peak_bytes"]
    )


def _peaks(shared_runs, tmp_path: Path, gbs: int, inflight: int = 2) -> dict[int, int]:
    ry = make_run_yaml(
        tmp_path / f"g{gbs}-i{inflight}", gbs=gbs, iters=2, trainer={"encoder_inflight": inflight}, **FAN_OUT
    )
    run = shared_runs.world(ry, 3).ok(f"gbs {gbs}")
    return {r: f["saved_activation_peak_bytes"] for r, f in _facts(run.run_dir).items()}


@pytest.mark.slow
def test_saved_activations_do_not_grow_with_the_microbatch_count(shared_runs, tmp_path):
    m2, m8 = (
        _peaks(shared_runs, tmp_path, 4),
        _peaks(shared_runs, tmp_path, 16),
    )  # 2 and 8 microbatches over 2 LLM lanes
    assert m2[0] > 0 and m2[1] > 0
    assert m8[0] <= 1.5 * m2[0], (m2, m8)  # encoder rank
    assert m8[1] <= 1.5 * m2[1] and m8[2] <= 1.5 * m2[2], (m2, m8)  # LLM ranks
    # the control: letting all 8 microbatches stay in flight (the schedule without 1F1B) the same meter
    # sees the encoder's saved activations grow with them
    all_in_flight = _peaks(shared_runs, tmp_path, 16, inflight=8)
    assert all_in_flight[0] >= 2.5 * m2[0], (m2, all_in_flight)


def test_the_meter_counts_each_storage_once_and_releases_it_with_the_graph():
    import torch

    w = torch.nn.Parameter(torch.randn(64, 64))
    meter = SavedTensorMeter([w])
    x = torch.randn(32, 64, requires_grad=True)
    with meter.hooks():
        y = (x @ w).relu()  # saves x (matmul) and the relu output; w is a parameter: not counted
        z = y * y  # saves y twice: one storage
        loss = z.sum()
    want = x.numel() * 4 + y.numel() * 4
    assert meter.live == meter.peak == want
    loss.backward()
    del loss, z, y
    assert meter.live == 0 and meter.peak == want


def test_the_meter_counts_what_each_watched_module_saves_to_it_too():
    import torch

    a, b = torch.nn.Linear(64, 64), torch.nn.Linear(64, 32)
    meter = SavedTensorMeter([*a.parameters(), *b.parameters()])
    meter.watch("encoder.audio", a)
    meter.watch("language", b)
    x = torch.randn(16, 64, requires_grad=True)
    with meter.hooks():
        h = a(x)  # saves x: the audio module's
        y = b(h)  # saves h: the LLM's
        loss = (y * y).sum()  # saves y: neither module's, the rank's only
    assert meter.module_peak == {"encoder.audio": x.numel() * 4, "language": h.numel() * 4}
    assert meter.peak == meter.live == sum(meter.module_peak.values()) + y.numel() * 4
    loss.backward()
    del loss, y, h
    assert meter.module_live == {"encoder.audio": 0, "language": 0} and meter.live == 0
    assert meter.module_peak == {"encoder.audio": x.numel() * 4, "language": 16 * 64 * 4}
    assert meter.peak == (16 * 64 + 16 * 64 + 16 * 32) * 4

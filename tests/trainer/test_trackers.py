"""TensorBoard and W&B from the trainer: a real torchrun run (CPU/gloo, tiny-moe) writes event files under
its run directory and an offline W&B run; both are read back with the tools' own readers (TensorBoard's
EventAccumulator, W&B's datastore of the offline run) and must hold, per iteration, the values of the
metrics.jsonl records the same run wrote. The tag mapping itself is checked without processes."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from helpers.trainer import assert_ok, iterations, make_run_yaml, run_torchrun
from mimo_jobs.contract.iteration import IterationRecord
from mimo_jobs.trainer.observe.trackers import samples_twins, scalars_of

RECORD = IterationRecord(
    kind="iteration",
    run_id="r",
    job_id="j",
    attempt=0,
    time="2026-01-01T00:00:00+00:00",
    iteration=7,
    train_iters=10,
    consumed_samples=56,
    elapsed_ms=1250.0,
    lr=3e-4,
    gbs=8,
    loss=2.5,
    grad_norm=None,
    tflops_per_gpu=12.5,
    moe_aux_loss=0.01,
    phases_ms={"enc_fwd": 100.0, "llm_bwd": 300.0},
    extras={"memory": {"mem-max-allocated-bytes": 1024}},
)


def test_scalars_use_megatrons_tags_and_units() -> None:
    s = scalars_of(RECORD)
    assert s["lm loss"] == 2.5 and s["learning-rate"] == 3e-4 and s["batch-size"] == 8
    assert s["iteration-time"] == 1.25  # Megatron logs seconds
    assert s["throughput"] == 12.5 and s["load_balancing_loss"] == 0.01
    assert s["enc_fwd-time"] == 0.1 and s["llm_bwd-time"] == 0.3
    assert s["mem-max-allocated-bytes"] == 1024
    assert "grad-norm" not in s  # a missing value is left out, not logged as 0
    assert samples_twins(s) == {
        "lm loss vs samples": 2.5,
        "learning-rate vs samples": 3e-4,
        "batch-size vs samples": 8,
        "loss-scale vs samples": 1.0,
    }


def _tensorboard_scalars(logdir: Path) -> dict[str, dict[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}


def _wandb_records(path: Path) -> list[bytes]:
    """The protobuf records of a W&B transaction log (`run-<id>.wandb`): a 7-byte header (":W&B", magic
    0xBEE1, version 0), then LevelDB's log format: 32 KiB blocks of records, each a 7-byte header (CRC32C,
    little-endian length, type FULL=1 FIRST=2 MIDDLE=3 LAST=4) and its bytes; a block's last < 7 bytes are
    padding (leveldb doc/log_format.md, wandb sdk/internal/datastore.py of wandb < 0.20)."""
    import struct

    data, block = path.read_bytes(), 32768
    assert data[:4] == b":W&B" and data[4:6] == b"\xe1\xbe", data[:7]
    out, part, pos = [], b"", 7
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == 1:
            out.append(chunk)
        elif kind in (2, 3):
            part += chunk
        elif kind == 4:
            out.append(part + chunk)
            part = b""
    return out


def _wandb_history(run_dir: Path) -> list[dict]:
    """The history rows of the offline W&B run under run_dir/wandb, decoded with W&B's own protobuf."""
    import json

    from wandb.proto import wandb_internal_pb2

    (path,) = (run_dir / "wandb").glob("offline-run-*/run-*.wandb")
    rows = []
    for data in _wandb_records(path):
        rec = wandb_internal_pb2.Record()
        rec.ParseFromString(data)
        if rec.WhichOneof("record_type") == "history":
            rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item})
    return rows


@pytest.fixture(scope="module")
def tracked_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tracked")
    ry = make_run_yaml(
        tmp / "run",
        gpn=3,
        gbs=4,
        enc={"dp": 1},
        llm={"dp": 2},
        model="tiny-moe",
        iters=3,
        trainer={"wandb": {"project": "mimo-jobs-tests", "mode": "offline"}},
    )
    metrics = tmp / "run" / "metrics.jsonl"
    p = run_torchrun(ry, 3, metrics)
    assert_ok(p, "torchrun with trackers")
    return tmp / "run", iterations(metrics)


def test_tensorboard_events_hold_the_metrics_records(tracked_run) -> None:
    run_dir, records = tracked_run
    tb = _tensorboard_scalars(run_dir / "tensorboard")
    assert [r["iteration"] for r in records] == [1, 2, 3]
    for r in records:
        it = r["iteration"]
        assert tb["lm loss"][it] == pytest.approx(r["loss"], rel=1e-6)
        assert tb["learning-rate"][it] == pytest.approx(r["lr"], rel=1e-6)
        assert tb["grad-norm"][it] == pytest.approx(r["grad_norm"], rel=1e-6)
        assert tb["iteration-time"][it] == pytest.approx(r["elapsed_ms"] / 1e3, rel=1e-6)
        assert tb["throughput"][it] == pytest.approx(r["tflops_per_gpu"], rel=1e-6)
        assert tb["load_balancing_loss"][it] == pytest.approx(r["moe_aux_loss"], rel=1e-6)
        assert tb["lm loss vs samples"][r["consumed_samples"]] == pytest.approx(r["loss"], rel=1e-6)
        for phase, ms in r["phases_ms"].items():
            assert tb[f"{phase}-time"][it] == pytest.approx(ms / 1e3, rel=1e-6)
        assert tb["mem-max-rss-bytes"][it] > 0


def test_wandb_offline_history_matches_the_metrics_records(tracked_run) -> None:
    run_dir, records = tracked_run
    history = _wandb_history(run_dir)
    by_step = {h["_step"]: h for h in history}
    assert sorted(by_step) == [1, 2, 3]
    for r in records:
        h = by_step[r["iteration"]]
        assert h["lm loss"] == pytest.approx(r["loss"], rel=1e-9)
        assert h["grad-norm"] == pytest.approx(r["grad_norm"], rel=1e-9)
        assert h["consumed-samples"] == r["consumed_samples"]
        assert math.isclose(h["iteration-time"], r["elapsed_ms"] / 1e3, rel_tol=1e-9)

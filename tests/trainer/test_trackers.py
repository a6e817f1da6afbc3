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


@pytest.mark.slow  # multi-process or real jobs: CI runs it, the fast local default does not
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


# ---------------------------------------------------------------------------- a dashboard never stops training


def _run(tmp: Path, wandb: dict | None = None):
    from mimo_jobs.study.runspec import load_run_yaml

    trainer = {"tensorboard": True} | ({"wandb": wandb} if wandb else {})
    ry = make_run_yaml(tmp / "run", gpn=3, gbs=4, enc={"dp": 1}, llm={"dp": 2}, iters=3, trainer=trainer)
    run, _ = load_run_yaml(ry)
    return run, tmp / "run"


def _one_warning(out: str, what: str) -> None:
    lines = [ln for ln in out.splitlines() if ln.strip()]
    assert len(lines) == 1, out
    assert lines[0].startswith("mimo-jobs trainer: warning: ") and what in lines[0], out


@pytest.mark.parametrize("blocker", ["file", "dangling symlink"])
def test_a_tensorboard_dir_that_cannot_be_made_leaves_tensorboard_out(tmp_path, capsys, blocker) -> None:
    from mimo_jobs.trainer.observe.trackers import trackers_for

    run, run_dir = _run(tmp_path)
    tb = run_dir / "tensorboard"
    tb.parent.mkdir(parents=True, exist_ok=True)
    if blocker == "file":
        tb.write_text("not a directory")
    else:
        tb.symlink_to(tmp_path / "gone")
    trackers = trackers_for(run, run_dir)
    assert trackers.items == []
    _one_warning(capsys.readouterr().out, "TensorBoard left out")
    trackers.log(RECORD)  # logging to no dashboard is fine
    trackers.close()


class _Tracker:
    """A tracker whose close fails like a dashboard that lost its disk."""

    def __init__(self) -> None:
        self.logged = 0

    def log(self, rec) -> None:
        self.logged += 1

    def close(self) -> None:
        raise OSError("No space left on device")


def test_a_tracker_that_cannot_close_is_one_warning(capsys) -> None:
    from mimo_jobs.trainer.observe.trackers import Trackers

    t = _Tracker()
    trackers = Trackers([t])
    trackers.log(RECORD)
    trackers.close()
    assert t.logged == 1 and trackers.items == []
    _one_warning(capsys.readouterr().out, "did not close")


def test_wandb_online_needs_an_api_key(tmp_path, monkeypatch) -> None:
    from mimo_jobs.trainer.observe.trackers import wandb_has_api_key, wandb_mode

    assert wandb_mode("online", has_key=False) == "offline"
    assert wandb_mode("online", has_key=True) == "online"
    assert wandb_mode("offline", has_key=False) == "offline"
    rc = tmp_path / "netrc"
    rc.write_text("machine example.org login user password secret\n")
    assert not wandb_has_api_key({"NETRC": str(rc)})
    rc.write_text("machine api.wandb.ai login user password " + "k" * 40 + "\n")
    assert wandb_has_api_key({"NETRC": str(rc)})
    assert wandb_has_api_key({"WANDB_API_KEY": "k" * 40, "NETRC": str(tmp_path / "none")})


def test_wandb_online_without_a_key_runs_offline_at_once(tmp_path, monkeypatch, capsys) -> None:
    from mimo_jobs.trainer.observe.trackers import WandbTracker, trackers_for

    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # nothing listens: a stray online start fails
    run, run_dir = _run(tmp_path, wandb={"project": "mimo-jobs-tests", "mode": "online"})
    trackers = trackers_for(run, run_dir)
    try:
        (wb,) = [t for t in trackers.items if isinstance(t, WandbTracker)]
        assert wb.run.settings.mode == "offline"
        # at once: offline was chosen before any online start (one against the dead server would have
        # failed, waited for its timeout and said so before falling back)
        assert "W&B online failed" not in capsys.readouterr().err
    finally:
        trackers.close()

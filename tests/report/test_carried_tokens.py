"""The report's headline throughput is the tokens the batches carried: for the demo study (the real trainer's
metrics.jsonl), carried tokens/s equals the sum of the records' carried tokens over the steady window divided
by the sum of their times; the trainer counts exactly the mock samples' content and logs the same rates."""

from __future__ import annotations

import json
import re

import pytest

from helpers.demo_runs import demo_store
from helpers.submit import cli

pytestmark = pytest.mark.slow


def _records(runs, name: str) -> list[dict]:
    (path,) = runs.glob(f"cpu_local/{name}-*/metrics.jsonl")
    recs = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return [r for r in recs if r["kind"] == "iteration"]


def test_carried_tokens_per_s_is_the_window_sum_over_its_time(tmp_path_factory):
    db, runs = demo_store(tmp_path_factory)
    p = cli("report", "cpu_local", "--db", db, "--format", "json", check=True)
    rep = json.loads(p.stdout)
    assert rep["runs"]
    for row in rep["runs"]:
        recs = [r for r in _records(runs, row["name"]) if r["iteration"] >= row["window_from"]]
        carried = sum(r["carried_tokens"] for r in recs)
        secs = sum(r["elapsed_ms"] for r in recs) / 1e3
        assert row["tokens_per_s"] == pytest.approx(carried / secs, rel=1e-9)
        assert row["tokens_per_s_per_gpu"] == pytest.approx(carried / secs / row["gpus"], rel=1e-9)
        loss = sum(r["tokens"] for r in recs)
        assert row["loss_tokens_per_s_per_gpu"] == pytest.approx(loss / secs / row["gpus"], rel=1e-9)
        slots = row["gbs"] * row["seq_length"] * len(recs)
        assert row["padded_share"] == pytest.approx(1 - carried / slots, rel=1e-9)
        assert 0 < row["padded_share"] < 1  # the mock's samples leave padding: the slots overstate
        for r in recs:
            # a mock sample carries its image placeholders and text; all its text but the last token bears
            # loss: carried = loss-bearing + image + one per sample
            assert r["carried_tokens"] == r["tokens"] + r["image_tokens"] + row["gbs"], r


def test_the_trainer_log_line_shows_the_carried_rates(tmp_path_factory):
    _, runs = demo_store(tmp_path_factory)
    logs = [p for p in runs.glob("cpu_local/1n-e1x1-l1x1x3-g6-*/logs/**/*") if p.is_file()]
    lines = [
        x for p in logs for x in p.read_text(errors="replace").splitlines() if "iteration       20/" in x
    ]
    assert lines
    m = re.search(
        r"carried tokens/s/GPU: ([\d.]+) \| loss-bearing tokens/s/GPU: ([\d.]+) \| padded slots", lines[0]
    )
    assert m, lines[0]
    (rec,) = [r for r in _records(runs, "1n-e1x1-l1x1x3-g6") if r["iteration"] == 20]
    world = 4
    secs = rec["elapsed_ms"] / 1e3
    assert float(m.group(1)) == pytest.approx(rec["carried_tokens"] / secs / world, abs=0.06)
    assert float(m.group(2)) == pytest.approx(rec["tokens"] / secs / world, abs=0.06)

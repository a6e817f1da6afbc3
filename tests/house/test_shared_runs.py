"""The test-run-wide cache of trainer runs (helpers.runs): one launch per key, across pytest workers.

The launcher here is a stand-in that writes a metrics line and counts its calls (what is tested is the cache,
not the trainer); the run.yaml files are the real ones the trainer tests render."""

from __future__ import annotations

import json
import multiprocessing
import subprocess
import time
from pathlib import Path

import yaml

from helpers.runs import SharedRuns, reference_key
from helpers.trainer import make_run_yaml


def _counting_launch(log: Path, rc: int = 0, pause: float = 0.0):
    def launch(run_yaml: Path, metrics: Path, reference: bool, nproc: int) -> subprocess.CompletedProcess:
        time.sleep(pause)
        with log.open("a") as f:
            f.write(f"{run_yaml.parent.name}\n")
        metrics.write_text(json.dumps({"kind": "iteration", "iteration": 1, "run": str(run_yaml)}) + "\n")
        return subprocess.CompletedProcess([], rc, stdout=f"out {nproc}", stderr="err")

    return launch


def _launches(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


FO = {"gpn": 3, "gbs": 4, "enc": {"dp": 1}, "llm": {"dp": 2}}
FI = {"gpn": 3, "gbs": 4, "mbs": 2, "enc": {"dp": 2}, "llm": {"dp": 1}}


def test_a_world_is_launched_once_per_run_id_and_rank_count(tmp_path):
    log = tmp_path / "launches"
    runs = SharedRuns(tmp_path / "cache", _counting_launch(log))
    a = runs.world(make_run_yaml(tmp_path / "a", **FO), 3)
    b = runs.world(make_run_yaml(tmp_path / "b", **FO), 3)  # the same run rendered elsewhere
    assert len(_launches(log)) == 1 and a == b
    assert a.run_dir.parent == tmp_path / "cache" and a.stdout == "out 3"
    # the cached run's run.yaml points at its own directory, not at the test's that asked first
    assert yaml.safe_load(a.run_yaml.read_text())["paths"]["run_dir"] == str(a.run_dir)
    assert a.iterations()[0]["run"] == str(a.run_yaml)
    runs.world(make_run_yaml(tmp_path / "c", **FI), 3)  # another layout: another run id
    runs.world(make_run_yaml(tmp_path / "d", **FO, trainer={"seed": 7}), 3)  # another setting
    assert len(_launches(log)) == 3


def test_a_reference_is_shared_by_layouts_but_not_by_what_changes_the_numbers(tmp_path):
    log = tmp_path / "launches"
    runs = SharedRuns(tmp_path / "cache", _counting_launch(log))
    runs.reference(make_run_yaml(tmp_path / "fo", **FO))
    runs.reference(make_run_yaml(tmp_path / "co", gpn=2, gbs=4, colocated=True, llm={"tp": 2}))
    runs.reference(make_run_yaml(tmp_path / "r", **FO, trainer={"recompute": "full", "encoder_inflight": 1}))
    assert len(_launches(log)) == 1
    # microbatches of 2 samples: which samples share one matters (MoE's per-microbatch balancing loss)
    runs.reference(make_run_yaml(tmp_path / "fi", **FI))
    runs.reference(
        make_run_yaml(tmp_path / "fi2", **dict(FI, gpn=4, llm={"dp": 1, "tp": 2}))
    )  # 1 lane: shared
    runs.reference(make_run_yaml(tmp_path / "fi3", **dict(FI, gpn=4, llm={"dp": 2})))  # 2 lanes: not
    assert len(_launches(log)) == 3
    for i, kw in enumerate(
        [
            {"gbs": 8},
            {"model": "tiny-moe"},
            {"trainer": {"seed": 7}},
            {"trainer": {"freeze": {"encoder": True}}},
            {"data": {"text_only_fraction": 0.5}},
            {"iters": 4},
        ]
    ):
        base = dict(FO, **kw)
        runs.reference(make_run_yaml(tmp_path / f"x{i}", **base))
    assert len(_launches(log)) == 9


def test_the_layout_free_key_ignores_paths_and_grids_only(tmp_path):
    a = yaml.safe_load(make_run_yaml(tmp_path / "a", **FO).read_text())
    b = yaml.safe_load(make_run_yaml(tmp_path / "b", gpn=2, gbs=4, colocated=True, llm={"tp": 2}).read_text())
    c = yaml.safe_load(make_run_yaml(tmp_path / "c", **dict(FO, gbs=8)).read_text())
    assert reference_key(a) == reference_key(b) != reference_key(c)


def test_a_failed_launch_is_kept_and_reported_to_every_asker(tmp_path):
    log = tmp_path / "launches"
    runs = SharedRuns(tmp_path / "cache", _counting_launch(log, rc=1))
    ry = make_run_yaml(tmp_path / "a", **FO)
    for _ in range(2):
        got = runs.world(ry, 3)
        assert got.returncode == 1
        try:
            got.ok("the world")
        except AssertionError as e:
            assert "the world failed (rc=1)" in str(e) and "out 3" in str(e)
        else:
            raise AssertionError("a failed launch passed .ok()")
    assert len(_launches(log)) == 1


def _ask(cache: Path, log: Path, ry: Path) -> None:
    SharedRuns(cache, _counting_launch(log, pause=0.5)).world(ry, 3)


def test_workers_asking_at_once_share_one_launch(tmp_path):
    log = tmp_path / "launches"
    ry = make_run_yaml(tmp_path / "a", **FO)
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_ask, args=(tmp_path / "cache", log, ry)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    assert len(_launches(log)) == 1

"""The band every predicted time carries: the held-out error of its GPU generation over the published runs
(hardware.HELD_OUT, recomputed here from benchmarks/published/runs.yaml), shown by validate, predict and
plan, and plan's verdicts that sit inside it called undecided."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from dataclasses import replace

import pytest

from helpers import REPO
from helpers.launch import worker_env
from mimo_jobs.predict import hardware
from mimo_jobs.predict.band import Band, band_for
from mimo_jobs.predict.hardware import GPUS, with_layers
from mimo_jobs.predict.planning import band_lines, plan_many
from mimo_jobs.predict.run import shape_of
from mimo_jobs.predict.steptime import efficiency_for
from mimo_jobs.study.expand import runs_of
from mimo_jobs.study.load import load_study

STUDY = REPO / "studies" / "scale_33n_68n_100n.yaml"


def _bench():
    spec = importlib.util.spec_from_file_location("band_bench", REPO / "benchmarks" / "published.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["band_bench"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_the_stored_bands_are_a_fresh_leave_one_source_out():
    bench = _bench()
    _, rows = bench.load_rows()
    parts = bench.decomposed(rows)
    assert bench.held_out_bands(rows, bench.held_out(rows, parts)) == hardware.HELD_OUT


def test_a_gpu_gets_its_generations_band_and_none_where_nothing_checks_it():
    h100, h200 = band_for(GPUS["H100"]), band_for(GPUS["H200"])
    assert h100 == h200 == Band("hopper", *hardware.HELD_OUT["hopper"])
    assert band_for(GPUS["cpu"]) is None
    assert band_for(with_layers(GPUS["H100"], "local")) is None  # the local-layer shares: one GPU's runs
    assert band_for(replace(GPUS["H100"], name="X9")) is None  # a generation without published runs


def test_inside_the_band_is_relative_to_the_slower_time():
    b = Band("hopper", 0.2, 0.5, 7, 2)
    assert b.contains(1.0, 1.25) and not b.contains(1.0, 1.26)
    assert b.text() == "±20% held out over 7 hopper runs of 2 sources (FLOPs model)"
    assert (
        Band("blackwell", 0.157, 0.157, 1, 1).text()
        == "±16% held out over 1 blackwell run of 1 source (FLOPs model)"
    )


def _plan(band_median: float):
    study = load_study(STUDY)
    run = runs_of(study)[0]
    gpu = GPUS["H100"]
    shape = shape_of(run.layout, run.trainer, checked=False)
    return plan_many(shape, gpu, [32], [768], efficiency_for(gpu), 4, 0), Band("hopper", band_median, 1, 7, 2)


@pytest.mark.parametrize("median", [0.0001, 0.5])
def test_plan_calls_split_against_colocated_decided_only_outside_the_band(monkeypatch, median):
    result, band = _plan(median)
    monkeypatch.setattr("mimo_jobs.predict.planning.band_for", lambda gpu, model="flops": band)
    (p,) = result.plans
    het, colo = p.best_heterogeneous.prediction.time.iteration_s, p.best_colocated.prediction.time.iteration_s
    assert abs(het / colo - 1) > 0.0001  # the two differ, by less than half
    line = next(x for x in band_lines(result) if x.startswith("# band 32 node(s)"))
    assert ("not decided (inside the band)" in line) == (median == 0.5), line
    inside = int(re.search(r"(\d+) of the \d+ shown within the band", line).group(1))
    assert inside == sum(band.contains(c.prediction.time.iteration_s, p.best.prediction.time.iteration_s)
                         for c in p.ranked)  # fmt: skip


# a text-only model on Transformer Engine layers (H100): priced by the operator model, so its band
TEXT_ONLY = REPO / "studies" / "megatron_gpt_mock.yaml"


@pytest.mark.parametrize(
    "study, band",
    [
        # a model with encoder modules on TE layers: the operator model prices it too (its modules by their
        # operators), and its held-out error is the band
        (STUDY, "±10% held out over 45 hopper runs of 5 sources (operator model)"),
        (TEXT_ONLY, "±10% held out over 45 hopper runs of 5 sources (operator model)"),
    ],
)
def test_validate_and_predict_print_the_band_of_the_model_that_priced_the_time(study, band):
    for cmd in (["validate", str(study)], ["predict", str(study)]):
        p = subprocess.run(
            [sys.executable, "-m", "mimo_jobs.cli", *cmd],
            capture_output=True,
            text=True,
            timeout=300,
            env=worker_env() | {"COLUMNS": "300"},
        )
        assert p.returncode == 0, p.stderr
        assert band in p.stdout, cmd

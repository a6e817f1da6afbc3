"""trainer.recompute per module: the study file's forms (one value for both modules, or a mapping), the
predictor pricing each module with its own setting (each module's figures equal those of the uniform
setting it names), and `plan` choosing a per-module setting when the faster settings do not fit."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace

import pytest
import yaml
from typer.testing import CliRunner

from mimo_jobs.cli.app import app
from mimo_jobs.model.attention import keeps_scores
from mimo_jobs.predict import activations as A
from mimo_jobs.predict.estimate import predict_shape
from mimo_jobs.predict.hardware import GIB, get_gpu
from mimo_jobs.predict.layouts import TIE, candidate_layouts, free_bytes, point_dict
from mimo_jobs.predict.run import RunShape, on_layout, shape_of
from mimo_jobs.predict.steptime import Efficiency
from mimo_jobs.study.expand import runs_of
from mimo_jobs.study.load import parse_study
from mimo_jobs.study.spec import RecomputeSpec, StudyError

MODES = ("none", "selective", "full")
H100 = get_gpu("H100")


def _study(recompute=None, llm: str = "dense-1b") -> dict:
    """A SigLIP encoder (729 tokens a 378 px image) beside a small dense LLM on one node of 8 GPUs: the
    encoder's activations weigh as much as the LLM's weights."""
    trainer = {
        "model": {"encoder": "siglip-so400m-14-384", "llm": llm},
        "seq_length": 1024,
        "train_iters": 10,
        "precision": "bf16",
        "data": {"image_sizes": [378]},
    }
    if recompute is not None:
        trainer["recompute"] = recompute
    return {
        "name": "enc_heavy",
        # the FLOPs model's times (steptime.py), which the headrooms below were found on
        "cluster": {
            "executor": "local",
            "gpus_per_node": 8,
            "accelerator": "gpu",
            "hardware": {"gpu": "H100", "time_model": "flops"},
        },
        "trainer": trainer,
        "matrix": {"points": [{"nodes": 1, "encoder": {"dp": 1}, "llm": {"dp": 7}, "gbs": 56}]},
    }


def _shape(recompute=None) -> RunShape:
    run = runs_of(parse_study(_study(recompute)))[0]
    return shape_of(run.layout, run.trainer)


def test_one_value_or_a_mapping():
    assert parse_study(_study()).trainer.recompute == "none"
    assert parse_study(_study("full")).trainer.recompute == "full"  # older studies read as before
    mixed = parse_study(_study({"encoder": "full"})).trainer.recompute
    assert RecomputeSpec.of(mixed) == RecomputeSpec(encoder="full", llm="none")
    assert RecomputeSpec.of("selective") == RecomputeSpec(encoder="selective", llm="selective")
    # a mapping whose modules agree is the one value: the same run, the same id
    same = parse_study(_study({"encoder": "full", "llm": "full"}))
    assert same.trainer.recompute == "full"
    assert runs_of(same)[0].run_id == runs_of(parse_study(_study("full")))[0].run_id
    assert runs_of(parse_study(_study(mixed.compact())))[0].run_id != runs_of(same)[0].run_id


@pytest.mark.parametrize(
    "value, words",
    [
        ("fulll", "'fulll' is not a recompute setting"),
        ({"encoder": "everything"}, "encoder: 'everything' is not a recompute setting"),
        ({"vision": "full"}, "unknown module 'vision' (the modules are encoder and llm)"),
        (True, "True is not a recompute setting"),
    ],
)
def test_bad_recompute_is_named(value, words):
    with pytest.raises(StudyError) as e:
        parse_study(_study(value))
    [(path, msg)] = e.value.problems
    assert path == "trainer.recompute" and words in msg and "{encoder: full, llm: none}" in msg


@pytest.mark.parametrize("layers, attention", [("local", "unfused"), ("local", "sdpa"), ("te", "sdpa")])
def test_each_module_is_priced_with_its_own_setting(layers, attention):
    base = replace(_shape(), attention=attention)
    uniform = {m: replace(base, recompute=RecomputeSpec.of(m)) for m in MODES}
    for enc, llm in itertools.product(MODES, MODES):
        rs = replace(base, recompute=RecomputeSpec(encoder=enc, llm=llm))
        assert A.module_bytes(rs, 0, layers) == A.module_bytes(uniform[enc], 0, layers)
        assert A.llm_bytes(rs, 0, layers) == A.llm_bytes(uniform[llm], 0, layers)
        p = predict_shape(rs, H100, Efficiency())
        pe, pl = (predict_shape(uniform[m], H100, Efficiency()) for m in (enc, llm))
        assert p.time.encoder_mb_s == pe.time.encoder_mb_s and p.time.llm_mb_s == pl.time.llm_mb_s
        got = _activations(p)
        assert got["vision"] == _activations(pe)["vision"] and got["llm"] == _activations(pl)["llm"]
    # the settings differ where they should: full keeps least and costs time, on its own module only
    full_enc = predict_shape(replace(base, recompute=RecomputeSpec(encoder="full")), H100, Efficiency())
    plain = predict_shape(base, H100, Efficiency())
    assert (
        full_enc.time.encoder_mb_s > plain.time.encoder_mb_s and full_enc.time.llm_mb_s == plain.time.llm_mb_s
    )
    for m, nbytes in (
        ("vision", lambda r: A.module_bytes(r, 0, layers)),
        ("llm", lambda r: A.llm_bytes(r, 0, layers)),
    ):
        assert nbytes(uniform["full"]) < nbytes(uniform["selective"]) <= nbytes(uniform["none"]), m
    if keeps_scores(layers, attention):  # the unfused attention keeps its s x s scores unless recomputed
        assert A.llm_bytes(uniform["selective"], 0, layers) < A.llm_bytes(uniform["none"], 0, layers)


def _activations(p) -> dict[str, list[int]]:
    """Each module's activation bytes per rank class (the memory plan's figures)."""
    out: dict[str, list[int]] = {"vision": [], "llm": []}
    for c in p.memory.classes:
        for m in c.modules:
            out[m.module].append(m.activation_bytes)
    return out


def _plan(tmp_path, headroom: int) -> tuple[dict, str]:
    study = tmp_path / "s.yaml"
    study.write_text(yaml.safe_dump(_study()))
    runner = CliRunner()
    args = ["plan", "--from", str(study), "--nodes", "1", "--gpu", "H100", "--headroom", str(headroom)]
    r = runner.invoke(app, [*args, "--json"])
    assert r.exit_code == 0, r.output
    t = runner.invoke(app, args)
    assert t.exit_code == 0, t.output
    return json.loads(r.output), t.output


def _on_layout(point: dict, recompute: str | RecomputeSpec):
    """The plan's point priced again with the study's other settings and `recompute`, encoder_inflight 1."""
    base = _shape()
    mbs = point.get("mbs", 1)  # plan tries other microbatch sizes on its fastest layouts
    [lay] = [
        x for x in (replace(x, mbs=mbs) for x in candidate_layouts(base.layout, 1)) if point_dict(x) == point
    ]
    rs = replace(on_layout(base, lay), encoder_inflight=1, recompute=RecomputeSpec.of(recompute))
    return predict_shape(rs, H100, Efficiency())


@pytest.mark.parametrize(
    "headroom, want",
    [(59, {"encoder": "full", "llm": "none"}), (66, {"encoder": "none", "llm": "full"})],
)
def test_plan_picks_a_per_module_setting_when_the_faster_ones_do_not_fit(
    tmp_path, monkeypatch, headroom, want
):
    # the headrooms were found on the default efficiencies (steptime.Efficiency), which _on_layout prices
    # with; plan would take the H100's fitted ones (hardware.FITTED_EFFICIENCY), which rank these layouts
    # otherwise
    monkeypatch.setattr("mimo_jobs.predict.steptime.FITTED_EFFICIENCY", {})
    doc, text = _plan(tmp_path, headroom)
    assert doc["trainer"] == {"recompute": {"encoder": "none", "llm": "none"}, "encoder_inflight": 2}
    best = doc["plans"][0]["best"]
    assert best["recompute"] == want and best["free_bytes"] >= headroom * GIB
    assert best["trainer"] == {"encoder_inflight": 1, "recompute": want}
    flow = "{" + f"encoder: {want['encoder']}, llm: {want['llm']}" + "}"
    assert f"trainer.recompute: {flow}" in text and "recompute encoder none, LLM none" in text
    # independently, on the same point: no uniform setting that is as fast fits, and the uniform setting
    # that fits (full) is slower
    chosen = _on_layout(best["point"], RecomputeSpec(**want))
    assert chosen.time.iteration_s == pytest.approx(best["iteration_s"])
    for mode in ("none", "selective"):
        assert free_bytes(_on_layout(best["point"], mode)) < headroom * GIB, mode
    full = _on_layout(best["point"], "full")
    assert free_bytes(full) >= headroom * GIB
    assert full.time.iteration_s > chosen.time.iteration_s * (1 + TIE)

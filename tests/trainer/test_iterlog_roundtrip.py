"""The trainer's own Megatron-format iteration lines, read back by ingest's parser, give the values the
trainer recorded in metrics.jsonl (at the precision Megatron's line prints them)."""

from __future__ import annotations

import json

import pytest

from helpers.trainer import make_run_yaml
from mimo_jobs.ingest.iterline import parse_iteration
from mimo_jobs.model.presets import get_preset
from mimo_jobs.study.runspec import load_run_yaml
from mimo_jobs.trainer.observe.iterlog import IterLogger
from mimo_jobs.trainer.step import StepStats

# the line's number formats (Megatron-LM's training_log): field -> format of the printed value
PRINTED = {"elapsed_ms": ".1f", "tflops_per_gpu": ".1f", "lr": ".6E", "loss": ".6E", "grad_norm": ".3f"}


def _as_printed(field: str, v: float) -> float:
    return float(format(v, PRINTED[field]))


@pytest.mark.parametrize("model", ["tiny", "tiny-moe"])
def test_iteration_lines_parse_to_the_metrics_records(tmp_path, capsys, model) -> None:
    ry = make_run_yaml(
        tmp_path / "run", gpn=3, gbs=4, enc={"dp": 1}, llm={"dp": 2}, model=model, trainer={"log_interval": 1}
    )
    run, _ = load_run_yaml(ry)
    plan = run.rank_layout()
    metrics = tmp_path / "metrics.jsonl"
    log = IterLogger(run, plan, metrics, run.trainer.train_iters, active=True, echo=True)
    moe = bool(get_preset(model).llm.num_experts)
    for it in range(1, run.trainer.train_iters + 1):
        stats = StepStats(
            iteration=it,
            loss=4.8523219 / it,
            tokens=128,
            grad_norm=1.23456789 * it,
            lr=3.3333333e-4 * it,
            skipped=it == 2,
            nan=False,
            elapsed_s=0.123456 * it,
            moe_aux_loss=0.0123456789 if moe else None,
            image_tokens=64,
        )
        log.iteration(stats, consumed=it * plan.layout.gbs, preset=get_preset(model), seq_length=32)
    lines = [ln for ln in capsys.readouterr().out.splitlines() if " iteration " in ln]
    records = [json.loads(ln) for ln in metrics.read_text().splitlines()]
    assert len(lines) == len(records) == run.trainer.train_iters
    for line, rec in zip(lines, records):
        got = parse_iteration(line)
        assert got is not None, line
        assert (got.iteration, got.train_iters) == (rec["iteration"], rec["train_iters"])
        assert (got.consumed_samples, got.gbs) == (rec["consumed_samples"], rec["gbs"])
        assert (got.skipped, got.nan) == (rec["skipped"], rec["nan"])
        assert got.loss_scale == rec["loss_scale"]
        for field in PRINTED:
            assert getattr(got, field) == _as_printed(field, rec[field]), (field, line)
        if moe:
            assert got.moe_aux_loss == float(format(rec["moe_aux_loss"], ".6E"))
        else:
            assert got.moe_aux_loss is None and rec["moe_aux_loss"] is None

"""MFU from the FLOPs of what was carried: where the store has a run's counted carried and image tokens,
the FLOPs model takes them per sample instead of the study's data mix (a real store, priced on an H100)."""

from __future__ import annotations

import pytest

from helpers.pair_store import DOC, DP2, HET, TP2, build_report
from mimo_jobs.model.resolve import arch_of
from mimo_jobs.predict.flops import flops_per_sample
from mimo_jobs.predict.hardware import measured_gpu
from mimo_jobs.predict.run import image_mix
from mimo_jobs.study.load import parse_study

TIMES = {HET: 100.0, TP2: 150.0, DP2: 120.0}
CARRIED, IMAGE = 160, 48  # per iteration of GBS 8: 20 and 6 per sample


def _counts(con, runs):
    con.execute(
        "UPDATE iterations SET carried_tokens = ?, image_tokens = ? WHERE run_id = ?",
        [CARRIED, IMAGE, runs[HET].run_id],
    )


def test_mfu_prices_the_carried_tokens(tmp_path):
    rep = build_report(tmp_path, TIMES, prepare=_counts, gpu="H100")
    by = {r.name: r for r in rep.runs}
    h = by[HET]
    assert h.mfu_note == "FLOPs of the carried tokens (measured)"
    assert by[TP2].mfu_note.startswith("image tokens/sample from")  # not counted: the data mix
    arch = arch_of("tiny")
    per_image = image_mix(parse_study(DOC, env={}).trainer.data, arch.encoder)[1]  # the study's image sizes
    fps = flops_per_sample(arch, CARRIED // 8, IMAGE / 8, per_image).total
    peak = measured_gpu(None, "gpu", "H100").peak_flops
    assert h.mfu == pytest.approx(fps * (8 / 0.1) / (2 * peak), rel=1e-9)
    assert by[TP2].mfu != pytest.approx(h.mfu * TIMES[HET] / TIMES[TP2], rel=1e-3)  # priced differently

"""render_json writes the curves itself (speed); the text must be what json.dumps writes for the report."""

from __future__ import annotations

import json
import math
from dataclasses import replace

from helpers.scaling_store import build_store
from mimo_jobs.report import build, render


def reference(report) -> str:
    """The JSON text by the standard library alone (NaN/inf -> null, datetimes as ISO strings)."""

    def clean(o):
        if isinstance(o, float) and not math.isfinite(o):
            return None
        if isinstance(o, dict):
            return {k: clean(v) for k, v in o.items()}
        if isinstance(o, (list, tuple)):
            return [clean(v) for v in o]
        return o

    return json.dumps(clean(report.to_dict()), indent=2, default=lambda o: o.isoformat()) + "\n"


def test_json_is_json_dumps_text(tmp_path):
    con, _ = build_store(tmp_path)
    rep = build(con, "scal", gpu="H100")
    con.close()
    assert len(rep.curves) == 3
    assert render(rep, "json") == reference(rep)
    odd = {
        'a "quoted" run\\é': [(1.0, 2.5), (2.0, float("nan")), (3.0, float("inf")), (4, 1e-300)],
        "empty": [],
        "one": [(8.0, 3.0)],
    }
    for curves in (odd, {}):
        r = replace(rep, curves=curves)
        text = render(r, "json")
        assert text == reference(r)
        assert json.loads(text)["curves"] == json.loads(reference(r))["curves"]


def test_data_fields_are_named_as_the_text_columns(tmp_path):
    """JSON and CSV call the carried tokens what the text calls them (tokens/s: tokens_per_s) and the
    padded gbs x seq_length slots slots_per_s, as the text's slots/s/GPU."""
    import csv
    import io

    import pytest

    from helpers.pair_store import DP2, HET, TP2, build_report

    def carried(con, runs) -> None:  # 40 of each iteration's 8 x 32 slots carry a token
        con.execute("UPDATE iterations SET carried_tokens = 40, tokens = 30, image_tokens = 4")

    rep = build_report(tmp_path, {HET: 100.0, TP2: 150.0, DP2: 120.0}, prepare=carried)
    (row,) = [r for r in json.loads(render(rep, "json"))["runs"] if r["name"] == HET]
    assert row["tokens_per_s"] == pytest.approx(40 / 0.1)
    assert row["tokens_per_s_per_gpu"] == pytest.approx(40 / 0.1 / 2)
    assert row["slots_per_s"] == pytest.approx(8 * 32 / 0.1)
    assert row["slots_per_s_per_gpu"] == pytest.approx(8 * 32 / 0.1 / 2)
    assert "carried_tokens_per_s" not in row
    from mimo_jobs.report.fmt import RUN_HEADERS, run_cells

    (het,) = [r for r in rep.runs if r.name == HET]
    text = dict(zip(RUN_HEADERS, run_cells(het)))
    assert (text["tokens/s"], text["tokens/s/GPU*"], text["slots/s/GPU"]) == ("400", "200.0", "1,280.0")
    (crow,) = [r for r in csv.DictReader(io.StringIO(render(rep, "csv"))) if r["name"] == HET]
    assert float(crow["tokens_per_s"]) == pytest.approx(400) and float(crow["slots_per_s"]) == pytest.approx(
        2560
    )

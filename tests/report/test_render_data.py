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

"""Every heterogeneous run against every colocated run of its study, node count and global batch: a real
store of one heterogeneous and two colocated layouts (helpers/pair_store.py), whose verdict must follow the
timings the records hold."""

from __future__ import annotations

import json

import pytest

from helpers.pair_store import DP2, HET, TP2, build_report
from mimo_jobs.report import render


@pytest.mark.parametrize(
    "times, fastest, het_wins",
    [
        ({HET: 100.0, TP2: 282.0, DP2: 86.0}, DP2, False),  # the faster colocated layout beats heterogeneous
        ({HET: 86.0, TP2: 282.0, DP2: 100.0}, DP2, True),  # timings swapped: heterogeneous wins
        ({HET: 100.0, TP2: 86.0, DP2: 282.0}, TP2, False),  # the other colocated layout is the faster one
    ],
)
def test_heterogeneous_pairs_with_every_colocated_layout(tmp_path, times, fastest, het_wins):
    r = build_report(tmp_path, times)
    assert sorted(p.colocated_run for p in r.pairs) == sorted([TP2, DP2])
    assert all(p.hetero_run == HET for p in r.pairs)
    assert r.unpaired == []
    for p in r.pairs:
        assert p.time_ratio == pytest.approx(times[p.colocated_run] / times[HET], rel=1e-9)
        assert p.best_colocated == (p.colocated_run == fastest)
    (verdict,) = [v for v in r.pair_verdicts if "vs the fastest colocated" in v]
    ratio = times[fastest] / times[HET]
    if het_wins:
        assert f"heterogeneous {HET} is {ratio:.2f}x faster than colocated {fastest}" in verdict
    else:
        assert f"colocated {fastest} is {1 / ratio:.2f}x faster than heterogeneous {HET}" in verdict
    # every format carries both pairs and the verdict against the fastest colocated layout
    table, md, html = render(r, "table"), render(r, "md"), render(r, "html")
    for text in (table, md, html):
        assert "vs the fastest colocated" in text and "unpaired" not in text
    doc = json.loads(render(r, "json"))
    assert len(doc["pairs"]) == 2 and doc["pair_verdicts"] == r.pair_verdicts
    csv_rows = render(r, "csv").splitlines()
    head = csv_rows[0].split(",")
    het_row = next(x for x in csv_rows[1:] if f",{HET}," in x)
    assert fastest in het_row.split(",")[head.index("paired_colocated_run")]
    # the HTML bars show the heterogeneous run and both colocated layouts
    start = html.index('id="chart-pair-time"')
    bars = html[start : html.index("</svg>", start)]
    assert all(n in bars for n in (HET, TP2, DP2))

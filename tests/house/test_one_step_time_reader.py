"""A run's measured seconds per iteration have one rule (mimo_jobs/report/figures.py iteration_s) and one
reader of a store (mimo_jobs/report/steptimes.py): `predict --db`, the report's predicted section and the GPU
smoke's ops check all call them, so the figure they set beside a prediction is the same one."""

from __future__ import annotations

import re

from helpers import REPO

OWNER = "mimo_jobs/report/figures.py"
# the report's steady-state median turned into seconds: what only the owner does
RULE = re.compile(r"t_median_ms\s*/\s*1000")


def test_only_figures_turns_the_median_into_seconds():
    found = [
        f"{p.relative_to(REPO)}:{n}: {line.strip()}"
        for top in ("mimo_jobs", "benchmarks")
        for p in sorted((REPO / top).rglob("*.py"))
        if str(p.relative_to(REPO)) != OWNER
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if RULE.search(line)
    ]
    assert not found, (
        "call figures.iteration_s (a store: steptimes.measured_iteration_s) instead: " + "; ".join(found)
    )

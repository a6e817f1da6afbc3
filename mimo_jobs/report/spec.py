"""A run's resolved RunSpec as the store holds it (runs.spec_json): the report's MFU and predictions read
its cluster.hardware, data and layout from it."""

from __future__ import annotations

import json


def run_spec(r: dict):
    """The RunSpec of a runs row (None: a run known only from its logs, or a spec this version cannot
    read)."""
    from mimo_jobs.study.runspec import RunSpec

    if not r.get("spec_json"):
        return None
    try:
        return RunSpec.from_dict(json.loads(r["spec_json"]))
    except (ValueError, KeyError, TypeError):
        return None

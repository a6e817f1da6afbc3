"""Which run started from which run's checkpoint, read from the store's runs rows (no run directory written).

A run that starts from a mimo-jobs checkpoint says so once, in its own spec (`trainer.init.checkpoint`: an
absolute path, set by the user or by submit when it continues a completed run). The run whose checkpoint
directory holds that path (submit/checkpoints.py's checkpoint_dir, the one rule for where a run saves) is the
source, so both runs' lineage follows from the rows the store already keeps: the completed run shows that
it was continued and by which run without anything written into its directory or its record.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Link:
    source: str  # run id of the run whose checkpoint was loaded
    source_name: str
    target: str  # run id of the run that started from it
    target_name: str
    checkpoint: str  # trainer.init.checkpoint of the target (a checkpoints directory or an iter_N in it)
    weights_only: bool  # the target took the weights only (iteration 0, fresh optimizer)

    def line(self) -> str:
        how = "its weights taken by" if self.weights_only else "continued by"
        return (
            f"{self.source_name} ({self.source}) {how} {self.target_name} ({self.target}) from "
            f"{Path(self.checkpoint).name}"
        )


@dataclass(frozen=True)
class RunRow:
    run_id: str
    name: str
    run_dir: str | None
    spec: dict


def _resolved(p: str | Path) -> Path:
    # run.yaml and trainer.init record resolved paths; the store's run_dir may name the same place unresolved
    return Path(p).expanduser().resolve()


def links(rows: list[RunRow]) -> list[Link]:
    """Every (source, target) pair among `rows`: target's trainer.init.checkpoint lies in source's
    checkpoint directory. A checkpoint outside every row's directory names no source (no link)."""
    from .checkpoints import checkpoint_dir

    dirs = [(r, _resolved(checkpoint_dir(r.run_dir, r.spec))) for r in rows if r.run_dir]
    out = []
    for t in rows:
        init = (t.spec.get("trainer") or {}).get("init") or {}
        if not init.get("checkpoint"):
            continue
        ck = _resolved(init["checkpoint"])
        for s, d in dirs:
            if s.run_id != t.run_id and (ck == d or d in ck.parents):
                out.append(Link(s.run_id, s.name, t.run_id, t.name, str(ck), bool(init.get("weights_only"))))
                break
    return out


def run_rows(con, study: str | None = None) -> list[RunRow]:
    q = "SELECT run_id, name, run_dir, spec_json FROM runs" + (" WHERE study = ?" if study else "")
    return [
        RunRow(rid, name, d, json.loads(s) if isinstance(s, str) else (s or {}))
        for rid, name, d, s in con.execute(q + " ORDER BY idx, name", [study] if study else []).fetchall()
    ]


def study_links(con, study: str | None = None) -> list[Link]:
    """The lineage among the store's runs (of one study, or of all)."""
    return links(run_rows(con, study))

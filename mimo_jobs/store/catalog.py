"""Writers for the `studies` and `runs` tables (shared by submit, render-with-store and ingest of a run
dir that the store has not seen yet: run dirs are self-describing through run.yaml).

The store takes plain records (`StudyRecord`, `RunRecord`), not the study package's spec classes: the study
package says what a run is (`RunSpec.catalog_fields()`), the store only how it is kept."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone


@dataclass(frozen=True)
class StudyRecord:
    name: str
    description: str
    scaling: str | None
    baseline_nodes: int | None
    spec: dict  # the whole study file as parsed (JSON-able)


@dataclass(frozen=True)
class RunRecord:
    run_id: str
    study: str
    name: str
    index: int
    repeat: int
    nodes: int
    gpus_per_node: int
    world: int
    # the runs table's columns of a one-encoder run (the older form, which stores and reports still read;
    # None for several: `modules`, the run_modules rows every run has)
    enc_tp: int | None
    enc_pp: int | None
    enc_dp: int | None
    llm_tp: int
    llm_pp: int
    llm_ep: int
    llm_etp: int
    llm_dp: int
    gbs: int
    mbs: int
    seq_length: int
    model: str
    accelerator: str
    colocated: bool
    spec: dict  # the run's whole spec (JSON-able), what run.yaml holds
    # each encoder module in rank order: store.modules.ModuleRow or its fields (RunSpec.catalog_fields)
    modules: tuple = ()


def _now() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


def record_study(con, study: StudyRecord, source_path: str | None = None) -> None:
    now = _now()
    con.execute(
        """INSERT INTO studies VALUES (?, ?, ?, ?, ?, ?, ?, ?)
           ON CONFLICT (name) DO UPDATE SET description = excluded.description, scaling = excluded.scaling,
             baseline_nodes = excluded.baseline_nodes, source_path = excluded.source_path,
             spec_json = excluded.spec_json, updated_at = excluded.updated_at""",
        [
            study.name,
            study.description,
            study.scaling,
            study.baseline_nodes,
            source_path,
            json.dumps(study.spec),
            now,
            now,
        ],
    )


def record_run(
    con, run: RunRecord, run_dir: str, script_sha256: str | None = None, provenance: dict | None = None
) -> None:
    """Insert the run if new (run ids are content hashes: the same id is the same run)."""
    r, prov = run, provenance or {}
    con.execute(
        """INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, NULL)
           ON CONFLICT (run_id) DO UPDATE SET run_dir = excluded.run_dir,
             script_sha256 = coalesce(excluded.script_sha256, runs.script_sha256)""",
        [
            r.run_id,
            r.study,
            r.name,
            r.index,
            r.repeat,
            r.nodes,
            r.gpus_per_node,
            r.world,
            r.enc_tp,
            r.enc_pp,
            r.enc_dp,
            r.llm_tp,
            r.llm_pp,
            r.llm_ep,
            r.llm_etp,
            r.llm_dp,
            r.gbs,
            r.mbs,
            r.seq_length,
            r.model,
            r.accelerator,
            str(run_dir),
            json.dumps(r.spec),
            script_sha256,
            prov.get("version"),
            prov.get("git_sha"),
            _now(),
            r.colocated,
        ],
    )
    if r.modules:
        from .modules import record_modules

        record_modules(con, r.run_id, r.modules)


# The runs columns `ingest --layout/--model` may tell about a run known from its logs (enc_*: the older
# one-encoder columns, beside its run_modules rows).
LOG_LAYOUT_COLUMNS = tuple(
    "nodes gpus_per_node world enc_tp enc_pp enc_dp llm_tp llm_pp llm_ep llm_etp llm_dp gbs mbs seq_length "
    "model accelerator colocated".split()
)


def record_log_layout(con, run_id: str, fields: dict, spec: dict | None = None) -> None:
    """What the user told about a run known from its logs (its layout, model, ...): those columns are
    replaced, the others kept; `spec`, when given, is the run's whole description."""
    if fields.get("modules"):
        from .modules import record_modules

        record_modules(con, run_id, fields["modules"])
    # a layout told replaces the one encoder's columns too (None: several encoders, in run_modules)
    told_layout = "modules" in fields
    cols = [
        c for c in LOG_LAYOUT_COLUMNS if fields.get(c) is not None or (told_layout and c.startswith("enc_"))
    ]
    sets = [f"{c} = ?" for c in cols] + (["spec_json = ?"] if spec is not None else [])
    if not sets:
        return
    args = [fields.get(c) for c in cols] + ([json.dumps(spec)] if spec is not None else [])
    con.execute(f"UPDATE runs SET {', '.join(sets)} WHERE run_id = ?", [*args, run_id])


def ensure_study(
    con,
    name: str,
    description: str = "",
    scaling: str | None = None,
    baseline_nodes: int | None = None,
    source_path: str | None = None,
) -> None:
    """A minimal studies row when only a run.yaml (or a bare log) is known. Never overwrites a row that
    submit/render wrote from the full study file (that one has the matrix and the scaling mode)."""
    now = _now()
    con.execute(
        """INSERT INTO studies VALUES (?, ?, ?, ?, ?, NULL, ?, ?) ON CONFLICT (name) DO NOTHING""",
        [name, description, scaling, baseline_nodes, source_path, now, now],
    )


def record_log_run(
    con,
    run_id: str,
    study: str,
    name: str,
    run_dir: str,
    nodes: int | None = None,
    gpus_per_node: int | None = None,
    seq_length: int | None = None,
    gbs: int | None = None,
    model: str | None = None,
    accelerator: str | None = None,
) -> None:
    """A runs row for logs that came without a run.yaml (e.g. upstream Megatron-LM output): only what the
    user told `ingest` (--nodes/--gpus-per-node/--seq-length) and what the log says (gbs)."""
    world = nodes * gpus_per_node if nodes and gpus_per_node else None
    con.execute(
        """INSERT INTO runs (run_id, study, name, nodes, gpus_per_node, world, gbs, seq_length, model,
                             accelerator, run_dir, created_at)
           VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
           ON CONFLICT (run_id) DO UPDATE SET gbs = coalesce(runs.gbs, excluded.gbs),
             nodes = coalesce(excluded.nodes, runs.nodes), gpus_per_node = coalesce(excluded.gpus_per_node,
             runs.gpus_per_node), world = coalesce(excluded.world, runs.world),
             seq_length = coalesce(excluded.seq_length, runs.seq_length)""",
        [
            run_id,
            study,
            name,
            nodes,
            gpus_per_node,
            world,
            gbs,
            seq_length,
            model,
            accelerator,
            run_dir,
            _now(),
        ],
    )

"""Writers for the `studies` and `runs` tables (shared by submit, render-with-store and ingest of a run
dir that the store has not seen yet: run dirs are self-describing through run.yaml)."""

from __future__ import annotations

import json
from datetime import datetime, timezone

from mimo_jobs.study.runspec import RunSpec
from mimo_jobs.study.spec import StudySpec


def _now() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


def record_study(con, study: StudySpec, source_path: str | None = None) -> None:
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
            json.dumps(study.model_dump(mode="json")),
            now,
            now,
        ],
    )


def record_run(
    con, spec: RunSpec, run_dir: str, script_sha256: str | None = None, provenance: dict | None = None
) -> None:
    """Insert the run if new (run ids are content hashes: the same id is the same run)."""
    lay, prov = spec.layout, provenance or {}
    con.execute(
        """INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
           ON CONFLICT (run_id) DO UPDATE SET run_dir = excluded.run_dir,
             script_sha256 = coalesce(excluded.script_sha256, runs.script_sha256)""",
        [
            spec.run_id,
            spec.study,
            spec.name,
            spec.index,
            spec.repeat,
            lay.nodes,
            lay.gpus_per_node,
            lay.world,
            lay.enc_tp,
            lay.enc_pp,
            lay.enc_dp,
            lay.llm_tp,
            lay.llm_pp,
            lay.llm_ep,
            lay.llm_etp,
            lay.llm_dp,
            lay.gbs,
            lay.mbs,
            spec.trainer.seq_length,
            spec.trainer.model,
            spec.cluster.accelerator,
            str(run_dir),
            json.dumps(spec.to_dict()),
            script_sha256,
            prov.get("version"),
            prov.get("git_sha"),
            _now(),
            lay.colocated,
        ],
    )


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

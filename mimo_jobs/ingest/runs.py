"""The run each ingested file belongs to: run dirs are registered from their run.yaml, loose logs as runs
known only from logs (LogRunInfo says what the user told about them)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from mimo_jobs.plan.rundir import RunDir
from mimo_jobs.store import catalog

from .discover import IngestError, Target


@dataclass(frozen=True)
class LogRunInfo:
    """What the user says about logs that come without a run.yaml (upstream Megatron-LM output)."""

    study: str = "logs"
    name: str | None = None
    nodes: int | None = None
    gpus_per_node: int | None = None
    seq_length: int | None = None


@dataclass
class RunCtx:
    run_id: str
    gpus_per_node: int | None
    has_metrics: bool  # metrics.jsonl carries the iterations: log lines then only give events


def register_runs(con, targets: list[Target], log_run: LogRunInfo | None) -> tuple[dict, int]:
    """Record the runs of `targets`: run dirs first (all run.yaml files parsed before anything is written),
    then loose logs. Returns (RunCtx per run dir path and per loose log's resolved path, runs new to the
    store)."""
    specs = _load_run_yamls(sorted({t.run_dir for t in targets if t.run_dir is not None}))
    ctx: dict[Path | str, RunCtx] = {}
    new = 0
    for rd, (spec, doc) in specs.items():
        if not _known(con, spec.run_id):
            catalog.ensure_study(con, spec.study, description="(recorded by ingest from run.yaml)")
            catalog.record_run(con, spec, str(rd.resolve()), provenance=doc.get("provenance") or {})
            new += 1
        ctx[rd] = RunCtx(spec.run_id, spec.layout.gpus_per_node, RunDir(rd).metrics.is_file())
    info = log_run or LogRunInfo()
    for t in targets:
        if t.run_dir is None:
            ctx[t.src], is_new = _register_log_run(con, t, info)
            new += is_new
    return ctx, new


def ctx_of(ctx: dict, t: Target) -> RunCtx | None:
    """The run a target belongs to (register_runs keys run dirs by path, loose log files by resolved path)."""
    return ctx.get(t.run_dir) if t.run_dir is not None else ctx.get(t.src)


def _known(con, run_id: str) -> bool:
    return con.execute("SELECT 1 FROM runs WHERE run_id = ?", [run_id]).fetchone() is not None


def _load_run_yamls(run_dirs: list[Path]) -> dict:
    from mimo_jobs.plan.runspec import load_run_yaml

    specs = {}
    for rd in run_dirs:
        try:
            specs[rd] = load_run_yaml(rd / "run.yaml")
        except Exception as e:  # noqa: BLE001 - any parse/validation failure names the file
            raise IngestError(f"{rd / 'run.yaml'}: cannot read run description: {e}") from None
    return specs


def _register_log_run(con, t: Target, info: LogRunInfo) -> tuple[RunCtx, bool]:
    """A loose log's run: one run per file unless the user names the run (then all given files are its
    attempts). Returns (its RunCtx, whether the run is new to the store)."""
    ident = f"{info.study}/{info.name}" if info.name else t.src
    rid = "log-" + hashlib.sha1(ident.encode()).hexdigest()[:10]
    known = _known(con, rid)
    catalog.ensure_study(con, info.study, description="(logs ingested without a run.yaml)")
    catalog.record_log_run(
        con,
        rid,
        info.study,
        info.name or t.path.stem,
        str(Path(t.src).parent),
        nodes=info.nodes,
        gpus_per_node=info.gpus_per_node,
        seq_length=info.seq_length,
    )
    return RunCtx(rid, info.gpus_per_node, False), not known

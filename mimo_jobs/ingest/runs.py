"""The run each ingested file belongs to: run dirs are registered from their run.yaml, loose logs as runs
known only from logs (LogRunInfo says what the user told about them)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from mimo_jobs.contract.rundir import RunDir
from mimo_jobs.store import catalog
from mimo_jobs.store.attempts import copy_named

from .discover import IngestError, Target
from .layout import Told


@dataclass(frozen=True)
class LogRunInfo:
    """What the user says about logs that come without a run.yaml (upstream Megatron-LM output)."""

    study: str = "logs"
    name: str | None = None
    nodes: int | None = None
    gpus_per_node: int | None = None
    seq_length: int | None = None
    told: Told | None = None  # --layout/--model (ingest/layout.py)


@dataclass
class RunCtx:
    run_id: str
    gpus_per_node: int | None
    has_metrics: bool  # metrics.jsonl carries the iterations: log lines then only give events
    # launched by this toolkit's scripts (a run dir): srun starts one task per node (task N = node N);
    # other logs usually come from `srun --ntasks-per-node=<GPUs>` (task N = global rank N)
    ours: bool = True
    nodes: int | None = None  # known from run.yaml or --nodes: on one node an NCCL device index is a rank


@dataclass
class Registration:
    """What register_runs found: the run of each file, how many runs are new to the store, and the writes
    that record them, not yet made. They are made inside the first transaction that stores a file's rows
    (`write`, again in the next one if that one is rolled back): an ingest stopped by the store itself (a
    full disk, the file-size limit) leaves no run without the rows it was registered for."""

    ctx: dict
    new: int
    writes: list[Callable[[object], None]] = field(default_factory=list)

    def write(self, con) -> None:
        for w in self.writes:
            w(con)

    def written(self) -> None:
        """The transaction that made the writes committed."""
        self.writes = []


def register_runs(con, targets: list[Target], log_run: LogRunInfo | None) -> Registration:
    """Find the runs of `targets`: run dirs first (all run.yaml files parsed before anything is decided),
    then loose logs. Reads the store only; the records are Registration.writes (RunCtx per run dir path and
    per loose log's resolved path)."""
    specs = _load_run_yamls(sorted({t.run_dir for t in targets if t.run_dir is not None}))
    ctx: dict[Path | str, RunCtx] = {}
    reg = Registration(ctx, 0)
    for rd, (spec, doc) in specs.items():
        if not _known(con, spec.run_id):
            reg.writes.append(partial(_record_run_dir, rd=rd, spec=spec, doc=doc))
            reg.new += 1
        # the order of attempts is the run directory's record; the store keeps a copy (store/attempts.py)
        reg.writes.append(partial(copy_named, run_id=spec.run_id, run_dir=rd))
        lay = spec.layout
        ctx[rd] = RunCtx(
            run_id=spec.run_id,
            gpus_per_node=lay.gpus_per_node,
            has_metrics=RunDir(rd).metrics.is_file(),
            nodes=lay.nodes,
        )
    loose = [t for t in targets if t.run_dir is None]
    if log_run is not None and log_run.told is not None and not loose:
        raise IngestError("--layout/--model describe logs without a run.yaml; these paths are all run dirs")
    if loose:
        reg.new += _register_log_runs(con, loose, log_run or LogRunInfo(), ctx, reg.writes)
    return reg


def _record_run_dir(con, rd: Path, spec, doc: dict) -> None:
    catalog.ensure_study(con, spec.study, description="(recorded by ingest from run.yaml)")
    catalog.record_run(
        con,
        catalog.RunRecord(**spec.catalog_fields()),
        str(rd.resolve()),
        provenance=doc.get("provenance") or {},
    )


def ctx_of(ctx: dict, t: Target) -> RunCtx | None:
    """The run a target belongs to (register_runs keys run dirs by path, loose log files by resolved path)."""
    return ctx.get(t.run_dir) if t.run_dir is not None else ctx.get(t.src)


def _known(con, run_id: str) -> bool:
    return con.execute("SELECT 1 FROM runs WHERE run_id = ?", [run_id]).fetchone() is not None


def _load_run_yamls(run_dirs: list[Path]) -> dict:
    from mimo_jobs.study.runspec import load_run_yaml

    specs = {}
    for rd in run_dirs:
        try:
            specs[rd] = load_run_yaml(RunDir(rd).run_yaml)
        except Exception as e:  # noqa: BLE001 - any parse/validation failure names the file
            raise IngestError(f"{rd / 'run.yaml'}: cannot read run description: {e}") from None
    return specs


def _log_run_id(t: Target, info: LogRunInfo) -> str:
    """One run per loose file, unless the user names the run: then all given files are its attempts."""
    ident = f"{info.study}/{info.name}" if info.name else t.src
    return "log-" + hashlib.sha1(ident.encode()).hexdigest()[:10]


def _register_log_runs(con, loose: list[Target], info: LogRunInfo, ctx: dict, writes: list) -> int:
    """Find the runs of loose logs; fills `ctx` by resolved path and `writes` with their records, returns
    how many runs are new. A run already in the store is only written again when the user tells something
    new about it (--nodes ...): re-ingesting thousands of unchanged logs then costs no writes."""
    ids = {t.src: _log_run_id(t, info) for t in loose}
    _refuse_moves(con, ids)
    known = _known_ids(con, set(ids.values()))
    tells = info.told is not None or any(
        v is not None for v in (info.nodes, info.gpus_per_node, info.seq_length)
    )
    if len(known) < len(set(ids.values())):
        writes.append(
            partial(catalog.ensure_study, name=info.study, description="(logs ingested without a run.yaml)")
        )
    new = 0
    for t in loose:
        rid = ids[t.src]
        if rid not in known or tells:
            writes.append(partial(_record_log_run, rid=rid, info=info, t=t))
        if rid not in known:
            known.add(rid)
            new += 1
        told = info.told.fields if info.told is not None else {}
        ctx[t.src] = RunCtx(
            rid,
            told.get("gpus_per_node", info.gpus_per_node),
            False,
            ours=False,
            nodes=told.get("nodes", info.nodes),
        )
    return new


def _record_log_run(con, rid: str, info: LogRunInfo, t: Target) -> None:
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
    if info.told is not None:
        catalog.record_log_layout(con, rid, info.told.fields, _own_spec(info.told.spec, rid, info, t))


def _own_spec(spec: dict | None, run_id: str, info: LogRunInfo, t: Target) -> dict | None:
    """A study run's spec told for a log: the log run's own identity in it."""
    if spec is None:
        return None
    return {**spec, "study": info.study, "name": info.name or t.path.stem, "run_id": run_id}


def _known_ids(con, run_ids: set[str]) -> set[str]:
    rows = con.execute(
        "SELECT run_id FROM runs WHERE run_id IN (SELECT unnest(?::VARCHAR[]))", [sorted(run_ids)]
    ).fetchall()
    return {r[0] for r in rows}


def _refuse_moves(con, ids: dict[str, str]) -> None:
    """A file's rows belong to the run it was first ingested into: ingested again under another --study or
    --name it would leave an empty new run beside the old one. Refused before anything is written."""
    rows = con.execute(
        """SELECT f.path, f.run_id, r.study, r.name FROM ingested_files f LEFT JOIN runs r USING (run_id)
           WHERE f.path IN (SELECT unnest(?::VARCHAR[]))""",
        [list(ids)],
    ).fetchall()
    moved = [(path, study, name) for path, rid, study, name in rows if rid != ids[path]]
    if not moved:
        return
    path, study, name = moved[0]
    more = f" (and {len(moved) - 1} more file(s))" if len(moved) > 1 else ""
    raise IngestError(
        f"{path}{more}: already ingested as run {name!r} of study {study!r}; ingest it with the "
        f"--study/--name it had (a file belongs to one run), or into a new --db to group it differently"
    )

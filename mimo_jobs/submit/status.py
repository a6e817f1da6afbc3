"""What `status` shows per run: its latest job, that job's last iteration and loss (from the store, else from
the tail of metrics.jsonl for runs not ingested yet) and the iteration its latest complete checkpoint holds.

Progress is the latest job's own: while a retry or requeue waits or starts, the iterations an earlier attempt
logged are not its progress (the checkpoint column says where it resumes), so it shows none until it logs one.
A job that completed without logging one (it resumed from a checkpoint of the last iteration) shows where the
run ended.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from mimo_jobs.contract import jobstates
from mimo_jobs.contract.rundir import RunDir

from .jobs_table import JobRow, latest_jobs


def read_tail(path: str | Path | None, max_bytes: int = 256_000) -> str:
    """The end of a log (errors are at the end; logs can be large)."""
    if not path:
        return ""
    p = Path(path)
    try:
        with p.open("rb") as fh:
            size = fh.seek(0, 2)
            fh.seek(max(0, size - max_bytes))
            return fh.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


@dataclass
class RunStatus:
    study: str
    run: str
    run_id: str
    nodes: int
    run_dir: str
    train_iters: int | None
    job: JobRow | None
    iteration: int | None = None
    loss: float | None = None
    iter_source: str | None = None  # store | metrics.jsonl
    checkpoint: int | None = (
        None  # iteration of the run's latest complete checkpoint (what a requeue resumes)
    )
    superseded_by: str | None = None  # run id of the later attempt of the same point (store/attempts.py)

    @property
    def shown_superseded(self) -> bool:
        """Shown as superseded: a later attempt replaced it and its own job no longer runs."""
        return self.superseded_by is not None and (self.job is None or not self.job.active)


def unfinished(statuses: list[RunStatus]) -> list[RunStatus]:
    """The latest attempts (superseded runs left out) whose job did not complete: what makes `submit
    --wait` and `demo` exit 1."""
    return [
        s
        for s in statuses
        if s.superseded_by is None and (s.job is None or not jobstates.is_success(s.job.state))
    ]


def last_iteration_from_metrics(path: Path, job_id: str | None = None) -> tuple[int, float] | None:
    """The newest iteration record in metrics.jsonl (for runs not ingested yet), of job `job_id` when given:
    read the tail only."""
    text = read_tail(path, 64_000)
    for line in reversed(text.splitlines()):
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if not (isinstance(d, dict) and d.get("kind", "iteration") == "iteration" and "iteration" in d):
            continue
        if job_id is not None and str(d.get("job_id")) != job_id:
            continue
        try:
            return int(d["iteration"]), float(d["loss"]) if d.get("loss") is not None else float("nan")
        except (TypeError, ValueError):
            continue
    return None


def last_checkpoint_iteration(run_dir: Path, spec: dict, con=None, run_id: str | None = None) -> int | None:
    """The iteration of the run's newest complete checkpoint, whichever program saved it (submit/checkpoints.py;
    no torch is imported)."""
    from .checkpoints import resumable_iteration

    return resumable_iteration(run_dir, spec, con, run_id)


def run_statuses(con, study: str | None = None) -> list[RunStatus]:
    q = "SELECT study, name, run_id, nodes, run_dir, spec_json FROM runs"
    rows = con.execute(
        q + (" WHERE study = ?" if study else "") + " ORDER BY study, idx, name", [study] if study else []
    ).fetchall()
    from mimo_jobs.store.attempts import superseded

    latest = latest_jobs(con, [r[2] for r in rows])
    later = superseded(con, study)
    last = _last_iterations(con, [r[2] for r in rows]) if rows else {}
    out = []
    for st, name, rid, nodes, run_dir, spec in rows:
        spec = json.loads(spec) if isinstance(spec, str) else (spec or {})
        job = latest.get(rid)
        rs = RunStatus(st, name, rid, nodes, run_dir, (spec.get("trainer") or {}).get("train_iters"), job)
        rs.superseded_by = later.get(rid)
        if run_dir:
            rs.checkpoint = last_checkpoint_iteration(Path(run_dir), spec, con, rid)
        key = (rid, job.job_id if job is not None else None)  # a run without jobs: whatever was ingested
        if key in last:
            rs.iteration, rs.loss, rs.iter_source = last[key][0], last[key][1], "store"
        elif run_dir:
            m = last_iteration_from_metrics(RunDir(Path(run_dir)).metrics, key[1])
            if m:
                rs.iteration, rs.loss, rs.iter_source = m[0], m[1], "metrics.jsonl"
        if (
            rs.iteration is None
            and job is not None
            and jobstates.is_success(job.state)
            and (rid, None) in last
        ):
            # a job that completed without an iteration of its own resumed from a checkpoint holding all of
            # them (an earlier attempt was cancelled as it saved its last one): the run ended where it got
            rs.iteration, rs.loss, rs.iter_source = *last[(rid, None)], "store"
        out.append(rs)
    return out


def _last_iterations(con, run_ids: list[str]) -> dict[tuple[str, str | None], tuple[int, float | None]]:
    """(run id, job id) -> that job's newest stored (iteration, loss); (run id, None) -> the run's newest."""
    cols = {c[0] for c in con.execute("DESCRIBE iterations").fetchall()}
    live = " AND NOT coalesce(superseded, false)" if "superseded" in cols else ""
    out: dict[tuple[str, str | None], tuple[int, float | None]] = {}
    for rid, job, it, loss in con.execute(
        f"""SELECT run_id, job_id, iteration, loss FROM iterations WHERE run_id IN (SELECT unnest(?)){live}
                QUALIFY row_number() OVER (PARTITION BY run_id, job_id ORDER BY iteration DESC) = 1""",
        [run_ids],
    ).fetchall():
        out[(rid, job)] = (it, loss)
        if (rid, None) not in out or it > out[(rid, None)][0]:
            out[(rid, None)] = (it, loss)
    return out


def tensorboard_commands(statuses: list[RunStatus]) -> list[str]:
    """One `tensorboard --logdir <runs root>/<study>` per study whose runs have written event files: the
    study's directory holds every run's tensorboard/ folder, so TensorBoard overlays them."""
    import shlex

    roots: dict[str, None] = {}
    for st in statuses:
        if st.run_dir and RunDir(Path(st.run_dir)).tensorboard.is_dir():
            roots[str(Path(st.run_dir).parent)] = None
    return [f"tensorboard --logdir {shlex.quote(r)}" for r in roots]

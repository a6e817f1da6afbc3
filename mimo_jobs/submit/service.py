"""Submission core: which runs of a study to submit, submitting them crash-safely, following them, applying the
retry/requeue policy when a job ends, and cancelling.

One script, one truth: `render` writes <run dir>/{run.yaml, launch.sh, sbatch.sh} and the executor's own
files; each executor submits its rendered file itself (`Executor.launch_file`): the slurm executor that
sbatch.sh (`sbatch --parsable --chdir=<run dir> sbatch.sh`), the local executor that launch.sh (the script
sbatch.sh starts on every node through srun), the Kubernetes executor that trainjob.yaml (whose pods run
launch.sh). Executors are found by name in executors/registry.py.

Store consistency (no job row without a scheduler job, nor the reverse):
- a submission that the scheduler refuses writes nothing;
- a job is recorded in its own transaction right after sbatch returns; if that write fails the job is
  cancelled again before the error is raised;
- a crash between sbatch returning and the commit (the only window left) is closed by an intent file
  (RunDir.submit_intent) written before sbatch: the next submit/status finds the job the scheduler
  knows for that run dir (sacct/squeue WorkDir, or the local runner's state file) and records it.

Submit does not read logs: when a job ends, the policy decides from the event kinds ingest stored for it
(the events table), and the caller (the CLI) supplies the ingest step that stores them (`Follow`).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from mimo_jobs import __version__
from mimo_jobs.contract.rundir import RunDir
from mimo_jobs.errors import MimoJobsError
from mimo_jobs.store import catalog
from mimo_jobs.study.runspec import RunSpec
from mimo_jobs.study.spec import StudySpec

from . import jobs_table, policy, status
from .executors import Executor, SubmitError, get_executor

INTENT_MAX_AGE_S = 300  # an intent with no scheduler job after this long was a refused submission


class LaunchError(MimoJobsError, RuntimeError):
    """A user-facing problem (unknown run, missing render, scheduler refused); the message says which."""


# ------------------------------------------------------------------------------------------- executors

_EXECUTORS: dict[str, Executor] = {}


def executor(name: str) -> Executor:
    """One instance per process (the slurm one counts its sacct time for the benchmark)."""
    if name not in _EXECUTORS:
        _EXECUTORS[name] = get_executor(name)
    return _EXECUTORS[name]


# ------------------------------------------------------------------------------------------- provenance

_PROV: dict | None = None


def provenance() -> dict:
    """Package version and git sha (render's provenance, computed once per process) for the runs table."""
    global _PROV
    if _PROV is None:
        from mimo_jobs.study.render import provenance as render_provenance

        p = render_provenance()
        sha = p.get("git_sha")
        _PROV = {
            "version": p.get("mimo_jobs_version", __version__),
            "git_sha": (sha + "-dirty") if sha and p.get("git_dirty") else sha,
        }
    return _PROV


# ------------------------------------------------------------------------------------------- selection


def select_runs(runs: list[RunSpec], only: list[str] | None, source: str) -> list[RunSpec]:
    """--only takes run names or run ids; an unknown one is an error that lists what exists."""
    if not only:
        return runs
    by = {r.name: r for r in runs} | {r.run_id: r for r in runs}
    bad = [o for o in only if o not in by]
    if bad:
        names = ", ".join(r.name for r in runs)
        raise LaunchError(f"{source}: no run named {', '.join(map(repr, bad))} (runs: {names})")
    seen: dict[str, RunSpec] = {}
    for o in only:
        seen[by[o].run_id] = by[o]
    return list(seen.values())


def check_executor(runs: list[RunSpec], executor_name: str) -> None:
    """What the executor says it cannot run (the local one runs one node; the Kubernetes one needs its
    study section), all at once."""
    problems = executor(executor_name).problems(runs)
    if problems:
        raise LaunchError("\n".join(problems))


@dataclass
class Selection:
    submit: list[RunSpec] = field(default_factory=list)
    keep: list[tuple[RunSpec, jobs_table.JobRow]] = field(default_factory=list)  # pending/running/completed
    attempts: dict[str, int] = field(default_factory=dict)  # run id -> attempt number of the new job
    notes: list[str] = field(default_factory=list)  # what the user should know (continuations)


def plan_submit(con, runs: list[RunSpec], force: bool) -> Selection:
    """Runs whose newest job is pending, running or completed are kept; a changed run spec has a new run id
    and so no jobs yet. A pending or running job is kept even with --force: a second job of the run would
    write the same run and checkpoint directories beside it. A completed run is never run again
    (store/attempts.py says why): --force naming one is refused, with what to do, before anything is
    submitted."""
    from mimo_jobs.contract import jobstates
    from mimo_jobs.store.attempts import rerun_refused

    latest = jobs_table.latest_jobs(con, [r.run_id for r in runs])
    if force:
        done = [
            (r, latest[r.run_id])
            for r in runs
            if r.run_id in latest and latest[r.run_id].state in jobstates.SUCCESS
        ]
        if done:
            raise LaunchError(
                "--force: " + "\n".join(rerun_refused(r.name, r.run_id, j.job_id) for r, j in done)
            )
    sel = Selection()
    for r in runs:
        j = latest.get(r.run_id)
        if j is not None and j.state in jobstates.ACTIVE and force:
            sel.keep.append((r, j))
            sel.notes.append(
                f"not resubmitted {r.name}: job {j.job_id} is {j.state} and writes its run directory; "
                f"--force resubmits ended runs only (cancel it first: mimo-jobs cancel {r.study} --run {r.name})"
            )
            continue
        if j is not None and j.state in jobs_table.KEEP_STATES and not force:
            sel.keep.append((r, j))
            continue
        if j is None:
            r = _continuation(con, r, sel.notes)
        sel.submit.append(r)
        sel.attempts[r.run_id] = 0 if j is None else j.attempt + 1
    return sel


def _continuation(con, r: RunSpec, notes: list[str]) -> RunSpec:
    """A new run that differs from a completed run of its study only by a longer train_iters/train_samples
    starts from that run's latest checkpoint (trainer.init.checkpoint), in its own run directory; the
    completed run's directory is never written."""
    import dataclasses

    from mimo_jobs.contract import jobstates
    from mimo_jobs.study.spec import InitSpec

    from .checkpoints import continuation_source

    rows = con.execute("SELECT run_id, run_dir, spec_json FROM runs WHERE study = ?", [r.study]).fetchall()
    latest = jobs_table.latest_jobs(con, [rid for rid, _, _ in rows])
    done = [
        (d, json.loads(s) if isinstance(s, str) else s)
        for rid, d, s in rows
        if d and s and rid in latest and latest[rid].state in jobstates.SUCCESS
    ]
    found = continuation_source(r.to_dict(), done)
    if found is None:
        return r
    src, old = found
    notes.append(
        f"{r.name} ({r.run_id}): continues completed run {old} from {src} (only "
        "train_iters/train_samples grew: trainer.init.checkpoint set; the completed run is left as it is)"
    )
    trainer = r.trainer.model_copy(update={"init": InitSpec(checkpoint=str(src))})
    return dataclasses.replace(r, trainer=trainer)


# ------------------------------------------------------------------------------------------- rendering


@dataclass
class Prepared:
    spec: RunSpec
    rd: RunDir
    script: Path  # what the executor submits (Executor.launch_file): sbatch.sh, launch.sh, trainjob.yaml
    sha256: str


def _sha(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def prepare(
    specs: list[RunSpec], runs_root: Path, executor_name: str, templates_dir: Path | None = None
) -> list[Prepared]:
    """Render the runs (render checks all of them before writing any: run.yaml, launch.sh, sbatch.sh and the
    executor's own files) and name the file the executor submits."""
    import mimo_jobs.study.render as render

    ex = executor(executor_name)
    out = []
    for rr in render.render_runs(specs, runs_root, templates_dir, ex.pet_rendezvous, ex.artefacts):
        rd = RunDir(Path(rr.run_dir).resolve())
        script = ex.launch_file(rd)
        out.append(Prepared(rr.run, rd, script, _sha(script)))
    return out


@dataclass(frozen=True)
class Preview:
    """What --dry-run shows of a run: the script an executor would run, rendered in memory only."""

    spec: RunSpec
    rd: RunDir
    script: Path
    text: str
    command: str | None = None  # the run's own training command as launch.sh runs it (None: packaged)
    own_files: dict[Path, str] = field(default_factory=dict)  # the executor's files (its manifests)


def preview(
    specs: list[RunSpec], runs_root: Path, executor_name: str, templates_dir: Path | None = None
) -> list[Preview]:
    """Render the runs in memory (every check `prepare` makes) and write nothing anywhere."""
    import mimo_jobs.study.render as render
    from mimo_jobs.study.command import render_command

    ex = executor(executor_name)
    out = []
    for p in render.plan_runs(specs, runs_root, templates_dir, ex.pet_rendezvous, ex.artefacts):
        script = ex.launch_file(p.rd)
        own = {f: p.text(f) for f in ex.artefacts(p.spec, p.rd)}
        out.append(Preview(p.spec, p.rd, script, p.text(script), render_command(p.spec, p.rd), own))
    return out


# ------------------------------------------------------------------------------------------- submitting


def _write_intent(rd: RunDir, ex: str, attempt: int, job_id: str | None) -> Path:
    p = rd.submit_intent
    tmp = p.with_suffix(".tmp")
    tmp.write_text(json.dumps({"executor": ex, "attempt": attempt, "time": time.time(), "job_id": job_id}))
    os.replace(tmp, p)
    return p


def submit_prepared(con, ex: Executor, p: Prepared, attempt: int, event: str = "submitted") -> str:
    """Submit one rendered run and record its job (see the module doc for the consistency rules). `event`:
    "submitted" when a submit of the study starts it, "retry"/"requeue" when the policy continues it.

    One live job per run, whichever store submits it: under the run directory's lock, the newest job its
    own record names (contract/submissions.py) must have ended, as its executor says, before another
    starts; the new job is in that record before the lock is released."""
    with _run_lock(p.rd):
        _refuse_live_job(p.rd)
        pre_id = ex.new_job_id()  # local jobs are named before they start; SLURM names its own
        intent = _write_intent(p.rd, ex.name, attempt, pre_id)
        try:
            job_id = ex.submit(p.rd, attempt, _limit_s(p.spec), p.spec.cluster.signal, job_id=pre_id)
        except SubmitError:
            intent.unlink(missing_ok=True)  # refused: nothing to recover
            raise
        try:
            _record_job(con, ex, p, attempt, job_id, event)
        except BaseException:
            ex.cancel(job_id, p.rd)  # no scheduler job without a row
            intent.unlink(missing_ok=True)
            raise
        intent.unlink(missing_ok=True)
    return job_id


@contextmanager
def _run_lock(rd: RunDir):
    """The run directory's submission lock; not getting it in time is a refused submission."""
    from mimo_jobs.contract import submissions

    try:
        with submissions.locked(rd.root):
            yield
    except submissions.SubmissionBusy as e:
        raise SubmitError(e.describe()) from None


def _record_job(con, ex: Executor, p: Prepared, attempt: int, job_id: str, event: str) -> None:
    """The job in the run directory's record (first: it is the record), then in the store, in one
    transaction with the store's copy of when the run was named."""
    from mimo_jobs.contract import submissions
    from mimo_jobs.store.attempts import name_run
    from mimo_jobs.store.connection import transaction

    with transaction(con):
        if event in submissions.NAMED:
            row = jobs_table.JobRow(p.spec.run_id, job_id, ex.name, attempt, "SUBMITTED", *[None] * 7)
            name_run(con, p.spec.run_id, p.rd.root, event, row)
        else:
            submissions.append(p.rd.root, submissions.Entry(time.time(), event, ex.name, job_id, attempt))
        jobs_table.insert_job(
            con, p.spec.run_id, job_id, ex.name, attempt, p.sha256, ex.log_path(p.rd, job_id)
        )


def _refuse_live_job(rd: RunDir) -> None:
    """SubmitError when the newest job the run directory records is still pending or running (submitted
    by this store or by another one sharing the runs root): two jobs of one run would write one run and
    checkpoint directory. A job whose executor is not known here, or that its executor no longer knows,
    does not hold the run."""
    from mimo_jobs.contract import submissions

    last = submissions.last_job(submissions.read(rd.root))
    if last is None or last.executor is None or last.job_id is None:
        return
    try:
        facts = executor(last.executor).poll({last.job_id: rd}).get(last.job_id)
    except (ValueError, MimoJobsError):
        return
    # UNKNOWN: the scheduler has no word on it, just after submission (sacct lags) or long after (purged)
    unknown = facts is not None and facts.state == "UNKNOWN" and time.time() - last.time > INTENT_MAX_AGE_S
    if facts is not None and facts.active and not unknown:
        raise SubmitError(
            f"{rd.root}: job {last.job_id} ({last.executor}) of this run is {facts.state}, as its run "
            f"directory's {rd.submissions.name} records (perhaps submitted with another --db on the same "
            "runs root): not submitted beside it; wait for it to end or cancel it with the store that "
            "submitted it"
        )


def _limit_s(spec: RunSpec) -> int:
    """The run's time limit (a point may override the cluster's) in seconds."""
    return spec.cluster.model_copy(update={"time_limit": spec.time_limit}).time_limit_seconds()


@dataclass
class Submitted:
    spec: RunSpec
    job_id: str
    attempt: int
    rd: RunDir


def submit_runs(
    con,
    study: StudySpec,
    source: str | None,
    prepared: list[Prepared],
    sel: Selection,
    ex: Executor,
    on_submit=None,
) -> list[Submitted]:
    """Record the study and its runs (with provenance), then submit each prepared run. A refusal half way
    raises SubmitError after the earlier jobs are recorded (they are real); nothing of the refused run's job
    is recorded."""
    from mimo_jobs.store.connection import transaction

    with transaction(con):
        catalog.record_study(con, catalog.StudyRecord(**study.catalog_fields()), source)
        for p in prepared:
            catalog.record_run(
                con, catalog.RunRecord(**p.spec.catalog_fields()), str(p.rd.root), p.sha256, provenance()
            )
        _name_kept(con, sel.keep)
    out = []
    for p in prepared:
        attempt = sel.attempts.get(p.spec.run_id, 0)
        try:
            job_id = submit_prepared(con, ex, p, attempt)
        except SubmitError as e:
            done = ", ".join(f"{s.spec.name}={s.job_id}" for s in out) or "none"
            raise SubmitError(f"{p.spec.name}: {e} (submitted before it: {done})") from None
        out.append(Submitted(p.spec, job_id, attempt, p.rd))
        if on_submit:
            on_submit(out[-1])
    return out


def _name_kept(con, keep: list[tuple[RunSpec, jobs_table.JobRow]]) -> None:
    """The study named these runs again and their jobs are kept: their run directories record it, so a
    reverted study's point reports the completed run it equals again, not a later attempt of another
    config (store/attempts.py)."""
    from mimo_jobs.store.attempts import name_run

    if not keep:
        return
    dirs = dict(
        con.execute(
            "SELECT run_id, run_dir FROM runs WHERE run_id IN (SELECT unnest(?::VARCHAR[]))",
            [[r.run_id for r, _ in keep]],
        ).fetchall()
    )
    for r, j in keep:
        if dirs.get(r.run_id) and Path(dirs[r.run_id]).is_dir():
            name_run(con, r.run_id, dirs[r.run_id], "kept", j)


# ------------------------------------------------------------------------------------------- following


def _run_dirs(con, study: str | None = None) -> dict[str, tuple[RunDir, str]]:
    """run id -> (run dir, spec_json text); the spec is parsed only for jobs that need it (settle)."""
    q = "SELECT run_id, run_dir, spec_json FROM runs" + (" WHERE study = ?" if study else "")
    return {
        rid: (RunDir(Path(d)), s) for rid, d, s in con.execute(q, [study] if study else []).fetchall() if d
    }


_INTENT_FIELDS = {"executor": str, "attempt": int, "time": (int, float)}


def read_intent(rd: RunDir) -> tuple[dict | None, str | None]:
    """The run dir's submit intent (None when there is none) and what is wrong with it (None when it is
    usable): a file someone damaged or wrote by hand is this run's problem, never every study's."""
    ip = rd.submit_intent
    try:
        it = json.loads(ip.read_text())
    except FileNotFoundError:
        return None, None
    except (OSError, ValueError) as e:
        return None, f"{ip}: unreadable ({str(e).splitlines()[0][:200] if str(e) else type(e).__name__})"
    if not isinstance(it, dict):
        return None, f"{ip}: not a JSON object; delete it if no submission of this run is under way"
    for k, t in _INTENT_FIELDS.items():
        if not isinstance(it.get(k), t) or isinstance(it.get(k), bool):
            return None, (
                f"{ip}: field {k!r} missing or not a {t.__name__ if isinstance(t, type) else 'number'}; "
                "delete it if no submission of this run is under way"
            )
    try:
        executor(it["executor"])
    except ValueError as e:
        return None, f"{ip}: {e}"
    return it, None


def intent_problems(con, study: str | None = None) -> dict[str, str]:
    """run id -> what is wrong with its submit intent, for the runs whose intent cannot be read."""
    out = {}
    for rid, (rd, _) in _run_dirs(con, study).items():
        _, problem = read_intent(rd)
        if problem:
            out[rid] = problem
    return out


def reconcile(con, study: str | None = None, rdirs: dict | None = None) -> list[tuple[str, str]]:
    """Record jobs whose submission crashed before its store write (intent file left behind)."""
    from mimo_jobs.store.connection import transaction

    adopted = []
    for rid, (rd, _) in (rdirs if rdirs is not None else _run_dirs(con, study)).items():
        it, problem = read_intent(rd)
        if it is None:
            continue  # none, or unreadable: `intent_problems` shows it in the run's row, other runs go on
        ip = rd.submit_intent
        ex = executor(it["executor"])
        known = {r.job_id for r in jobs_table.jobs_of_run(con, rid)}
        found = [f for f in ex.find(rd, it["time"]) if f.job_id not in known]
        if found:
            with transaction(con):
                for i, f in enumerate(sorted(found, key=lambda f: f.job_id)):
                    jobs_table.insert_job(
                        con,
                        rid,
                        f.job_id,
                        ex.name,
                        it["attempt"] + i,
                        None,
                        ex.log_path(rd, f.job_id),
                        f.submit_time,
                    )
                    jobs_table.update_facts(con, rid, f)
            adopted += [(rid, f.job_id) for f in found]
            ip.unlink(missing_ok=True)
        elif time.time() - it["time"] > INTENT_MAX_AGE_S:
            ip.unlink(missing_ok=True)
    return adopted


def job_log_text(rd: RunDir, row: jobs_table.JobRow) -> str:
    """The job's main output plus every per-rank stderr of its torchrun log dirs (tails)."""
    parts = [status.read_tail(row.log_path)]
    jl = rd.job_logs(row.job_id)
    if jl.is_dir():
        for f in sorted(jl.rglob("*.log")):
            if f.name.startswith("stderr") or f.parent.name.isdigit():
                parts.append(status.read_tail(f, 64_000))
    return "\n".join(parts)


def has_checkpoint(rd: RunDir, spec: dict, con=None, run_id: str | None = None) -> bool:
    """A complete checkpoint the next attempt can resume from (a crashed iter_N.tmp is none): the packaged
    trainer's or Megatron's in the checkpoint directory, or for a run of its own command one its log says
    it saved (with the store). No torch is imported."""
    return status.last_checkpoint_iteration(rd.root, spec, con, run_id) is not None


def event_kinds(con, row: jobs_table.JobRow) -> set[str]:
    """The kinds of the events ingest stored for the job (empty before its logs are ingested)."""
    return {
        k
        for (k,) in con.execute(
            "SELECT DISTINCT kind FROM events WHERE run_id = ? AND job_id = ?", [row.run_id, row.job_id]
        ).fetchall()
    }


@dataclass(frozen=True)
class Follow:
    """What following jobs needs from outside submit (the CLI supplies ingest's): `ingest` stores the
    events of the given run dirs before the policy reads them; `explain` words a job's log as one line
    (the jobs table's first error)."""

    ingest: Callable[[object, list[RunDir]], None] | None = None
    explain: Callable[[str], str | None] | None = None


def settle(
    con, row: jobs_table.JobRow, rd: RunDir, spec: dict, follow: Follow = Follow()
) -> policy.Decision | None:
    """Apply the retry/requeue policy to an ended job; resubmit when it says so. Another attempt never starts
    while processes of this one still run (two copies would write one run dir): they are stopped first, and
    if they will not stop the job stays unsettled (None) and the next refresh tries again."""
    from mimo_jobs.store.connection import transaction

    err = follow.explain(job_log_text(rd, row)) if follow.explain else None
    all_rows = jobs_table.jobs_of_run(con, row.run_id)
    earlier = [r for r in all_rows if r.attempt < row.attempt]
    later = [r for r in all_rows if r.attempt > row.attempt]
    d = policy.classify(
        row.state,
        row.exit_code,
        event_kinds(con, row),
        policy.history_of(earlier),
        int((spec.get("cluster") or {}).get("max_retries", 0)),
        has_checkpoint(rd, spec, con, row.run_id),
    )
    why = (
        f"{row.state}"
        + (f" exit {row.exit_code}" if row.exit_code is not None else "")
        + (f" ({row.reason})" if row.reason and row.reason not in ("None", d.reason) else "")
        + f": {d.reason}"
    )
    next_id = None
    if d.action in ("retry", "requeue"):
        if later:  # a crash after the resubmission but before this update: do not submit twice
            next_id = later[0].job_id
        else:
            ex = executor(row.executor)
            if not ex.reap(row.job_id, rd):
                return None
            spec_obj = RunSpec.from_dict(spec)
            script = ex.launch_file(rd)
            p = Prepared(spec_obj, rd, script, _sha(script))
            try:
                next_id = submit_prepared(con, ex, p, row.attempt + 1, d.action)
            except SubmitError as e:
                d = policy.Decision("final", f"{d.reason}, but resubmission was refused: {e}")
                why = f"{row.state}: {d.reason}"
    with transaction(con):
        jobs_table.set_outcome(con, row.run_id, row.job_id, d.action, why, err, next_id)
    return d


def poll(
    con,
    study: str | None = None,
    rdirs: dict | None = None,
    before_end: Callable[[object, list[RunDir]], None] | None = None,
) -> list[str]:
    """Poll the scheduler for every active job (one batched query per executor) and record what changed.
    `before_end` (ingest) reads the run dirs of the jobs that ended before their end is recorded: a run is
    never COMPLETED in the store without the iterations it logged (a reader between the two writes, or a
    command stopped between them, would see a finished run without its last iteration and loss).
    Returns the run ids whose job ended in this call."""
    from mimo_jobs.store.connection import transaction

    rdirs = _run_dirs(con, study) if rdirs is None else rdirs
    reconcile(con, study, rdirs)
    active = [r for r in jobs_table.active_jobs(con) if r.run_id in rdirs]
    by_ex: dict[str, dict[str, tuple[jobs_table.JobRow, RunDir]]] = {}
    for r in active:
        by_ex.setdefault(r.executor, {})[r.job_id] = (r, rdirs[r.run_id][0])
    ended = []
    for name, rows in by_ex.items():
        facts = executor(name).poll({jid: rd for jid, (_, rd) in rows.items()})
        news = [(rows[jid][0], f) for jid, f in facts.items() if _news(rows[jid][0], f)]
        done = list(dict.fromkeys(row.run_id for row, f in news if not f.active))
        if done and before_end is not None:
            before_end(con, [rdirs[r][0] for r in done])
        with transaction(con):
            for row, f in news:
                jobs_table.update_facts(con, row.run_id, f)
        ended += done
    return ended


def _news(row: jobs_table.JobRow, f: jobs_table.JobFacts) -> bool:
    """Whether the scheduler's facts say something the row does not (a poll of N unchanged jobs writes
    nothing)."""
    if f.state == "UNKNOWN" and row.state != "UNKNOWN":
        return False  # sacct lag right after sbatch: keep what we knew
    same = (f.state, f.start_time, f.end_time, f.node_list, f.reason) == (
        row.state,
        row.start_time,
        row.end_time,
        row.node_list,
        row.reason,
    )
    return not (same and f.active)


def refresh(con, study: str | None = None, follow: Follow = Follow()) -> list[str]:
    """Poll the scheduler, ingest (follow.ingest) the run dirs of jobs that ended (before their end is
    recorded) or wait to be settled, then settle those jobs from their stored events. Returns the run ids
    whose job ended in this call."""
    rdirs = _run_dirs(con, study)
    ended = poll(con, study, rdirs, follow.ingest)
    unsettled = [r for r in jobs_table.unsettled_jobs(con) if r.run_id in rdirs]
    todo = list(dict.fromkeys(r.run_id for r in unsettled if r.run_id not in ended))  # ended: just read
    if todo and follow.ingest is not None:
        follow.ingest(con, [rdirs[r][0] for r in todo])
    for row in unsettled:
        rd, spec = rdirs[row.run_id]
        settle(con, row, rd, json.loads(spec) if isinstance(spec, str) else spec, follow)
    return ended


# ------------------------------------------------------------------------------------------- cancelling


def cancel(con, study: str, run: str | None = None) -> list[tuple[str, str, str]]:
    """scancel (or stop the local runner of) every active job of the study, or of one run (name or id).
    Returns (run name, job id, executor)."""
    rows = con.execute("SELECT run_id, name, run_dir FROM runs WHERE study = ?", [study]).fetchall()
    if not rows:
        raise LaunchError(f"study {study!r} has no runs in the store (submitted with another --db?)")
    if run is not None:
        rows = [r for r in rows if run in (r[0], r[1])]
        if not rows:
            names = ", ".join(
                n
                for _, n, _ in con.execute(
                    "SELECT run_id, name, run_dir FROM runs WHERE study = ? ORDER BY idx", [study]
                ).fetchall()
            )
            raise LaunchError(f"study {study!r} has no run {run!r} (runs: {names})")
    ids = {rid: (name, RunDir(Path(d))) for rid, name, d in rows}
    out = []
    for j in jobs_table.active_jobs(con):
        if j.run_id in ids:
            name, rd = ids[j.run_id]
            executor(j.executor).cancel(j.job_id, rd)
            out.append((name, j.job_id, j.executor))
    return out

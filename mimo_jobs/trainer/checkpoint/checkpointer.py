"""The trainer's use of checkpoints (called from main.py): resume at start (this run's own latest checkpoint,
else trainer.init.checkpoint, another run's checkpoint of any layout), periodic saves, and the
stop-save-requeue path on a preemption signal or a near time limit (signals.py decides when)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import torch.distributed as dist

import mimo_jobs.trainer.checkpoint.files as ckpt
from mimo_jobs.contract.manifest import CheckpointError, Provenance, iter_name
from mimo_jobs.contract.requeue import REQUEUE_LOG_LINE
from mimo_jobs.trainer.checkpoint.files import ModuleParts, Resumed
from mimo_jobs.trainer.step.dpsync import gather_params

# Test hook: MIMO_CKPT_KILL_AFTER_ITER=<n> SIGKILLs every rank right after iteration n (and its periodic
# save, if any): a deterministic `kill -9` of the whole job for the resume tests.
KILL_ENV = "MIMO_CKPT_KILL_AFTER_ITER"
# Test hook: MIMO_CKPT_TEST_STEP_DELAY_S=<s> sleeps after every step, so a test's signal lands mid-run.
DELAY_ENV = "MIMO_CKPT_TEST_STEP_DELAY_S"


def checkpoint_dir_of(run, doc: dict, run_yaml: str | Path | None = None) -> Path:
    """The run's checkpoint directory, as the run directory's one resolver (contract/rundir.py) says."""
    from mimo_jobs.contract.rundir import checkpoint_dir_of as resolve

    try:
        return resolve(doc, run_yaml, run.trainer.checkpoint_dir)
    except ValueError as e:
        raise CheckpointError(str(e)) from None


def modules_of(st) -> list[ModuleParts]:
    """The modules this rank owns in a trainer TrainState (fixed order: the encoders, language)."""
    out = []
    for mod in st.modules:
        opt = None if mod.frozen else st.optimizer.optimizers.get(mod.name)
        out.append(
            ModuleParts(
                name=mod.name,
                model=mod.core,
                optimizer=opt,
                dp_group=mod.pgc.dp,
                expt_dp_group=getattr(mod.pgc, "expt_dp", None),
                frozen=mod.frozen,
                shard_args=mod.shard_args,
            )
        )
    return out


def provenance_of(run, doc: dict, world: int) -> Provenance:
    """This launch's provenance: the run, its layout and world, the code's git sha, the job and attempt."""
    prov = doc.get("provenance") or {}
    return Provenance(
        run_id=run.run_id,
        study=run.study,
        run_name=run.name,
        layout=run.layout.to_dict(),
        world=world,
        git_sha=prov.get("git_sha"),
        # launch.sh exports these for SLURM and local jobs alike
        job_id=os.environ.get("MIMO_JOBS_JOB_ID") or os.environ.get("SLURM_JOB_ID"),
        attempt=int(os.environ.get("MIMO_JOBS_ATTEMPT") or os.environ.get("SLURM_RESTART_COUNT") or 0),
        started_from=None if init_source(run) is None else str(init_source(run)),
    )


def init_source(run) -> Path | None:
    """trainer.init.checkpoint as a path (relative: to the directory the trainer starts in), or None."""
    init = run.trainer.init
    if init is None or init.checkpoint is None:
        return None
    return Path(init.checkpoint).expanduser()


def check_init_source(run) -> None:
    """Before any collective: trainer.init.checkpoint names a complete checkpoint whose files are all there
    (CheckpointError naming the directory or file otherwise)."""
    from mimo_jobs.contract.manifest import resolve_source

    src = init_source(run)
    if src is not None:
        resolve_source(src)


def _test_hooks(iteration: int) -> None:
    kill = os.environ.get(KILL_ENV)
    if kill and int(kill) == iteration:
        os.kill(os.getpid(), signal.SIGKILL)
    delay = os.environ.get(DELAY_ENV)
    if delay:
        time.sleep(float(delay))


class Checkpointer:
    """Resume at start, periodic saves, and the stop-save-requeue path, for one trainer process."""

    def __init__(self, run, doc: dict, directory: Path, world: int, watch=None, enabled: bool = True):
        self.run = run
        self.doc = doc
        self.dir = directory
        self.enabled = enabled
        self.watch = watch  # signals.PreemptionWatch, or None: never stop early
        self.interval = run.trainer.save_interval
        self.keep = run.trainer.keep_checkpoints
        self.provenance = provenance_of(run, doc, world)
        self.last_saved: int | None = None
        self.last_save_s: float | None = None
        self.resumed: Resumed | None = None

    @classmethod
    def for_run(cls, run, doc: dict, run_yaml: str | Path | None, reference: bool) -> Checkpointer:
        """The reference mode (one process) neither resumes nor saves: it is a yardstick, not a run."""
        from mimo_jobs.trainer.signals import PreemptionWatch, deadline_from_env, margin_from_env

        if reference:
            return cls(run, doc, Path("."), 1, None, enabled=False)
        watch = PreemptionWatch(deadline=deadline_from_env(), margin_s=margin_from_env()).install()
        return cls(run, doc, checkpoint_dir_of(run, doc, run_yaml), dist.get_world_size(), watch)

    def resume(self, st) -> Resumed | None:
        """Collective: restore this run's `latest`, if there is one, into the TrainState `st`; else start from
        trainer.init.checkpoint, if given."""
        if not self.enabled:
            return None
        r = ckpt.load(self.dir, modules=modules_of(st), provider=st.provider, provenance=self.provenance)
        if r is None and init_source(self.run) is not None:
            return self._start_from(st, init_source(self.run))
        if r is not None:
            st.iteration, st.consumed_samples = r.iteration, r.consumed_samples
            self.last_saved = r.iteration
            self.resumed = r
            if st.role.rank == 0:
                # mimo_jobs.ingest matches this wording ("resumed from checkpoint" -> checkpoint_loaded event)
                print(
                    f"mimo-jobs trainer: resumed from checkpoint {r.path} (iteration {r.iteration}, "
                    f"{r.consumed_samples} samples)",
                    flush=True,
                )
        return r

    def _start_from(self, st, source: Path) -> Resumed:
        """Collective: this run's first start, from another run's checkpoint (any layout)."""
        weights_only = bool(self.run.trainer.init.weights_only)
        r = ckpt.load_foreign(
            source,
            modules=modules_of(st),
            provider=st.provider,
            provenance=self.provenance,
            gbs=self.run.layout.gbs,
            weights_only=weights_only,
        )
        st.iteration, st.consumed_samples = r.iteration, r.consumed_samples
        if st.role.rank == 0:
            what = "weights only: iteration 0, fresh optimizer" if weights_only else "continuing"
            print(
                f"mimo-jobs trainer: started from checkpoint {r.path} ({what}; iteration {r.iteration}, "
                f"{r.consumed_samples} samples)",
                flush=True,
            )
        return r

    def at_end(self, st) -> None:
        """Collective, when the loop ended without a stop for requeue: the run's last state saved, with or
        without save_interval, unless it was just saved (or resumed at it). A resubmitted or continued run
        starts from it; with train_iters 0, it is trainer.init's weights as iteration 0 in this layout."""
        if self.enabled and self.last_saved != st.iteration:
            self.save(st)

    def settle(self) -> None:
        """How the run ends is decided: later stop signals are ignored (signals.PreemptionWatch.settle)."""
        if self.watch is not None:
            self.watch.settle()

    def save(self, st) -> Path:
        """Collective: save `st` at its current iteration."""
        t0 = time.perf_counter()
        gather_params(st)
        p = ckpt.save(
            self.dir,
            iteration=st.iteration,
            consumed_samples=st.consumed_samples,
            modules=modules_of(st),
            provider=st.provider,
            provenance=self.provenance,
            keep=self.keep,
            run_doc=self.doc,
        )
        self.last_saved = st.iteration
        self.last_save_s = time.perf_counter() - t0
        if self.watch is not None:
            self.watch.note_save(self.last_save_s)
        if st.role.rank == 0:  # mimo_jobs.ingest: "saved checkpoint" -> checkpoint_saved event
            print(
                f"mimo-jobs trainer: saved checkpoint {p} (iteration {st.iteration}, {st.consumed_samples} "
                f"samples, {self.last_save_s:.2f} s)",
                flush=True,
            )
        return p

    def after_step(self, st, n_iters: int, step_s: float | None = None):
        """Call on every rank after each iteration. Saves every save_interval iterations; returns a
        StopDecision (after saving) when the world agreed to stop early for a requeue, else None."""
        if not self.enabled:
            return None
        if step_s is not None and self.watch is not None:
            self.watch.note_step(step_s)
        if self.interval and st.iteration % self.interval == 0 and self.last_saved != st.iteration:
            self.save(st)
        _test_hooks(st.iteration)
        stop = self.watch.should_stop() if self.watch is not None else None
        if stop is None or st.iteration >= n_iters:
            return None  # the run is complete anyway: no requeue
        if self.last_saved != st.iteration:
            self.save(st)
        if st.role.rank == 0:
            self._announce_requeue(st.iteration, stop.reason)
        return stop

    def _announce_requeue(self, iteration: int, reason: str) -> None:
        """Rank 0, after the save: the requeue marker for the launch script and the log line."""
        from mimo_jobs.trainer.signals import write_requeue_marker

        write_requeue_marker(self.dir, iteration, reason, self.provenance.job_id)
        print(
            f"{REQUEUE_LOG_LINE} {iteration} ({reason}); checkpoint {self.dir / iter_name(iteration)}",
            flush=True,
        )

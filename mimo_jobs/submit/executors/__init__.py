"""Executors: how a rendered run becomes a scheduler job, and how that job is observed and cancelled.

Both executors report the same facts (`mimo_jobs.submit.jobs_table.JobFacts`: job id, state, submit/start/end times, exit
code, node list, reason), so the jobs table, the retry policy and `status` do not care which one ran a job.

- slurm: `sbatch --parsable --chdir=<run dir> <run dir>/sbatch.sh` (the rendered file itself), submitit
  `SlurmJob` handles for cancel, one batched `sacct` per poll for state (squeue for jobs sacct has not seen).
- local: a detached runner process per job runs `<run dir>/launch.sh` (one-node torchrun) and keeps a state
  file next to its log; jobs queue for a machine-wide slot so several local runs do not oversubscribe it.
"""

from __future__ import annotations

from .base import Executor, SubmitError

__all__ = ["Executor", "SubmitError", "get_executor"]


def get_executor(name: str) -> Executor:
    if name == "slurm":
        from .slurm import SlurmExecutor

        return SlurmExecutor()
    if name == "local":
        from .local import LocalExecutor

        return LocalExecutor()
    raise ValueError(f"unknown executor {name!r}: use slurm or local")

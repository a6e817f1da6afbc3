"""Executors: how a rendered run becomes a scheduler job, and how that job is observed and cancelled.

Each executor is one package here, found by name in `registry.REGISTRY`; it renders its launch artefact,
owns its job side (submit, state, cancel, logs, the id and attempt of a job) and its study section
(`cluster.<name>`). Every executor reports the same facts (`mimo_jobs.submit.jobs_table.JobFacts`: job id,
state from contract/jobstates.py, submit/start/end times, exit code, node list, reason), so the jobs table,
the retry policy and `status` do not care which one ran a job.

- slurm/       `sbatch --parsable --chdir=<run dir> <run dir>/sbatch.sh`, submitit handles for cancel, one
               batched `sacct` per poll for state (squeue for jobs sacct has not seen)
- local/       a detached runner process per job runs `<run dir>/launch.sh` (one-node torchrun) and keeps a
               state file next to its log; jobs queue for a machine-wide slot
- kubernetes/  a Kubeflow Trainer `TrainJob` per job (`<run dir>/trainjob.yaml`), queued by Kueue; state
               from its conditions and its pods, logs per node rank copied into the run directory
- registry     every executor by name: its job side and its study section
- base         the Executor protocol and SubmitError
"""

from __future__ import annotations

from .base import Executor, SubmitError

__all__ = ["Executor", "SubmitError", "get_executor"]


def get_executor(name: str) -> Executor:
    from .registry import load

    return load(name)

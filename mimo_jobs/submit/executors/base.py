"""What every executor is: the Executor protocol and the error a refused submission raises."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from mimo_jobs.contract.rundir import RunDir
from mimo_jobs.errors import MimoJobsError
from mimo_jobs.submit.jobs_table import JobFacts

if TYPE_CHECKING:
    from mimo_jobs.study.runspec import RunSpec


class SubmitError(MimoJobsError, RuntimeError):
    """The scheduler refused the job (nothing was submitted). Exit code 1: the input was fine, the run failed."""

    exit_code = 1


class Executor(Protocol):
    name: str
    # launch.sh takes the node's rank and rendezvous from torchrun's PET_* variables (set by the job object's
    # controller, e.g. Kubeflow Trainer's torch plugin) instead of SLURM's or the local defaults
    pet_rendezvous: bool

    def launch_file(self, rd: RunDir) -> Path:
        """The rendered file this executor submits (its sha256 is recorded with the job; --dry-run shows it)."""

    def artefacts(self, spec: RunSpec, rd: RunDir) -> dict[Path, str]:
        """Files of its own rendered beside run.yaml and launch.sh (path -> text); none for most."""

    def problems(self, runs: list[RunSpec]) -> list[str]:
        """Why it cannot run some of these runs (each a sentence naming the run); empty when it can."""

    def submit_command(self, rd: RunDir, job_id: str | None = None) -> list[str]:
        """The command line that submits the run (shown by --dry-run)."""

    def new_job_id(self) -> str | None:
        """A job id chosen before submission (local), or None when the scheduler assigns it (slurm)."""

    def submit(
        self, rd: RunDir, attempt: int, time_limit_s: int, signal: str, job_id: str | None = None
    ) -> str:
        """Submit; return the scheduler job id. Raises SubmitError when nothing was submitted. The time limit
        and signal are enforced by the local runner; SLURM reads them from the script's #SBATCH lines."""

    def poll(self, rds: dict[str, RunDir]) -> dict[str, JobFacts]:
        """Current facts of the given jobs (job id -> its run dir)."""

    def cancel(self, job_id: str, rd: RunDir) -> None:
        """Ask the scheduler to stop the job (idempotent)."""

    def reap(self, job_id: str, rd: RunDir) -> bool:
        """Make sure nothing of an ended job still runs (before another attempt of its run starts); True
        once nothing does."""

    def find(self, rd: RunDir, since_epoch: float) -> list[JobFacts]:
        """Jobs of this run submitted since `since_epoch`, ended or not, and the ones a scheduler still holds
        however old (SLURM: squeue's; Kubernetes: TrainJobs not ended); never another run's. Recovers a
        submission whose store write was lost."""

    def log_path(self, rd: RunDir, job_id: str) -> str:
        """The job's main output file."""

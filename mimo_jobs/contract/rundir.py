"""Where a run's files live: the one place that names the run directory, its files and the checkpoint
directory (render, submit, status, ingest and the trainer all ask it).

runs/<study>/<run name>-<run id>/
  run.yaml            the trainer's complete input (RunSpec + plan + paths + provenance)
  launch.sh           one-node torchrun launch (run alone = local executor)
  sbatch.sh           the SLURM batch script (exactly what SLURM runs)
  trainjob.yaml       the Kubernetes executor's TrainJob (runs rendered for it only)
  metrics.jsonl       one IterationRecord per iteration, appended by the last LLM rank (all attempts)
  .submit-intent.json submit's crash-recovery note while a submission is under way
  submissions.jsonl   every time a submit named the run or started a job of it (contract/submissions.py)
  .submit.lock        held (flock) while a job of the run is being submitted, by whichever store submits
  logs/               scheduler and per-rank output
    slurm-<jobid>.out         sbatch stdout/stderr (srun --label prefixes node task ids)
    job-<jobid>/node-<n>/     torchrun --log-dir for node n: <rdzv id>/attempt_<k>/<local rank>/{stdout,stderr}.log
    local-<jobid>.out         local executor's combined output
    local-<jobid>.json        local executor's job state
    runner-<jobid>.stderr     local runner's own errors
    k8s-<jobid>.node-<n>.out  the Kubernetes executor's copy of node rank n's pod log
  checkpoints/        iter_<N>/ ... and `latest` (docs/checkpoints.md), unless trainer.checkpoint_dir says else
  memory/             per-rank measured memory (contract/memory.py names it)
  tensorboard/        TensorBoard event files

The directory name carries the run id (a hash of the resolved run config): a changed run (same name, new
id) gets a directory of its own, so it never writes into another run's files (docs/run-directories.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

RUN_YAML = "run.yaml"
METRICS = "metrics.jsonl"
LOGS = "logs"
CHECKPOINTS = "checkpoints"
SUBMIT_INTENT = ".submit-intent.json"
SUBMISSIONS = "submissions.jsonl"
SUBMIT_LOCK = ".submit.lock"


def dir_name(run_name: str, run_id: str) -> str:
    """The run directory's name: the readable run name, then the run id that makes it the run's own."""
    return f"{run_name}-{run_id}"


@dataclass(frozen=True)
class RunDir:
    root: Path

    @classmethod
    def of(cls, runs_root: str | Path, study: str, run_name: str, run_id: str) -> RunDir:
        return cls(Path(runs_root) / study / dir_name(run_name, run_id))

    @classmethod
    def of_run_yaml(cls, run_yaml: str | Path, doc: dict | None = None) -> RunDir:
        """The run directory of a rendered run.yaml: its paths.run_dir, else the directory holding it."""
        d = ((doc or {}).get("paths") or {}).get("run_dir")
        return cls(Path(d) if d else Path(run_yaml).resolve().parent)

    @property
    def run_yaml(self) -> Path:
        return self.root / RUN_YAML

    @property
    def launch_sh(self) -> Path:
        return self.root / "launch.sh"

    @property
    def sbatch_sh(self) -> Path:
        return self.root / "sbatch.sh"

    @property
    def trainjob_yaml(self) -> Path:
        return self.root / "trainjob.yaml"

    @property
    def metrics(self) -> Path:
        return self.root / METRICS

    @property
    def logs(self) -> Path:
        return self.root / LOGS

    @property
    def checkpoints(self) -> Path:
        """The default checkpoint directory (`checkpoint_dir` resolves the configured one)."""
        return self.root / CHECKPOINTS

    def checkpoint_dir(self, configured: str | Path | None) -> Path:
        """trainer.checkpoint_dir resolved: an absolute path as given, a relative one inside the run
        directory (so every reader finds the same place whatever its working directory), none: checkpoints/."""
        if not configured:
            return self.checkpoints
        p = Path(configured).expanduser()
        return p if p.is_absolute() else self.root / p

    @property
    def submit_intent(self) -> Path:
        return self.root / SUBMIT_INTENT

    @property
    def submissions(self) -> Path:
        return self.root / SUBMISSIONS

    @property
    def submit_lock(self) -> Path:
        return self.root / SUBMIT_LOCK

    @property
    def tensorboard(self) -> Path:
        """TensorBoard event files (`tensorboard --logdir <runs root>/<study>` overlays the study's runs)."""
        return self.root / "tensorboard"

    def slurm_out(self, job_id: str = "%j") -> Path:
        return self.logs / f"slurm-{job_id}.out"

    def local_out(self, job_id: str) -> Path:
        return self.logs / f"local-{job_id}.out"

    def local_state(self, job_id: str) -> Path:
        return self.logs / f"local-{job_id}.json"

    def pod_log(self, job_id: str, node_rank: int) -> Path:
        return self.logs / f"k8s-{job_id}.node-{node_rank}.out"

    def runner_err(self, job_id: str) -> Path:
        # not *.out/.err/.log/.txt: ingest reads those as job logs
        return self.logs / f"runner-{job_id}.stderr"

    def job_logs(self, job_id: str) -> Path:
        return self.logs / f"job-{job_id}"

    def node_logs(self, job_id: str, node_rank: int | str) -> Path:
        return self.job_logs(job_id) / f"node-{node_rank}"


def checkpoint_dir_of(doc: dict, run_yaml: str | Path | None = None, configured: str | None = None) -> Path:
    """The checkpoint directory of a run.yaml document: paths.checkpoints (render writes it resolved), else
    `configured` (trainer.checkpoint_dir) resolved against the run directory. ValueError when neither a
    run directory nor an absolute path is known."""
    paths = doc.get("paths") or {}
    if paths.get("checkpoints"):
        return Path(paths["checkpoints"])
    if run_yaml is None and not paths.get("run_dir"):
        if configured and Path(configured).expanduser().is_absolute():
            return Path(configured).expanduser()
        raise ValueError("run.yaml has no paths.checkpoints and trainer.checkpoint_dir is not set")
    return RunDir.of_run_yaml(run_yaml or ".", doc).checkpoint_dir(configured)

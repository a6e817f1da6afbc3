"""Where things live in a run directory: the one place that names these paths.

runs/<study>/<run>/
  run.yaml            the trainer's complete input (RunSpec + plan + paths + provenance)
  launch.sh           one-node torchrun launch (run alone = local executor)
  sbatch.sh           the SLURM batch script (exactly what SLURM runs)
  metrics.jsonl       one IterationRecord per iteration, appended by the last LLM rank (all attempts)
  logs/               scheduler and per-rank output
    slurm-<jobid>.out         sbatch stdout/stderr (srun --label prefixes node task ids)
    job-<jobid>/node-<n>/     torchrun --log-dir for node n: <rdzv id>/attempt_<k>/<local rank>/{stdout,stderr}.log
    local-<jobid>.out         local executor's combined output
  checkpoints/        iter_<N>/ ... and `latest` (docs/checkpoints.md)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class RunDir:
    root: Path

    @classmethod
    def of(cls, runs_root: str | Path, study: str, run: str) -> RunDir:
        return cls(Path(runs_root) / study / run)

    @property
    def run_yaml(self) -> Path:
        return self.root / "run.yaml"

    @property
    def launch_sh(self) -> Path:
        return self.root / "launch.sh"

    @property
    def sbatch_sh(self) -> Path:
        return self.root / "sbatch.sh"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def tensorboard(self) -> Path:
        """TensorBoard event files (`tensorboard --logdir <runs root>/<study>` overlays the study's runs)."""
        return self.root / "tensorboard"

    def slurm_out(self, job_id: str = "%j") -> Path:
        return self.logs / f"slurm-{job_id}.out"

    def local_out(self, job_id: str) -> Path:
        return self.logs / f"local-{job_id}.out"

    def job_logs(self, job_id: str) -> Path:
        return self.logs / f"job-{job_id}"

    def node_logs(self, job_id: str, node_rank: int | str) -> Path:
        return self.job_logs(job_id) / f"node-{node_rank}"

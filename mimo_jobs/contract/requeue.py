"""The requeue contract (trainer, launch scripts, local runner and the submit policy all read it here):
* a trainer stopped by a signal or its deadline saves a checkpoint, then every rank exits with
  REQUEUE_EXIT_CODE (75, EX_TEMPFAIL: "try again later") and prints REQUEUE_LOG_LINE;
* torchrun reports any worker failure as exit 1, so rank 0 also writes <checkpoint_dir>/REQUEUE_MARKER
  ({"iteration", "reason", "time", "job_id"}) once the checkpoint is complete. The launch script checks
  for it after torchrun returns: if present it removes it, runs `scontrol requeue` on SLURM and exits 75
  (the local runner runs the launch again). The next attempt resumes from `latest`.
"""

from __future__ import annotations

REQUEUE_EXIT_CODE = 75
REQUEUE_MARKER = "requeue.json"
REQUEUE_LOG_LINE = "mimo-jobs trainer: stopping for requeue at iteration"

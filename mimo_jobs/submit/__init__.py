"""Submit: rendered runs become scheduler jobs, followed to their end and retried or requeued by policy.

- `service`      select, render, submit, refresh and cancel the runs of a study (the submit service)
- `policy`       what to do when a job ends (pure: retry, requeue, final)
- `jobs_table`   the jobs table: one row per scheduler job
- `status`       what `status` shows per run
- `checkpoints`  which checkpoint a run can resume from (read without torch)
- `lineage`      which run started from which run's checkpoint
- `executors/`   SLURM (sbatch/sacct through submitit) and the local one-machine executor
"""

"""Submit: rendered runs become scheduler jobs, followed to their end and retried or requeued by policy.

- `service`    select, render, submit, refresh and cancel the runs of a study (the submit service)
- `policy`     what to do when a job ends (pure: retry, requeue, final)
- `executors/` SLURM (sbatch/sacct through submitit) and the local one-machine executor
"""

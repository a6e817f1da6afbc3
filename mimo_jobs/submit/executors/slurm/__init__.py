"""The SLURM executor, in one package:

- `section`   its study section, `cluster.slurm` (partition, account, qos, exclusive, sbatch/srun args)
- `executor`  its job side: `sbatch --parsable` on the rendered sbatch.sh, sacct/squeue for state, submitit
              handles for cancel
- `sacct`     the one sacct parser (the executor's polls and `mimo-jobs ingest`'s dumps)

Its launch artefact, sbatch.sh, is rendered for every run (templates/sbatch.sh.j2 through
mimo_jobs/study/render.py), so any run directory can be handed to sbatch by hand.
"""

"""Study: a study file becomes validated runs (their rank layouts) and their scripts, with no scheduler and no GPU stack.

- `load`           YAML, `${VAR}` substitution, schema validation with YAML paths
- `spec`           the study file's typed sections (pydantic models) and its naming rules
- `expand`         the matrix expanded into runs
- `runspec`        one run (`RunSpec`) and its run.yaml, the trainer's input
- `topology`       the pure arithmetic of a layout: ranks, lanes, microbatches and the rules they obey
- `modules`        a point's encoder modules read from its `encoder:` / `encoders:` (the one reader)
- `diagnose`       everything wrong with a study file at once
- `lr_rules`       rules a learning-rate schedule must keep
- `runtime_rules`  rules the trainer enforces at start-up that a study file already decides
- `paths`          the one path rule: relative to the study file, checked, named relative in run ids
- `opsfile`        reads a measured operator table (`cluster.hardware.ops`) as data
- `priced`         which runs the planner prices
- `command`        a run's own training command (`trainer.command`), a Jinja template
- `render`         run.yaml, launch.sh and sbatch.sh from the Jinja templates
- `slurm_time`     SLURM time limits
"""

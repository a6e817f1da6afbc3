"""Study: a study file becomes validated runs (their rank layouts) and their scripts, with no scheduler and no GPU stack.

- `spec`      the study file's typed sections (pydantic models) and its naming rules
- `topology`  the pure arithmetic of a layout: ranks, lanes, microbatches and the rules they obey
- `presets`   the model presets the trainer builds
- `render`    run.yaml, launch.sh and sbatch.sh from the Jinja templates
- `rundir`    where everything lives in a run directory
"""

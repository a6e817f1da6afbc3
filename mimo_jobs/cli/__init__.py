"""The command line: one module per command group, one way to report errors.

- `app`       the typer application and `main` (the `mimo-jobs` entry point)
- `__main__`  `python -m mimo_jobs.cli`
- `study`     validate, render
- `predict`   predict
- `plan`      plan
- `jobs`      submit, status, cancel, demo
- `results`   ingest, report
- `compare`   compare
- `export`    export
- `data`      data synth, data stats
- `output`    consoles and the one error path (`error: <where>: <what>`, exit 2 bad input / 1 failed)
"""

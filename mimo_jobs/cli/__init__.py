"""The command line: one module per command group, one way to report errors.

- `app`      the typer application and `main` (the `mimo-jobs` entry point)
- `plan`     validate, render
- `jobs`     submit, status, cancel, demo
- `results`  ingest, report
- `data`     data synth
- `output`   consoles and the one error path (`error: <where>: <what>`, exit 2 bad input / 1 failed)
"""

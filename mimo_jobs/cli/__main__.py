"""`python -m mimo_jobs.cli`: the same as the `mimo-jobs` command."""

from .app import main

main()

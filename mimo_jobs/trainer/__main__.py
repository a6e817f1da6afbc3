"""`python -m mimo_jobs.trainer RUN_YAML [--reference]`; see main.py."""

import sys

from mimo_jobs.trainer.main import main

if __name__ == "__main__":
    sys.exit(main())

"""`python -m mimo_jobs.trainer RUN_YAML [--reference]`; see main.py.

The device environment is set before main (and with it torch) is imported: see device.py."""

import sys
import warnings

from mimo_jobs.contract.events import TRAINER_ERROR
from mimo_jobs.trainer.device import prepare
from mimo_jobs.trainer.stack import stack_problem, te_import_problem

if __name__ == "__main__":
    problem = stack_problem()
    if problem:
        print(f"{TRAINER_ERROR}{problem}", file=sys.stderr, flush=True)
        sys.exit(2)
    prepare(sys.argv[1:])
    # megatron-core warns at import that TE/apex are absent (expected on CPU): keep logs readable
    warnings.filterwarnings("ignore", message=r".*(Apex|apex|Transformer Engine|TE) .*")

    try:
        from mimo_jobs.trainer.main import main
    except Exception as e:  # noqa: BLE001 - only a broken Transformer Engine is reported here; the rest re-raised
        te = te_import_problem(e)
        if te is None:
            raise
        print(f"{TRAINER_ERROR}{te}", file=sys.stderr, flush=True)
        sys.exit(2)

    sys.exit(main())

"""Imported at start-up by every Python process whose path holds tests/ (the processes the tests start, see
helpers/launch.py): one started as `python -m mimo_jobs.trainer ...` or `python -m torch.distributed.run ...`
while the tests' zygote runs hands itself over to it (helpers/zygote.py), so it does not import torch and
megatron-core again. Anything else, and any process that cannot reach the zygote, starts as usual."""

import os
import sys

_zygote = os.environ.get("MIMO_JOBS_TEST_ZYGOTE")
if _zygote:
    from helpers.zygote import hand_over, served

    _served = served(list(getattr(sys, "orig_argv", [])))
    if _served is not None:
        hand_over(_zygote, *_served)

"""The one way tests start a trainer, torchrun or worker process: the environment and the commands.

Every process a test starts runs this checkout's code (the checkout and tests/ first on PYTHONPATH, so a
second installed copy of mimo_jobs is never what is tested), on one thread per process (OMP_NUM_THREADS=1:
2 cores are shared by several ranks), without torch.compile (TORCHDYNAMO_DISABLE=1: megatron-core's compiled
paths are slow and flaky on the CPU), unbuffered, with warnings left out of the output the tests read, and
without a WORLD_SIZE inherited from an outer launcher. A trainer process runs in the tests' preloaded
interpreter when one is up (helpers/zygote.py): the same trainer, without importing torch again.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from helpers import REPO, TESTS
from helpers.zygote import ENV as ZYGOTE_ENV

# the socket of this pytest worker's zygote (helpers/zygote.py; set by tests/conftest.py), "" for none
ZYGOTE = {"socket": ""}


def worker_env(extra: dict | None = None, zygote: bool = True) -> dict[str, str]:
    """The environment of a process a test starts. With `zygote`, a `python -m mimo_jobs.trainer` started in
    it runs in the tests' preloaded interpreter (helpers/zygote.py; tests/sitecustomize.py hands it over)."""
    env = dict(
        os.environ,
        TORCHDYNAMO_DISABLE="1",
        OMP_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
        PYTHONWARNINGS="ignore",
    )
    env.pop("WORLD_SIZE", None)
    env.pop(ZYGOTE_ENV, None)
    if zygote and ZYGOTE["socket"]:
        env[ZYGOTE_ENV] = ZYGOTE["socket"]
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), str(TESTS), os.environ.get("PYTHONPATH")]))
    env.update({k: str(v) for k, v in (extra or {}).items()})
    return env


def free_port() -> int:
    """A port for a torchrun's rendezvous, by the rule launch.sh follows (mimo_jobs/contract/ports.py)."""
    from mimo_jobs.contract.ports import free_port as pick

    return pick()


def torchrun(nproc: int, *target: str) -> list[str]:
    """`python -m torch.distributed.run` on this machine for `target` (a script and its arguments, or
    "-m", module, arguments)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc)]
    return cmd + ["--master-addr", "127.0.0.1", "--master-port", str(free_port()), *map(str, target)]


def trainer(run_yaml: Path, *args: str, nproc: int = 0) -> list[str]:
    """The packaged trainer on `run_yaml`: under torchrun with `nproc` ranks, or one process (nproc 0)."""
    target = ["-m", "mimo_jobs.trainer", str(run_yaml), *args]
    return torchrun(nproc, *target) if nproc else [sys.executable, *target]

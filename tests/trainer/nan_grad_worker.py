"""The packaged trainer with a NaN written into one module's gradient on one rank at chosen iterations (a test
hook, never a trainer option), recording each rank's parameter digest before and after every optimizer step.

    torchrun ... tests/trainer/nan_grad_worker.py RUN_YAML --metrics M --digests DIR --nan IT:MODULE:RANK ...

MODULE is `llm` or `encoder`. The NaN is written after the gradients are reduced (`_finalize`), so only that
rank holds it: the optimizer's world-wide skip decision is the only thing that can stop the other ranks and
that rank from stepping on it.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

from mimo_jobs.trainer.device import prepare


def _split_args(argv: list[str]) -> tuple[list[str], Path, set[tuple[int, str, int]]]:
    rest, digests, nans = [], None, set()
    it = iter(argv)
    for a in it:
        if a == "--digests":
            digests = Path(next(it))
        elif a == "--nan":
            i, module, rank = next(it).split(":")
            nans.add((int(i), module, int(rank)))
        else:
            rest.append(a)
    assert digests is not None, "--digests DIR is required"
    return rest, digests, nans


def _digest(st) -> str:
    h = hashlib.sha256()
    for m in st.modules:
        for p in m.core.parameters():
            h.update(p.detach().float().cpu().numpy().tobytes())
    return h.hexdigest()


def _install(digests: Path, nans: set[tuple[int, str, int]]) -> None:
    import math

    from mimo_jobs.trainer.step import iteration as step

    rank = int(os.environ.get("RANK", "0"))
    finalize, optimizer_step = step._finalize, step._optimizer_step

    def _finalize(st) -> None:
        finalize(st)
        for module in ("llm", "encoder"):
            if (st.iteration + 1, module, rank) not in nans:
                continue
            hit = [m for m in st.modules if (m.modality == "") == (module == "llm") and m.ddp is not None]
            assert hit, f"rank {rank} runs no trained {module} module"
            p = next(iter(hit[0].core.parameters()))
            p.main_grad.view(-1)[0] = math.nan

    def _optimizer_step(st, tm):
        before = _digest(st)
        res = optimizer_step(st, tm)
        rec = {"rank": rank, "iteration": st.iteration + 1, "changed": _digest(st) != before}
        with open(digests / f"rank{rank}.jsonl", "a") as f:
            f.write(json.dumps(rec) + "\n")
        return res

    step._finalize, step._optimizer_step = _finalize, _optimizer_step


if __name__ == "__main__":
    argv, digests, nans = _split_args(sys.argv[1:])
    prepare(argv)
    _install(digests, nans)
    from mimo_jobs.trainer.main import main

    sys.exit(main(argv))

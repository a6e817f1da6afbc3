"""A NaN gradient held by one rank other than rank 0 stops the optimizer step on every rank.

A world of 4 torchrun processes, the encoder on ranks 0-1 and the LLM on ranks 2-3 (the encoder ranks first,
as the trainer lays out every non-colocated run). tests/trainer/nan_grad_worker.py writes a NaN into the LLM's
gradient on rank 3 at iteration 2, and into the encoder's on rank 1 at iteration 4, after the gradients are
reduced (so only that rank holds it). A world-wide MAX of the gradient norms drops a NaN held by a rank other
than rank 0 (gloo; NCCL's float max is `fmaxf`, which returns the non-NaN operand), so the skip decision must
be carried as its own flag.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from helpers.launch import torchrun, worker_env
from helpers.trainer import iterations, make_run_yaml
from mimo_jobs.ingest.iterline import parse_iteration

TESTS_TRAINER = Path(__file__).parent
NAN_AT = {2: ("llm", 3), 4: ("encoder", 1)}


@pytest.mark.slow
def test_a_nan_gradient_on_a_later_rank_is_skipped_on_every_rank_and_flags_the_run(tmp_path) -> None:
    ry = make_run_yaml(
        tmp_path / "run", gpn=4, gbs=4, enc={"dp": 2}, llm={"dp": 2}, iters=5, trainer={"log_interval": 1}
    )
    metrics, digests = tmp_path / "metrics.jsonl", tmp_path / "digests"
    digests.mkdir()
    nan_args = [a for it, (module, rank) in NAN_AT.items() for a in ("--nan", f"{it}:{module}:{rank}")]
    cmd = torchrun(4, TESTS_TRAINER / "nan_grad_worker.py", ry, "--metrics", metrics, "--digests", digests)
    p = subprocess.run(
        [*cmd, *nan_args], capture_output=True, text=True, timeout=900, env=worker_env(), check=False
    )
    assert p.returncode == 0, f"rc={p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-6000:]}"

    # every rank: the parameters unchanged by the poisoned iterations, changed by the others (but the first,
    # which runs at the warmup's learning rate of 0)
    for rank in range(4):
        recs = [json.loads(ln) for ln in (digests / f"rank{rank}.jsonl").read_text().splitlines()]
        assert [r["iteration"] for r in recs] == [1, 2, 3, 4, 5]
        changed = {r["iteration"]: r["changed"] for r in recs}
        assert changed == {it: it > 1 and it not in NAN_AT for it in range(1, 6)}, (rank, changed)

    # the run's records: those iterations skipped and counted as NaN, in metrics.jsonl and the printed line
    rows = {r["iteration"]: r for r in iterations(metrics)}
    assert {it: (r["skipped"], r["nan"]) for it, r in rows.items()} == {
        it: (1, 1) if it in NAN_AT else (0, 0) for it in range(1, 6)
    }
    lines = [parse_iteration(ln) for ln in p.stdout.splitlines() if " iteration " in ln]
    lines = [x for x in lines if x is not None]
    assert {x.iteration: x.nan for x in lines} == {it: int(it in NAN_AT) for it in range(1, 6)}

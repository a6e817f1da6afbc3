"""plan's split search over several encoder modules is bounded (predict/layouts.py MAX_SHAPE_COMBOS): the
product of the modules' shapes grows 24x with every module, so each module is tried with as many of its
shapes as keep the product under the bound, and plan says when it bounded the search. One module keeps every
shape, two MAX_MODULE_SHAPES each; five answer through the real CLI."""

from __future__ import annotations

import subprocess
import sys

from helpers.launch import worker_env
from mimo_jobs.predict.layouts import (
    MAX_MODULE_SHAPES,
    MAX_SHAPE_COMBOS,
    module_shapes,
    shapes_per_module,
)

FIVE = (
    "{encoders: {a: siglip-so400m-14-384, b: siglip-so400m-14-384, c: siglip-so400m-14-384, "
    "d: siglip-so400m-14-384, e: siglip-so400m-14-384}, llm: qwen2.5-7b}"
)


def test_each_module_keeps_as_many_shapes_as_the_bound_allows():
    # one module: every shape (a large batch on a wide node has more than MAX_MODULE_SHAPES); two: the bound's
    # square root each
    from mimo_jobs.study.topology import Layout

    wide = Layout(nodes=100, gpus_per_node=8, gbs=768)
    assert len(module_shapes(wide, 100)) > MAX_MODULE_SHAPES
    assert len(module_shapes(wide, 100, shapes_per_module(1))) == len(module_shapes(wide, 100))
    assert shapes_per_module(2) == MAX_MODULE_SHAPES
    for n in range(1, 8):
        k = shapes_per_module(n)
        assert k**n <= MAX_SHAPE_COMBOS < (k + 1) ** n


def test_the_kept_shapes_are_the_first_of_the_full_list():
    from mimo_jobs.study.topology import Layout

    base = Layout(nodes=8, gpus_per_node=8, gbs=64)
    full = module_shapes(base, 8)
    assert len(full) > 3 and module_shapes(base, 8, 3) == full[:3]


def test_five_encoder_modules_are_planned_and_the_bound_is_said():
    p = subprocess.run(
        [sys.executable, "-m", "mimo_jobs.cli", "plan", "--model", FIVE, "--gbs", "64", "--nodes", "8"],
        capture_output=True,
        text=True,
        timeout=600,
        env=worker_env(),
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert "# search bounded: 5 encoder modules, each tried with 3 of its 24 shapes" in p.stdout
    feasible = int(p.stdout.split("feasible layouts")[0].rsplit(" of ", 1)[1])
    assert 0 < feasible <= MAX_SHAPE_COMBOS * 8 * 8  # the modules' combinations x the LLM's TPs and PPs

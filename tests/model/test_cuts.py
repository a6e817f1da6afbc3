"""model/cuts.py: the one rule of a tensor-parallel cut, strided (a gated fc1's [gate; up]) or not."""

from __future__ import annotations

import pytest

from mimo_jobs.model.cuts import strided_blocks
from mimo_jobs.model.hf_weights import Piece, Target, shard_rows


def test_a_gated_fc1_rank_holds_its_slice_of_gate_and_of_up():
    # fc1 of ffn 6 is [gate 0..5; up 6..11]; TP rank 1 of 3 holds gate rows 2..3 and up rows 8..9
    assert strided_blocks(12, 2, 1, 3) == [(2, 2), (8, 2)]
    assert strided_blocks(12, 1, 1, 3) == [(4, 4)]
    every = sorted(b for r in range(3) for b in strided_blocks(12, 2, r, 3))
    assert [s for s, _ in every] == [0, 2, 4, 6, 8, 10]


def test_the_hf_loader_cuts_by_the_same_rule():
    t = Target("mlp.linear_fc1.weight", (12, 4), (Piece("g", 6), Piece("u", 6)), split=0, parts=2)
    rows, cols = shard_rows(t, 0, 1, 3, 2)
    assert rows == [(s, s + n) for s, n in strided_blocks(12, 2, 1, 3)] and cols is None
    t = Target("linear_proj.weight", (4, 12), (Piece("o", 4),), split=1)
    assert shard_rows(t, 1, 2, 3, 1) == ([(0, 4)], (8, 12))


@pytest.mark.parametrize("args", [(10, 2, 0, 3), (12, 2, 3, 3), (12, 0, 0, 1)])
def test_a_cut_that_does_not_divide_is_refused(args):
    with pytest.raises(ValueError):
        strided_blocks(*args)

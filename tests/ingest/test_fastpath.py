"""The iteration-line fast path (iterline.fast_fields) must give exactly what the generic parser gives:
same columns, losses and extras JSON text, on real upstream lines, on mutated ones, and on random text."""

import json
import random

import pytest

from mimo_jobs.ingest import iterline

UPSTREAM = (
    " consumed samples:         9088 | elapsed time per iteration (ms): 5361.6 | throughput per GPU "
    "(TFLOP/s/GPU): 243.6 | learning rate: 1.420000E-05 | global batch size:   128 | lm loss: 1.818812E+00 | "
    "load_balancing_loss: 1.013377E+00 | loss scale: 1.0 | grad norm: 1.300 | num zeros: 0.0 | number of "
    "skipped iterations:   0 | number of nan iterations:   0 |"
)
LINES = [
    UPSTREAM,
    " elapsed time per iteration (ms): 12.5 | language loss: 2.5 |",
    " mtp_1 loss: 2.1 | z_loss: 3e-3 | lm loss: 1 | elapsed time per iteration (ms): 1e3|",
    ' a:b:3 | ::5 | x % y: 2 | q"uote: 1| dup: 1 | z: 2 | dup: 3 | noval | : 7 |  sp  :  4  ',
    " elapsed time per iteration (ms): 1_0 | global batch size: 1e20 |",
    " elapsed time per iteration (ms): nan | lm loss: inf |",
    " elapsed time per iteration (ms): 5.0 | note: text |",
    "",
]


def _generic(rest: str):
    cols, losses, extras = iterline.parse_fields(rest)
    loss, aux = iterline.main_losses(losses)
    # the extras keep only the losses without a column of their own: not the main loss ("lm loss", else the
    # one loss that is neither load-balancing, z_loss nor mtp), not the first load-balancing loss
    plain = [k for k in losses if "load_balancing" not in k and "z_loss" not in k and "mtp" not in k]
    main = "lm loss" if "lm loss" in losses else (plain[0] if len(plain) == 1 else None)
    aux_key = next((k for k in losses if "load_balancing" in k), None)
    kept = {k: v for k, v in losses.items() if k not in (main, aux_key)}
    if kept:
        extras["losses"] = kept
    return [cols.get(c) for c in iterline.FAST_COLUMNS], loss, aux, json.dumps(extras)


def _corpus() -> list[str]:
    rng = random.Random(7)
    out = list(LINES)
    alphabet = 'ab :|1.5e- \t%"x_'
    for _ in range(3000):
        base = list(rng.choice(LINES[:3]))
        for _ in range(rng.randrange(3)):
            base.insert(rng.randrange(len(base) + 1), rng.choice(alphabet))
        out.append("".join(base))
        out.append(rng.choice(LINES[:3]))  # the same shape again: exercises the cached per-shape regex
        out.append("".join(rng.choice(alphabet) for _ in range(rng.randrange(30))))
    return out


def _num(v):
    return float(v) if isinstance(v, str) else v


@pytest.mark.parametrize("as_text", [False, True])
def test_fast_path_equals_generic_parser(as_text):
    fast_hits = 0
    for rest in _corpus():
        got = iterline.fast_fields(rest, as_text=as_text)
        if got is None:  # the caller falls back to the generic parser: nothing to compare
            continue
        fast_hits += 1
        cols, loss, aux, js = _generic(rest)
        assert [_num(v) for v in got[0]] == cols, rest
        assert (_num(got[1]), _num(got[2]), got[3]) == (loss, aux, js), rest
    assert fast_hits > 1000  # the fast path is taken for ordinary lines


def test_fast_path_declines_non_numbers_and_keeps_ints():
    assert iterline.fast_fields(" elapsed time per iteration (ms): nan | lm loss: 2 |") is None
    assert iterline.fast_fields(" elapsed time per iteration (ms): 5.0 | note: text |") is None
    row, loss, aux, js = iterline.fast_fields(UPSTREAM, as_text=True)
    named = dict(zip(iterline.FAST_COLUMNS, row))
    assert named["consumed_samples"] == 9088 and type(named["consumed_samples"]) is int
    assert float(named["elapsed_ms"]) == 5361.6 and float(loss) == 1.818812 and float(aux) == 1.013377
    assert json.loads(js) == {"num zeros": 0.0}  # lm loss and the aux loss have columns of their own

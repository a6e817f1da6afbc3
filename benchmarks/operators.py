"""The operator-term time model (mimo_jobs/predict/operators.py) against the published runs
(benchmarks/published/runs.yaml), beside the FLOPs-and-efficiency model (benchmarks/published.py).

python benchmarks/operators.py        per row: published, operator model at its physical defaults and with the
                                      stored residuals (opdata.FITTED_RESIDUAL), held out by source; then
                                      median and worst |error| of both models (default, fitted, leave one
                                      source out), the fp8 rows, both models' ranking of each measured sweep
                                      (published.sweep_ranks), and what each residual constant does to the
                                      held-out error (fitted vs left at its physical default)
python benchmarks/operators.py --fit  also the fresh fit per generation, as opdata.FITTED_RESIDUAL stores it,
                                      and its leave-one-source-out per generation, as opdata.HELD_OUT stores
                                      it (the band the operator model's times carry: band.py)

The residuals (operators.Residual: gemm, comm) are fitted per GPU generation on the bf16/fp16 rows
(published.Row.fitted) by a grid search on the sum of squared log errors; fp8 rows are priced (GEMMs at the
FP8 peak, as Transformer Engine runs them) and shown, not fitted; so are the rows whose source says it does
not know its GPUs' peak (runs.yaml's peak_not_known), priced at the datasheet's. Each row's attention is
priced by the kernel it ran (runs.yaml's attention; published.row_attention).

What is stored (STORED_FREE) is the `gemm` residual alone, `comm` left at 1 (the links at their published
rates, each row on the network its source states): fitted too, `comm` compensates across sources rather than
measuring the links. On the ampere rows every source's own best `comm` is 1 to 1.5, yet the pooled fit takes
2.0, which prices Megatron-LM's own runs on the held-out table (benchmarks/holdout.py, Narayanan et al.
2021) up to 43% too slow where `comm` 1 prices them within 17%; the line "both fitted" below shows what
fitting it does to the held-out error on this table.
"""

from __future__ import annotations

import math
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from published import (  # noqa: E402
    Row,
    decomposed,
    flops_price,
    held_out_bands,
    load_rows,
    row_attention,
    row_errors,
    row_gpu,
    stored,
    summary,
    sweep_lines,
    sweep_ranks,
)

from mimo_jobs.predict.estimate import predict_shape  # noqa: E402
from mimo_jobs.predict.hardware import GPU, GPUS, generation  # noqa: E402
from mimo_jobs.predict.operators import Residual  # noqa: E402
from mimo_jobs.predict.optime import op_step, residual_for  # noqa: E402
from mimo_jobs.predict.steptime import Efficiency  # noqa: E402

# what the residuals can physically be: GEMMs at most at their peak; the links at most at their rates
GEMM_GRID = tuple(round(0.30 + 0.025 * i, 3) for i in range(29))  # 0.30 .. 1.00
COMM_GRID = (1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0)
STORED_FREE = ("gemm",)  # the residuals opdata.FITTED_RESIDUAL stores (module docstring)
MIN_RUNS = 3  # a generation with fewer fitted rows fits its gemm residual alone, with the pooled comm


class Priced:
    """Each row's memory plan, computed once (the operator model reads its parameters per rank), and the GPU
    it is priced on: the datasheet's on the network its source states (published.row_gpu)."""

    def __init__(self, rows: list[Row]):
        self.rows = rows
        self.gpus = [row_gpu(r) for r in rows]
        self.mem = [predict_shape(r.shape, GPUS[r.gpu], Efficiency()).memory for r in rows]
        self._seconds: dict[tuple[int, Residual], float] = {}

    def seconds(self, i: int, res: Residual) -> float:
        """Memoised: leave-one-source-out refits price the same (row, residual) pairs once per source."""
        key = (i, res)
        if key not in self._seconds:
            r = self.rows[i]
            self._seconds[key] = op_step(
                r.shape, self.mem[i], self.gpus[i], res, fp8=r.precision == "fp8", attention=row_attention(r)
            ).iteration_s
        return self._seconds[key]

    def price(self, residual: Callable[[GPU], Residual]) -> Callable[[Row], float]:
        """A row's step seconds with each GPU's residual (`residual`: optime.residual_for, the stored fit)."""
        at = {id(r): i for i, r in enumerate(self.rows)}
        return lambda r: self.seconds(at[id(r)], residual(GPUS[r.gpu]))

    def error(self, i: int, res: Residual) -> float:
        return self.seconds(i, res) / self.rows[i].published_s - 1


def _loss(pr: Priced, idx: list[int], res: Residual) -> float:
    return sum(math.log(pr.seconds(i, res) / pr.rows[i].published_s) ** 2 for i in idx)


def fit_one(pr: Priced, idx: list[int], free: tuple[str, ...] = ("gemm", "comm")) -> Residual:
    """The residual minimising the squared log error on rows `idx`; constants not in `free` stay at 1."""
    gs = GEMM_GRID if "gemm" in free else (1.0,)
    cs = COMM_GRID if "comm" in free else (1.0,)
    if not idx:
        return Residual()
    return min((Residual(g, c) for g in gs for c in cs), key=lambda r: _loss(pr, idx, r))


def fit_generations(pr: Priced, keep: list[int], free=STORED_FREE) -> dict[str, Residual]:
    """One residual per generation from the fitted rows in `keep`; a generation with no such row is left at
    the pooled fit of all of them."""
    fitted = [i for i in keep if pr.rows[i].fitted]
    pooled = fit_one(pr, fitted, free)
    out = {}
    for g in sorted({generation(r.gpu) for r in pr.rows}):
        idx = [i for i in fitted if generation(pr.rows[i].gpu) == g]
        if len(idx) >= MIN_RUNS:
            out[g] = fit_one(pr, idx, free)
        elif idx and "gemm" in free:
            out[g] = min((Residual(x, pooled.comm) for x in GEMM_GRID), key=lambda r: _loss(pr, idx, r))
        else:
            out[g] = pooled
    return out


def held_out(pr: Priced, free=STORED_FREE) -> list[float | None]:
    """Leave one source out: fit without its rows, price its fitted rows."""
    out: list[float | None] = [None] * len(pr.rows)
    for src in sorted({r.source for r in pr.rows}):
        train = [i for i, r in enumerate(pr.rows) if r.source != src]
        res = fit_generations(pr, train, free)
        for i, r in enumerate(pr.rows):
            if r.source == src and r.fitted:
                out[i] = pr.error(i, res[generation(r.gpu)])
    return out


def stats(errs) -> tuple[float, float, int]:
    a = [abs(e) for e in errs if e is not None]
    return statistics.median(a), max(a), len(a)


def line(label: str, errs) -> str:
    m, w, n = stats(errs)
    return f"{label:52} median |error| {m:6.1%}, worst {w:6.1%} ({n} rows)"


def main(argv: list[str]) -> None:
    _, rows = load_rows()
    pr = Priced(rows)
    idx = range(len(rows))
    default = [pr.error(i, Residual()) for i in idx]
    fitted = [pr.error(i, residual_for(GPUS[rows[i].gpu])) for i in idx]
    lo = held_out(pr)
    print(f"{'row':38} {'gpu':5} {'prec':5} {'published s':>11} {'default':>8} {'fitted':>8} {'held-out':>8}")
    for r, d, s, h in zip(rows, default, fitted, lo, strict=True):
        ho = f"{h:+8.1%}" if h is not None else f"{'(no fit)':>8}"
        print(f"{r.id:38} {r.gpu:5} {r.precision:5} {r.published_s:11.3f} {d:+8.1%} {s:+8.1%} {ho}")
    fit_rows = [i for i, r in enumerate(rows) if r.fitted]
    cur = summary(rows, row_errors(rows, decomposed(rows)))
    print()
    print(line("current model, default efficiencies:", cur["before"]))
    print(line("current model, fitted (hardware.py):", cur["after"]))
    print(line("current model, leave-one-source-out:", cur["held_out"]))
    print(line("operator model, physical defaults:", [default[i] for i in fit_rows]))
    print(line("operator model, fitted (opdata.FITTED_RESIDUAL):", [fitted[i] for i in fit_rows]))
    print(line("operator model, leave-one-source-out:", [lo[i] for i in fit_rows]))
    fp8 = [i for i, r in enumerate(rows) if r.precision == "fp8"]
    print(line("fp8 rows, operator model, physical defaults:", [default[i] for i in fp8]))
    print(line("fp8 rows, operator model, fitted residuals:", [fitted[i] for i in fp8]))
    unknown = [i for i, r in enumerate(rows) if r.peak_not_known is not None and r.precision != "fp8"]
    print(line("rows on GPUs of unknown peak, datasheet peak, fitted:", [fitted[i] for i in unknown]))
    print()
    print("ranking within each measured sweep (GPU-seconds per token; FLOPs model, then operator model):")
    flops = sweep_lines(sweep_ranks(rows, flops_price(stored(rows))))
    op = sweep_lines(sweep_ranks(rows, pr.price(residual_for)))
    for f, o in zip(flops, op, strict=True):
        print(f"  FLOPs    {f}")
        print(f"  operator {o}")
    print()
    print("what each residual does to the held-out error (the other fitted too / left at 1):")
    for free, label in ((("gemm", "comm"), "both fitted"), (("gemm",), "gemm fitted, comm at 1 (stored)"),
                        (("comm",), "comm fitted, gemm at 1"), ((), "neither (physical defaults)")):  # fmt: skip
        print(line(f"  leave-one-source-out, {label}:", [e for e in held_out(pr, free) if e is not None]))
    if "--fit" in argv:
        print()
        print("fresh fit per generation, as opdata.FITTED_RESIDUAL stores it (gemm, comm):")
        for g, r in fit_generations(pr, list(idx)).items():
            print(f'    "{g}": ({r.gemm:.3f}, {r.comm:.2f}),')
        print()
        print(
            "held out by source per generation, as opdata.HELD_OUT stores it (median, worst, rows, sources):"
        )
        for g, b in held_out_bands(rows, lo).items():
            print(f'    "{g}": {b},')


if __name__ == "__main__":
    main(sys.argv[1:])

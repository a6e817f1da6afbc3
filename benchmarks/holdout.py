"""The planner's step times on published runs it was never fitted on (benchmarks/published/holdout.yaml).

python benchmarks/holdout.py    per row: the published step time, the operator model's with the stored
                                residuals (opdata.FITTED_RESIDUAL) and the FLOPs model's with the stored
                                efficiencies (hardware.FITTED_EFFICIENCY), and each error; then median and
                                worst |error| per GPU generation and overall against the goal (median 15%,
                                worst 30%); then the memory verdict of every row

Both models' constants are fitted on benchmarks/published/runs.yaml alone, and holdout.yaml cites none of its
sources, so these errors are what a user with a run from elsewhere can expect. The pricing is
benchmarks/operators.py's (operator model) and benchmarks/published.py's (FLOPs model); this file only loads
the other table and prints.
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from operators import Priced  # noqa: E402
from published import DATA, Row, load_rows, memory_of, memory_verdict, predicted_s, stored  # noqa: E402

from mimo_jobs.predict.hardware import generation  # noqa: E402
from mimo_jobs.predict.optime import residual_for  # noqa: E402

HOLDOUT = DATA.parent / "holdout.yaml"
# the goal for times held out from the fit (docs/predict.md): median and worst |error| over bf16/fp16 rows
MEDIAN_GOAL, WORST_GOAL = 0.15, 0.30


@dataclass(frozen=True)
class HeldOut:
    row: Row
    operator_s: float
    flops_s: float

    @property
    def operator_error(self) -> float:
        return self.operator_s / self.row.published_s - 1

    @property
    def flops_error(self) -> float:
        return self.flops_s / self.row.published_s - 1


def price(rows: list[Row]) -> list[HeldOut]:
    """Each row by both models with the constants stored now (fitted on runs.yaml)."""
    op = Priced(rows).price(residual_for)
    effs = stored(rows)
    return [HeldOut(r, op(r), predicted_s(r, effs[generation(r.gpu)])) for r in rows]


def verdict_line(label: str, errs: list[float]) -> str:
    a = [abs(e) for e in errs]
    med, worst = statistics.median(a), max(a)
    ok = "meets" if med <= MEDIAN_GOAL and worst <= WORST_GOAL else "misses"
    return (
        f"{label:40} median |error| {med:6.1%}, worst {worst:6.1%} ({len(a)} rows): {ok} the goal "
        f"(median {MEDIAN_GOAL:.0%}, worst {WORST_GOAL:.0%})"
    )


def summary_lines(priced: list[HeldOut]) -> list[str]:
    """Per model, per generation then overall, over the bf16/fp16 rows (docs/predict.md quotes these)."""
    fit = [p for p in priced if p.row.fitted]
    out = []
    for model, err in (("operator", lambda p: p.operator_error), ("FLOPs", lambda p: p.flops_error)):
        for g in sorted({generation(p.row.gpu) for p in fit}):
            errs = [err(p) for p in fit if generation(p.row.gpu) == g]
            out.append(verdict_line(f"held-out set, {model} model, {g}:", errs))
        out.append(verdict_line(f"held-out set, {model} model, all:", [err(p) for p in fit]))
    return out


def source_lines(priced: list[HeldOut]) -> list[str]:
    """Median and worst |error| per source and model: which publisher's runs the constants transfer to."""
    out = []
    for src in sorted({p.row.source for p in priced}):
        mine = [p for p in priced if p.row.source == src and p.row.fitted]
        for model, errs in (
            ("operator", [p.operator_error for p in mine]),
            ("FLOPs", [p.flops_error for p in mine]),
        ):
            a = [abs(e) for e in errs]
            out.append(
                f"  {src:24} {model:8} median |error| {statistics.median(a):6.1%}, worst {max(a):6.1%} "
                f"({len(a)} rows, signed median {statistics.median(errs):+6.1%})"
            )
    return out


def memory_lines(rows: list[Row]) -> list[str]:
    out = []
    for r in rows:
        note = f"  (not described: {r.memory_not_described})" if r.memory_not_described else ""
        note += f"  (known miss: {r.known_miss})" if r.known_miss else ""
        out.append(f"{r.id:34} {r.gpu:5} {memory_of(r)['total']:7.1f} GiB  {memory_verdict(r)}{note}")
    return out


def main() -> None:
    _, rows = load_rows(HOLDOUT)
    priced = price(rows)
    print(
        f"{'row':34} {'gpu':5} {'prec':5} {'published s':>11} {'operator s':>10} {'err':>7} {'FLOPs s':>9} {'err':>7}"
    )
    for p in priced:
        r = p.row
        print(
            f"{r.id:34} {r.gpu:5} {r.precision:5} {r.published_s:11.3f} {p.operator_s:10.3f} "
            f"{p.operator_error:+7.1%} {p.flops_s:9.3f} {p.flops_error:+7.1%}"
        )
    print()
    print("\n".join(summary_lines(priced)))
    print("per source:")
    print("\n".join(source_lines(priced)))
    print()
    print("memory verdicts: every row ran on its GPU, so each row the memory model describes must fit")
    print("\n".join(memory_lines(rows)))


if __name__ == "__main__":
    main()

"""Number formatting shared by the renderers (one place, so table/md/html agree)."""

from __future__ import annotations

from .model import ParityRow, Report, RunRow


def num(x: float | int | None, digits: int = 1) -> str:
    if x is None:
        return "-"
    if isinstance(x, int):
        return f"{x:,}"
    if x != x:  # nan
        return "nan"
    if abs(x) >= 1e6:
        return f"{x:,.0f}"
    return f"{x:,.{digits}f}"


def pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def loss(x: float | None) -> str:
    return "-" if x is None else f"{x:.4f}"


def iters(r: RunRow) -> str:
    if r.iterations is None:
        return "-"
    return f"{r.iterations}/{r.train_iters}" if r.train_iters else str(r.iterations)


RUN_HEADERS = [
    "study",
    "run",
    "nodes",
    "GPUs",
    "state",
    "iter",
    "t med (ms)",
    "t mean",
    "t std",
    "samples/s",
    "tokens/s",
    "tokens/s/GPU*",
    "MFU",
    "E(N)",
    "final loss",
    "flags",
]


def run_cells(r: RunRow) -> list[str]:
    return [
        r.study,
        r.name,
        num(r.nodes),
        num(r.gpus),
        r.state,
        iters(r),
        num(r.t_median_ms),
        num(r.t_mean_ms),
        num(r.t_std_ms),
        num(r.samples_per_s, 2),
        num(r.tokens_per_s, 0),
        num(r.tokens_per_s_per_gpu, 1),
        pct(r.mfu),
        "-" if r.efficiency is None else f"{r.efficiency:.3f}",
        loss(r.final_loss),
        "; ".join(r.flags),
    ]


def parity_cells(p: ParityRow, abs_diff: bool = True) -> list[str]:
    """A loss-parity row: run, nodes, samples, loss, baseline loss, [max |diff|,] max rel diff."""
    cells = [
        p.name,
        num(p.nodes),
        ", ".join(num(s, 0) for s in p.samples),
        ", ".join(loss(x) for x in p.loss),
        ", ".join(loss(x) for x in p.baseline_loss),
    ]
    return cells + ([loss(p.max_abs_diff)] if abs_diff else []) + [pct(p.max_rel_diff)]


def phase_names(report: Report) -> list[str]:
    seen: list[str] = []
    for r in report.runs:
        for p in r.phase_share:
            if p not in seen:
                seen.append(p)
    return seen

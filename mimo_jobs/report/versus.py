"""Two sets of runs compared layout by layout: two studies, or one study at two code versions (two stores).

Runs match when their layout does: nodes, the encoder/LLM split with its TP/PP/EP/DP, colocated or not,
the global batch and the repeat index. Each match gets the ratios OTHER / BASE of the steady-state iteration
time, the per-GPU throughput (carried tokens when both counted them), the largest per-rank memory, and the
loss difference at equal consumed samples; a change beyond the noise (figures.noise) in the wrong direction
is a regression. Pure: two Reports in, a Versus out.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass, field

from . import figures
from .compare import all_carried, perf
from .model import Report, RunRow


@dataclass
class VersusRow:
    layout: str  # nodes, layout, kind, GBS (and repeat): what matched the two runs
    base_run: str
    other_run: str
    base_version: str  # "<package version> <git sha>" of the run ("-" where unknown)
    other_version: str
    base_ms: float | None
    other_ms: float | None
    time_ratio: float | None  # other / base steady-state median (> 1: OTHER is slower)
    metric: str  # what throughput_ratio compares
    throughput_ratio: float | None  # other / base per-GPU throughput (< 1: OTHER is slower)
    base_memory: int | None  # the largest per-rank total (weights + grads + optimizer + activations)
    other_memory: int | None
    memory_ratio: float | None
    loss_max_rel_diff: float | None  # at equal consumed samples
    noise: float  # the relative change below which a difference is noise
    regressions: list[str] = field(default_factory=list)  # what got worse beyond the noise
    verdict: str = ""


@dataclass
class Versus:
    base: str  # "<study> (<store>)"
    other: str
    noise_floor: float
    rows: list[VersusRow]
    unmatched: list[str]  # "<side>: <run>: no run of the same layout in <other side>"

    def to_dict(self) -> dict:
        return asdict(self)


def layout_key(r: RunRow) -> tuple:
    return (r.nodes, r.layout, r.colocated, r.gbs, r.repeat)


def _key_text(r: RunRow) -> str:
    kind = "colocated" if r.colocated else "heterogeneous"
    rep = f" repeat {r.repeat}" if r.repeat else ""
    return f"{r.nodes}n {r.layout} ({kind}) GBS {r.gbs}{rep}"


def version(r: RunRow) -> str:
    sha = (r.git_sha or "")[:12]
    return " ".join(x for x in (r.pkg_version, sha) if x) or "-"


def memory_peaks(rep: Report) -> dict[str, int]:
    """Per run: the largest total over its ranks of the four measured memory facts."""
    out: dict[str, int] = {}
    for m in rep.rank_memory:
        total = sum(
            int(m.get(k) or 0)
            for k in (
                "param_bytes",
                "grad_buffer_bytes",
                "optimizer_state_bytes",
                "saved_activation_peak_bytes",
            )
        )
        out[m["run_id"]] = max(out.get(m["run_id"], 0), total)
    return out


def versus(
    base: Report, other: Report, base_name: str, other_name: str, floor: float = figures.NOISE_FLOOR
) -> Versus:
    """Every run of `other` against the run of `base` with the same layout (of several, a completed one
    with a steady-state time first: a failed run is matched only when nothing better is there)."""
    by_key: dict[tuple, list[RunRow]] = defaultdict(list)
    for r in sorted(base.runs, key=_first_choice):
        by_key[layout_key(r)].append(r)
    mem_b, mem_o = memory_peaks(base), memory_peaks(other)
    rows, unmatched = [], []
    for o in sorted(other.runs, key=lambda x: (x.name, *_first_choice(x))):
        cands = by_key.get(layout_key(o))
        if not cands:
            unmatched.append(f"{other_name}: {o.name}: no run of layout {_key_text(o)} in {base_name}")
            continue
        b = cands.pop(0)
        rows.append(_row(b, o, base, other, mem_b.get(b.run_id), mem_o.get(o.run_id), floor))
    unmatched += [
        f"{base_name}: {b.name}: no run of layout {_key_text(b)} in {other_name}"
        for bs in by_key.values()
        for b in bs
    ]
    return Versus(base_name, other_name, floor, rows, unmatched)


def _first_choice(r: RunRow) -> tuple:
    return (r.state != "COMPLETED", r.t_median_ms is None, r.name)


def compared(v: Versus) -> int:
    """How many matched pairs have a steady-state time on both sides (the rest compare nothing)."""
    return sum(1 for r in v.rows if r.time_ratio is not None)


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _row(
    b: RunRow, o: RunRow, base: Report, other: Report, mb: int | None, mo: int | None, floor: float
) -> VersusRow:
    carried = all_carried([b, o])
    metric = "tokens/s/GPU" if carried else "slots/s/GPU"
    cb, co = base.curves.get(b.run_id), other.curves.get(o.run_id)
    loss = None
    if cb and co:
        loss = figures.loss_parity(co, cb, figures.parity_points([cb, co])).max_rel_diff
    nz = figures.noise([figures.ci95_rel(x.t_std_ms, x.t_mean_ms, x.window_n) for x in (b, o)], floor)
    row = VersusRow(
        layout=_key_text(o),
        base_run=b.name,
        other_run=o.name,
        base_version=version(b),
        other_version=version(o),
        base_ms=b.t_median_ms,
        other_ms=o.t_median_ms,
        time_ratio=_ratio(o.t_median_ms, b.t_median_ms),
        metric=metric,
        throughput_ratio=_ratio(perf(o, carried), perf(b, carried)),
        base_memory=mb,
        other_memory=mo,
        memory_ratio=_ratio(mo, mb),
        loss_max_rel_diff=loss,
        noise=nz,
    )
    _judge(row, floor)
    return row


def _judge(row: VersusRow, floor: float) -> None:
    """The regressions beyond the noise and a one-line verdict. Time and throughput use the runs' noise;
    memory (no run-to-run spread) the floor; the loss the report's parity tolerance."""
    bad = []
    if row.time_ratio is not None and row.time_ratio - 1 > row.noise:
        bad.append(f"iteration time {row.time_ratio:.2f}x")
    if row.throughput_ratio is not None and 1 - row.throughput_ratio > row.noise:
        bad.append(f"{row.metric} {row.throughput_ratio:.2f}x")
    if row.memory_ratio is not None and row.memory_ratio - 1 > floor:
        bad.append(f"memory {row.memory_ratio:.2f}x")
    if row.loss_max_rel_diff is not None and row.loss_max_rel_diff > figures.PARITY_TOLERANCE:
        bad.append(f"loss differs by {row.loss_max_rel_diff:.1%} at equal samples")
    row.regressions = bad
    if bad:
        row.verdict = f"regression beyond the noise ({row.noise:.1%}): " + ", ".join(bad)
    elif row.time_ratio is None:
        row.verdict = "no steady-state time on one side"
    elif 1 - row.time_ratio > row.noise:
        row.verdict = f"faster: iteration time {row.time_ratio:.2f}x"
    else:
        row.verdict = f"within the noise ({row.noise:.1%})"

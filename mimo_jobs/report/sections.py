"""The comparison sections of a report as rows of text cells, shared by the table and markdown renderings:
layouts of one size, heterogeneous vs colocated, the measured memory per module and stage, and the
planner's predictions against the measured figures. The figures are computed in compare.py, memory.py and
predicted.py; this module only formats them."""

from __future__ import annotations

from dataclasses import dataclass

from . import fmt
from .cost import tokens_text
from .model import Report

TEXT_HEADS = {
    "study",
    "run",
    "heterogeneous",
    "colocated",
    "verdict",
    "why",
    "module",
    "priced on",
    "bottleneck",
}


@dataclass
class Section:
    title: str
    headers: list[str]
    rows: list[list[str]]
    lines: list[str]  # text after the table (unpaired runs)


def _gib(b: int | None) -> str:
    if b is None:
        return "-"
    if b >= 2**28:
        return f"{b / 2**30:.2f} GiB"
    return f"{b / 2**20:.1f} MiB" if b >= 2**20 else f"{b / 2**10:.1f} KiB"


def layouts(report: Report) -> Section | None:
    rows = [
        [r.study, r.name, fmt.num(r.nodes), "colocated" if r.colocated else "heterogeneous",
         fmt.num(r.carried_tokens_per_s_per_gpu, 1), fmt.num(r.tokens_per_s_per_gpu, 1),
         f"{r.relative_throughput:.2f}", r.layout_note or ""]
        for r in report.runs
        if r.relative_throughput is not None
    ]  # fmt: skip
    if not rows:
        return None
    heads = ["study", "run", "nodes", "layout", "tokens/s/GPU", "slots/s/GPU", "vs best", "why"]
    return Section(
        "Layouts of one size (throughput relative to the best layout of the same node count)", heads, rows, []
    )


def _shares(ph: dict[str, float]) -> str:
    return ", ".join(
        f"{k.replace('_', ' ')} {v:.0%}" for k, v in sorted(ph.items(), key=lambda kv: -kv[1]) if v >= 0.01
    )


def pairs(report: Report) -> Section | None:
    if not report.pairs and not report.unpaired:
        return None
    rows = [
        [p.study, p.hetero_run, p.colocated_run + (" (fastest)" if p.best_colocated else ""), fmt.num(p.nodes),
         fmt.num(p.gbs), fmt.num(p.hetero_ms), fmt.num(p.colocated_ms),
         "-" if p.time_ratio is None else f"{p.time_ratio:.2f}", "-" if p.tokens_ratio is None else f"{p.tokens_ratio:.2f}",
         fmt.pct(p.loss_max_rel_diff), _shares(p.hetero_phases), _shares(p.colocated_phases), p.verdict]
        for p in report.pairs
    ]  # fmt: skip
    heads = ["study", "heterogeneous", "colocated", "nodes", "GBS", "t het (ms)", "t colo (ms)", "time colo/het",
             "tokens/s/GPU het/colo", "loss max rel diff", "phases het", "phases colo", "verdict"]  # fmt: skip
    lines = [f"verdict: {v}" for v in report.pair_verdicts] + [f"unpaired: {u}" for u in report.unpaired]
    return Section(
        "Heterogeneous vs colocated (every pair of the same study, node count and global batch)",
        heads,
        rows,
        lines,
    )


def _pm(mean: float | None, ci: float | None, digits: int = 1) -> str:
    return (
        "-" if mean is None else fmt.num(mean, digits) + ("" if ci is None else f" ± {fmt.num(ci, digits)}")
    )


def repeats(report: Report) -> Section | None:
    if not report.repeats:
        return None
    rows = [
        [r.study, r.name, fmt.num(r.nodes), str(r.runs), _pm(r.t_mean_ms, r.t_ci95_ms), fmt.num(r.t_spread_ms),
         _pm(r.perf_mean, r.perf_ci95), fmt.num(r.perf_spread, 1), r.metric, "; ".join(r.flags)]
        for r in report.repeats
    ]  # fmt: skip
    heads = ["study", "run", "nodes", "repeats", "t mean ± 95% (ms)", "t spread", "throughput/GPU ± 95%",
             "throughput spread", "metric", "flags"]  # fmt: skip
    return Section(
        "Repeats (runs differing only in the repeat index; mean ± 95% confidence interval)", heads, rows, []
    )


def _hours(h: float | None) -> str:
    return "-" if h is None else f"{h:,.3g}" if h < 100 else f"{h:,.0f}"


def cost(report: Report) -> Section | None:
    runs = [r for r in report.runs if r.gpu_hours is not None or r.budget_hours is not None]
    if not runs:
        return None
    budget = report.params.get("tokens_budget")
    rows = [
        [r.study, r.name, fmt.num(r.gpus), _hours(r.gpu_hours), _hours(r.node_hours),
         _hours(r.gpu_hours_per_billion_tokens), str(r.jobs_uncosted)]
        + ([_hours(r.budget_hours), _hours(r.budget_gpu_hours)] if budget else [])
        for r in runs
    ]  # fmt: skip
    heads = ["study", "run", "GPUs", "GPU-hours", "node-hours", "GPU-h per 1B tokens", "jobs not costed"]
    if budget:
        heads += [f"hours to {tokens_text(budget)} tokens", f"GPU-hours to {tokens_text(budget)} tokens"]
    lines = [
        f"{s.name}: {_hours(s.gpu_hours)} GPU-hours, {_hours(s.node_hours)} node-hours over its runs' jobs"
        for s in report.studies
        if s.gpu_hours is not None
    ]
    lines.append(
        "hours: elapsed time of every job that started and ended (retries and requeues included) x the run's "
        "GPUs (nodes); tokens: carried tokens"
        + ("; the budget is projected at each run's steady-state carried tokens/s" if budget else "")
    )
    return Section("Cost (GPU-hours from the jobs' elapsed times)", heads, rows, lines)


def memory(report: Report) -> Section | None:
    if not report.memory:
        return None
    rows = [
        [m.name, m.module + ("" if m.stage is None else f" stage {m.stage}"), str(m.ranks), f"{m.params:,}",
         _gib(m.param_bytes), _gib(m.grad_buffer_bytes), _gib(m.optimizer_state_bytes),
         _gib(m.saved_activation_peak_bytes), str(m.inflight_peak), _gib(m.cuda_max_allocated_bytes)]
        for m in report.memory
    ]  # fmt: skip
    heads = ["run", "module", "ranks", "params", "weights", "grad buffers", "optimizer state",
             "saved activations (peak)", "in flight", "CUDA max allocated"]  # fmt: skip
    return Section(
        "Measured memory per rank (the largest over the ranks of each module and stage)", heads, rows, []
    )


def _err(e: float | None) -> str:
    return "-" if e is None else f"{e:+.1%}"


def predicted(report: Report) -> Section | None:
    if not report.predicted:
        return None
    rows = [
        [p.name, p.gpu, f"{p.predicted_s:.4g}", "-" if p.measured_s is None else f"{p.measured_s:.4g}",
         _err(p.error), fmt.num(p.predicted_tokens_per_s_per_gpu, 1), fmt.num(p.measured_tokens_per_s_per_gpu, 1),
         _err(p.tokens_error), p.bottleneck]
        for p in report.predicted
    ]  # fmt: skip
    heads = ["run", "priced on", "predicted s/iter", "measured s/iter", "error", "predicted tokens/s/GPU",
             "measured tokens/s/GPU", "tokens error", "bottleneck"]  # fmt: skip
    lines = []
    if any(p.gpu == "cpu" for p in report.predicted):
        lines.append(CPU_TIME_NOTE)
    return Section(
        "Predicted vs measured time (planner, default efficiencies; error = (predicted - measured) / measured)",
        heads,
        rows,
        lines,
    )


# The planner prices FLOPs and bytes moved; a CPU/gloo step of a tiny model is almost all per-call overhead.
CPU_TIME_NOTE = (
    "cpu: times priced from FLOPs alone are far below a CPU/gloo step of a small model, which is mostly "
    "per-call overhead; mimo-jobs predict STUDY --db FILE fits the efficiencies to these runs and reports "
    "held-out errors"
)


def predicted_memory(report: Report) -> Section | None:
    if not report.predicted_memory:
        return None
    rows = [
        [m.name, m.rank_class, m.ranks, _gib(m.predicted_bytes), _gib(m.measured_bytes), str(m.measured_ranks),
         _err(m.error)]
        for m in report.predicted_memory
    ]  # fmt: skip
    heads = ["run", "module", "ranks", "predicted", "measured (largest rank)", "ranks measured", "error"]
    return Section(
        "Predicted vs measured memory per rank class (weights + gradients + optimizer state + activations)",
        heads,
        rows,
        [],
    )


def all_sections(report: Report) -> list[Section]:
    found = (
        layouts(report),
        pairs(report),
        repeats(report),
        cost(report),
        memory(report),
        predicted(report),
        predicted_memory(report),
    )
    return [s for s in found if s is not None]

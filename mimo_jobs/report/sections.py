"""The comparison sections of a report as rows of text cells, shared by the table and markdown renderings:
layouts of one size, heterogeneous vs colocated, each module's phases and which side bounds the step, the
measured memory per module and stage, and the planner's predictions against the measured figures. The
figures are computed in compare.py, modules.py, memory.py and predicted.py; this module only formats them."""

from __future__ import annotations

from dataclasses import dataclass

from mimo_jobs.predict.cost import tokens_text

from . import external, fmt
from .model import Report
from .predicted import priced_on

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
    "bounds the step",
    "program",  # external.py's sections
    "own command",
    "packaged trainer",
    "layout",
    "other logged",
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
         fmt.num(r.tokens_per_s_per_gpu, 1), fmt.num(r.slots_per_s_per_gpu, 1),
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


def module_phases(report: Report) -> Section | None:
    if not report.modules:
        return None
    rows = [
        [m.study, m.name, m.module, str(m.ranks), fmt.num(m.step_ms), fmt.num(m.busy_ms), fmt.num(m.wait_ms),
         fmt.num(m.optimizer_ms), fmt.num(m.untimed_ms), fmt.pct(m.busy_share), fmt.pct(m.wait_share),
         fmt.pct(m.rest_share), fmt.pct(m.idle)]
        for m in report.modules
    ]  # fmt: skip
    heads = ["study", "run", "module", "ranks", "step (ms)", "busy (ms)", "wait (ms)", "optimizer (ms)",
             "untimed (ms)", "busy share", "wait share", "rest share", "idle"]  # fmt: skip
    lines = [
        "per iteration, mean over the module's ranks (their own timers, the iterations after each job's "
        "first): busy = forward, backward and data; wait = bridge and pipeline waits; rest = optimizer + "
        "untimed; idle = wait / (busy + wait)"
    ]
    return Section("Module phases (each module's ranks, from their own timers)", heads, rows, lines)


def _side(b) -> str:
    if b.bound is None:
        return "- (colocated)" if b.colocated else "-"
    return b.bound


def bounds(report: Report) -> Section | None:
    if not report.bounds:
        return None
    rows = [
        [b.study, b.name, _side(b), fmt.num(b.encoder_busy_ms), fmt.num(b.llm_busy_ms), fmt.pct(b.encoder_idle),
         fmt.pct(b.llm_idle), fmt.pct(b.other_idle), b.predicted_bottleneck or "-", fmt.pct(b.predicted_idle),
         "-" if b.agrees is None else ("yes" if b.agrees else "no")]
        for b in report.bounds
    ]  # fmt: skip
    heads = ["study", "run", "bounds the step", "encoder busy (ms)", "LLM busy (ms)", "encoder idle",
             "LLM idle", "idle of the other", "predicted bottleneck", "predicted idle of the other",
             "agrees"]  # fmt: skip
    lines = [
        "measured: the module with the most busy time per iteration (an encoder module, or the busiest LLM "
        "stage) bounds the step; encoder busy is the busiest encoder module's, encoder idle over every encoder "
        "rank; the planner's: the module whose one microbatch takes longest, idle = 1 - shortest / longest"
    ]
    return Section("Which side bounds the step (measured against the planner)", heads, rows, lines)


def encoder_phases(report: Report) -> Section | None:
    if not report.encoder_phases:
        return None
    rows = [
        [e.study, e.name, e.module, fmt.num(e.fwd_ms), fmt.num(e.bwd_ms), fmt.num(e.busy_ms),
         "yes" if e.bounds else "", e.predicted_bottleneck or "-"]
        for e in report.encoder_phases
    ]  # fmt: skip
    heads = ["study", "run", "module", "forward (ms)", "backward (ms)", "busy (ms)", "bounds the step",
             "predicted bottleneck"]  # fmt: skip
    lines = [
        "per iteration, mean over the steady window of the iteration records' <module>_fwd and _bwd (enc_*: "
        "the one encoder); the module with the most busy time bounds the step; the planner's bottleneck is "
        "the module whose one microbatch takes longest"
    ]
    return Section("Encoder modules' phases (several encoders)", heads, rows, lines)


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
         _gib(m.module_activation_peak_bytes), _gib(m.saved_activation_peak_bytes), str(m.inflight_peak),
         _gib(m.cuda_max_allocated_bytes)]
        for m in report.memory
    ]  # fmt: skip
    heads = ["run", "module", "ranks", "params", "weights", "grad buffers", "optimizer state",
             "module's activations (peak)", "rank's activations (peak)", "in flight",
             "CUDA max allocated"]  # fmt: skip
    lines = [
        "activations: what autograd kept for backward at its peak, the module's own forward's and its ranks' "
        "(every module a colocated rank runs, and the loss); '-': facts written before the trainer measured "
        "each module"
    ]
    return Section(
        "Measured memory per rank (the largest over the ranks of each module and stage)", heads, rows, lines
    )


def _err(e: float | None) -> str:
    return "-" if e is None else f"{e:+.1%}"


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.4g}"


def predicted(report: Report) -> Section | None:
    """The planner's times against the measured ones; errors only where calibrated (predicted.py says when:
    its notes, the section's lines, say it per study and GPU)."""
    if not report.predicted and not report.predicted_notes:
        return None
    cal = any(p.calibrated for p in report.predicted)
    rows = [
        [p.name, priced_on(p.gpu, p.layers), f"{p.predicted_s:.4g}", _s(p.measured_s)]
        + ([_s(p.calibrated_s), _err(p.calibrated_error), _s(p.holdout_s), _err(p.holdout_error)] if cal else [])
        + [fmt.num(p.predicted_tokens_per_s_per_gpu, 1), fmt.num(p.measured_tokens_per_s_per_gpu, 1), p.bottleneck]
        for p in report.predicted
    ]  # fmt: skip
    heads = ["run", "priced on", "predicted s/iter", "measured s/iter"]
    heads += ["calibrated s/iter", "error", "held-out s/iter", "held-out error"] if cal else []
    heads += ["predicted tokens/s/GPU", "measured tokens/s/GPU", "bottleneck"]
    lines = list(report.predicted_notes)
    if any(p.gpu == "cpu" and not p.calibrated for p in report.predicted):
        lines.append(CPU_TIME_NOTE)
    return Section(
        "Predicted vs measured time (planner with its default efficiencies, and calibrated where the study has "
        "enough measured runs; error = (predicted - measured) / measured)",
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
         _err(m.error), _gib(m.predicted_activation_bytes), _gib(m.measured_activation_bytes),
         _err(m.activation_error)]
        for m in report.predicted_memory
    ]  # fmt: skip
    heads = ["run", "module", "ranks", "predicted", "measured (largest rank)", "ranks measured", "error",
             "predicted activations", "measured activations", "activations error"]  # fmt: skip
    lines = [
        "module: the modules a class's ranks run, by the study's names (colocated ranks: every one, joined "
        "by +); activations: the planner's for the class against the largest saved-activation peak its ranks "
        "measured"
    ]
    return Section(
        "Predicted vs measured memory per rank class (weights + gradients + optimizer state + activations)",
        heads,
        rows,
        lines,
    )


def all_sections(report: Report) -> list[Section]:
    found = (
        layouts(report),
        pairs(report),
        module_phases(report),
        bounds(report),
        encoder_phases(report),
        repeats(report),
        cost(report),
        memory(report),
        predicted(report),
        predicted_memory(report),
    )
    return [s for s in found if s is not None] + [Section(*x) for x in external.sections(report)]

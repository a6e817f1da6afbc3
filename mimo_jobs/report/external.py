"""Runs of other programs in the report: what their own logs say, and each run of its own command against the
packaged trainer's at the same layout.

A log's own throughput figure (Megatron-LM's `throughput per GPU (TFLOP/s/GPU)`, or the packaged trainer's
counterpart) is shown beside mimo-jobs' MFU, with the MFU it implies against the GPU's peak: two FLOPs
counts of the same steps side by side, so a model told wrongly to `ingest --model` shows as a gap. The MoE
load-balancing loss and every other number the iteration lines carry are shown where a run has them.
"""

from __future__ import annotations

from collections.abc import Callable

from . import fmt, queries
from .model import Report, RunRow
from .spec import run_spec

# Keys of the packaged trainer's own extras that repeat a column or the run's size (contract/iteration.py).
_OWN_EXTRAS = frozenset({"image_tokens", "world", "memory"})


def apply(
    rows: list[RunRow],
    runs: list[dict],
    steady: dict[str, tuple],
    gpu: str | None,
    gpu_names: dict[str, str | None],
    extras: Callable[[dict[str, int]], dict[str, dict[str, float]]],
    cut: dict[str, int],
) -> None:
    """Set each row's program kind and logged figures. `extras(cut)` reads the logged numbers of the runs
    given (queries.logged_extras); only runs of other programs are read (the packaged trainer's are its
    own bookkeeping)."""
    from mimo_jobs.predict.hardware import measured_gpu
    from mimo_jobs.study.command import command_of

    by_id = {r.run_id: r for r in rows}
    others: dict[str, int] = {}
    for r in runs:
        row, spec = by_id.get(r["run_id"]), run_spec(r)
        if row is None:
            continue
        row.program = "log" if spec is None else "own command" if command_of(spec) else "packaged trainer"
        if row.program != "packaged trainer" and r["run_id"] in cut:
            others[r["run_id"]] = cut[r["run_id"]]
        a = steady.get(r["run_id"])
        logged = a[queries.LOGGED_AT :] if a else ()
        row.log_tflops_per_gpu, row.moe_aux_loss = (tuple(logged) + (None, None))[:2]
        if row.log_tflops_per_gpu is None or r.get("accelerator") == "cpu":
            continue
        g = measured_gpu(
            spec.cluster if spec else None, r.get("accelerator"), gpu or gpu_names.get(r["run_id"])
        )
        if g is not None and g.peak_flops:
            row.log_mfu = row.log_tflops_per_gpu * 1e12 / g.peak_flops
    for rid, vals in extras(others).items():
        by_id[rid].log_extras = {k: v for k, v in vals.items() if k not in _OWN_EXTRAS}


# -- sections: (title, headers, rows, lines), which sections.all_sections makes Sections of


def _extras_text(x: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.4g}" for k, v in sorted(x.items()))


def logged(report: Report) -> tuple | None:
    """The figures the runs' own logs report, beside mimo-jobs' MFU (no section when no log has any)."""
    # the packaged trainer's TFLOP/s/GPU is mimo-jobs' own FLOPs count again: shown for its MoE loss only
    runs = [
        r
        for r in report.runs
        if r.moe_aux_loss is not None
        or (r.program != "packaged trainer" and (r.log_tflops_per_gpu is not None or r.log_extras))
    ]
    if not runs:
        return None
    rows = [
        [r.study, r.name, r.program, fmt.pct(r.mfu), fmt.num(r.log_tflops_per_gpu, 1), fmt.pct(r.log_mfu),
         "-" if r.moe_aux_loss is None else f"{r.moe_aux_loss:.4g}", _extras_text(r.log_extras) or "-"]
        for r in runs
    ]  # fmt: skip
    heads = [
        "study",
        "run",
        "program",
        "MFU",
        "TFLOP/s/GPU (log)",
        "MFU (log)",
        "MoE aux loss",
        "other logged",
    ]
    lines = [
        "MFU: mimo-jobs' FLOPs of the run's model (the model its study or `ingest --model` gives) over the "
        "steady-state median time; TFLOP/s/GPU (log): the median of the figure the run's own log prints, "
        "MFU (log) that figure over the GPU's dense BF16 peak; MoE aux loss and other logged: means over the "
        "steady-state window",
    ]
    mfu_notes = sorted({f"{r.name}: MFU - ({r.mfu_note})" for r in runs if r.mfu is None and r.mfu_note})
    return "Figures the runs' logs report (beside mimo-jobs' MFU)", heads, rows, lines + mfu_notes


def programs(report: Report) -> tuple | None:
    """Each run of its own command against the packaged trainer's runs of the same layout."""
    if not report.program_pairs:
        return None
    rows = [
        [p.study, p.command_run, p.packaged_run, fmt.num(p.nodes), p.layout, fmt.num(p.gbs), fmt.num(p.command_ms),
         fmt.num(p.packaged_ms), "-" if p.time_ratio is None else f"{p.time_ratio:.2f}", p.metric,
         fmt.num(p.command_per_gpu, 1), fmt.num(p.packaged_per_gpu, 1),
         "-" if p.throughput_ratio is None else f"{p.throughput_ratio:.2f}", fmt.pct(p.loss_max_rel_diff),
         p.verdict]
        for p in report.program_pairs
    ]  # fmt: skip
    heads = ["study", "own command", "packaged trainer", "nodes", "layout", "GBS", "t own (ms)",
             "t packaged (ms)", "time own/packaged", "metric", "own /GPU", "packaged /GPU", "throughput own/packaged",
             "loss max rel diff", "verdict"]  # fmt: skip
    return (
        "Own command vs packaged trainer (every pair of the same study, layout and global batch)",
        heads,
        rows,
        [],
    )


def sections(report: Report) -> list[tuple]:
    return [s for s in (logged(report), programs(report)) if s is not None]

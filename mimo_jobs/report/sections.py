"""The comparison sections of a report as rows of text cells, shared by the table and markdown renderings:
layouts of one size, heterogeneous vs colocated, and the measured memory per module and stage. The
figures are computed in compare.py and memory.py; this module only formats them."""

from __future__ import annotations

from dataclasses import dataclass

from . import fmt
from .model import Report

TEXT_HEADS = {"run", "heterogeneous", "colocated", "verdict", "why", "module"}


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
        [r.name, fmt.num(r.nodes), "colocated" if r.colocated else "heterogeneous", fmt.num(r.tokens_per_s_per_gpu, 1),
         f"{r.relative_throughput:.2f}", r.layout_note or ""]
        for r in report.runs
        if r.relative_throughput is not None
    ]  # fmt: skip
    if not rows:
        return None
    heads = ["run", "nodes", "layout", "tokens/s/GPU", "vs best", "why"]
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
        [p.hetero_run, p.colocated_run, fmt.num(p.nodes), fmt.num(p.hetero_ms), fmt.num(p.colocated_ms),
         "-" if p.time_ratio is None else f"{p.time_ratio:.2f}", "-" if p.tokens_ratio is None else f"{p.tokens_ratio:.2f}",
         fmt.pct(p.loss_max_rel_diff), _shares(p.hetero_phases), _shares(p.colocated_phases), p.verdict]
        for p in report.pairs
    ]  # fmt: skip
    heads = ["heterogeneous", "colocated", "nodes", "t het (ms)", "t colo (ms)", "time colo/het",
             "tokens/s/GPU het/colo", "loss max rel diff", "phases het", "phases colo", "verdict"]  # fmt: skip
    lines = [f"unpaired: {u}" for u in report.unpaired]
    return Section("Heterogeneous vs colocated (same study, node count and global batch)", heads, rows, lines)


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


def all_sections(report: Report) -> list[Section]:
    return [s for s in (layouts(report), pairs(report), memory(report)) if s is not None]

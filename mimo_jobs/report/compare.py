"""Runs of one size compared as layouts, and each heterogeneous run against its colocated baseline.

Runs with the same study and node count are layouts of one size, not points of a scaling curve: each gets
its throughput relative to the best layout of that size and, when it trails, the phase that explains most
of the gap (the phase whose share of the step exceeds the best layout's by the most). A heterogeneous run
pairs with every colocated run of the same study, node count and global batch: iteration-time and
tokens/s/GPU ratios, loss parity at equal consumed samples, phase shares side by side and a verdict. A run
of its own command pairs with every packaged-trainer run of the same study, layout and global batch the same
way (program_pairs). Pure: rows in, figures out.
"""

from __future__ import annotations

from collections import defaultdict

from . import figures
from .model import PairRow, ProgramPairRow, RunRow

# Loss curves of two layouts that see the same global batches differ only by floating-point reduction
# order; a larger gap at equal samples is a real difference (the report's parity tolerance).
LOSS_NOISE = figures.PARITY_TOLERANCE


def perf(x: RunRow, carried: bool = True) -> float | None:
    """A run's per-GPU throughput: carried tokens/s (when counted and `carried`), else the batch's slots,
    else samples."""
    if carried and x.tokens_per_s_per_gpu is not None:
        return x.tokens_per_s_per_gpu
    return x.slots_per_s_per_gpu if x.slots_per_s_per_gpu is not None else x.samples_per_s_per_gpu


def all_carried(runs: list[RunRow]) -> bool:
    """Carried tokens compare runs only when every one of them has them counted."""
    return all(x.tokens_per_s_per_gpu is not None for x in runs)


def compare_layouts(rows: list[RunRow]) -> None:
    """Set relative_throughput and layout_note on every run that shares its study and node count with
    another run that has data."""
    groups: dict[tuple, list[RunRow]] = defaultdict(list)
    for x in rows:
        if perf(x) is not None and x.nodes is not None:
            groups[(x.study, x.nodes)].append(x)
    for group in groups.values():
        if len(group) < 2:
            continue
        c = all_carried(group)
        best = max(group, key=lambda x: perf(x, c) or 0.0)
        for x in group:
            x.relative_throughput = perf(x, c) / perf(best, c) if perf(best, c) else None
            x.layout_note = "best layout of this size" if x is best else _why_behind(x, best)


def _why_behind(x: RunRow, best: RunRow) -> str:
    gap = {p: x.phase_share.get(p, 0.0) - best.phase_share.get(p, 0.0) for p in x.phase_share}
    if not gap or max(gap.values()) <= 0:
        return f"{_ratio(x)} of {best.name}"
    p = max(gap, key=gap.get)
    return (
        f"{_ratio(x)} of {best.name}: {p.replace('_', ' ')} {x.phase_share.get(p, 0.0):.0%} of the step "
        f"vs {best.phase_share.get(p, 0.0):.0%}"
    )


def _ratio(x: RunRow) -> str:
    return f"{x.relative_throughput:.2f}x" if x.relative_throughput is not None else "-"


def pair_runs(rows: list[RunRow], curves: dict[str, list]) -> tuple[list[PairRow], list[str]]:
    """Every heterogeneous run with every colocated run of its study, node count and global batch; and the
    runs of a study holding both kinds that found no partner, with why. In each group the pairs against
    the fastest colocated run, and those of the fastest heterogeneous run, carry the group's verdicts."""
    groups: dict[tuple, tuple[list[RunRow], list[RunRow]]] = defaultdict(lambda: ([], []))
    for x in rows:
        groups[(x.study, x.nodes, x.gbs)][1 if x.colocated else 0].append(x)
    kinds: dict[str, set[bool]] = defaultdict(set)
    for x in rows:
        kinds[x.study].add(x.colocated)
    pairs: list[PairRow] = []
    unpaired: list[str] = []
    for (study, nodes, gbs), (het, colo) in groups.items():
        if len(kinds[study]) < 2:
            continue  # a study of one kind pairs nothing, and nothing in it is missing a partner
        if not het or not colo or nodes is None or gbs is None:
            unpaired += [f"{x.study}/{x.name}: {_why_unpaired(x)}" for x in het + colo]
            continue
        best_c, best_h = _fastest(colo), _fastest(het)
        for h in het:
            for c in colo:
                p = _pair(h, c, curves)
                p.best_colocated, p.best_hetero = c is best_c, h is best_h
                pairs.append(p)
    return pairs, unpaired


def _fastest(runs: list[RunRow]) -> RunRow | None:
    """The run with the shortest steady-state iteration time (None when none has one)."""
    timed = [x for x in runs if x.t_median_ms]
    return min(timed, key=lambda x: x.t_median_ms) if timed else None


def _why_unpaired(x: RunRow) -> str:
    if x.nodes is None or x.gbs is None:
        return f"{'node count' if x.nodes is None else 'global batch size'} unknown: cannot be matched"
    other = "heterogeneous" if x.colocated else "colocated"
    return f"no {other} run at {x.nodes} nodes, GBS {x.gbs}"


def group_verdicts(pairs: list[PairRow]) -> list[str]:
    """Per study, node count and global batch: each heterogeneous run against the fastest colocated run,
    then the fastest heterogeneous run against each other colocated run."""
    out = []
    for p in pairs:
        if p.best_colocated:
            out.append(f"{p.study}, {p.nodes} nodes, GBS {p.gbs}, vs the fastest colocated: {p.verdict}")
    for p in pairs:
        if p.best_hetero and not p.best_colocated:
            out.append(f"{p.study}, {p.nodes} nodes, GBS {p.gbs}, fastest heterogeneous: {p.verdict}")
    return out


def _pair(h: RunRow, c: RunRow, curves: dict[str, list]) -> PairRow:
    time_ratio = c.t_median_ms / h.t_median_ms if h.t_median_ms and c.t_median_ms else None
    carried = all_carried([h, c])
    ph, pc = perf(h, carried), perf(c, carried)
    tokens_ratio = ph / pc if ph is not None and pc else None
    loss = None
    if curves.get(h.run_id) and curves.get(c.run_id):
        pts = figures.parity_points([curves[h.run_id], curves[c.run_id]])
        loss = figures.loss_parity(curves[h.run_id], curves[c.run_id], pts).max_rel_diff
    row = PairRow(
        study=h.study,
        nodes=h.nodes,
        gbs=h.gbs,
        hetero_run=h.name,
        colocated_run=c.name,
        hetero_ms=h.t_median_ms,
        colocated_ms=c.t_median_ms,
        time_ratio=time_ratio,
        tokens_ratio=tokens_ratio,
        loss_max_rel_diff=loss,
        hetero_phases=dict(h.phase_share),
        colocated_phases=dict(c.phase_share),
    )
    row.verdict = verdict(row)
    return row


def verdict(p: PairRow) -> str:
    """One line: which layout is faster by how much, and whether the loss is the same within the noise."""
    speed = _speed(
        p.time_ratio,
        f"heterogeneous {p.hetero_run}",
        f"colocated {p.colocated_run}",
    )
    if p.loss_max_rel_diff is not None and p.loss_max_rel_diff > LOSS_NOISE:
        loss = (
            f"loss differs by up to {p.loss_max_rel_diff:.1%} at equal samples (more than {LOSS_NOISE:.0%})"
        )
    else:
        loss = _loss_agrees(p.loss_max_rel_diff) + (
            f" (max {p.loss_max_rel_diff:.2%})" if p.loss_max_rel_diff is not None else ""
        )
    return f"{speed}; {loss}"


def _speed(ratio: float | None, first: str, second: str) -> str:
    """`ratio` = second's time / first's: which of the two is faster, by how much."""
    if ratio is None:
        return "no steady-state iteration time to compare"
    if ratio >= 1:
        return f"{first} is {ratio:.2f}x faster than {second}"
    return f"{second} is {1 / ratio:.2f}x faster than {first}"


def _loss_agrees(diff: float | None) -> str:
    if diff is None:
        return "loss not comparable (no common samples)"
    return f"loss equal within {LOSS_NOISE:.0%} at equal samples"


def program_pairs(rows: list[RunRow], curves: dict[str, list]) -> list[ProgramPairRow]:
    """Every run of its own command with every packaged-trainer run of its study at the same layout (node
    count, encoder/LLM sizes, colocated or not) and global batch: iteration time, per-GPU throughput (carried
    tokens when both counted them, else the batch's slots) and loss at equal consumed samples."""
    groups: dict[tuple, tuple[list[RunRow], list[RunRow]]] = defaultdict(lambda: ([], []))
    for x in rows:
        if x.layout != "-" and x.nodes is not None and x.gbs is not None:
            groups[(x.study, x.nodes, x.layout, x.colocated, x.gbs)][x.program == "own command"].append(x)
    out = []
    for kinds in groups.values():
        packaged = [x for x in kinds[0] if x.program == "packaged trainer"]
        out += [_program_pair(p, c, curves) for c in kinds[1] for p in packaged]
    return out


def _program_pair(p: RunRow, c: RunRow, curves: dict[str, list]) -> ProgramPairRow:
    carried = all_carried([p, c])
    pp, pc = perf(p, carried), perf(c, carried)
    loss = None
    if curves.get(p.run_id) and curves.get(c.run_id):
        pts = figures.parity_points([curves[p.run_id], curves[c.run_id]])
        loss = figures.loss_parity(curves[c.run_id], curves[p.run_id], pts).max_rel_diff
    row = ProgramPairRow(
        study=p.study,
        nodes=p.nodes,
        layout=p.layout,
        gbs=p.gbs,
        packaged_run=p.name,
        command_run=c.name,
        packaged_ms=p.t_median_ms,
        command_ms=c.t_median_ms,
        time_ratio=c.t_median_ms / p.t_median_ms if c.t_median_ms and p.t_median_ms else None,
        metric="tokens/s/GPU" if carried else "slots/s/GPU",
        packaged_per_gpu=pp,
        command_per_gpu=pc,
        throughput_ratio=pc / pp if pc is not None and pp else None,
        loss_max_rel_diff=loss,
    )
    row.verdict = program_verdict(row)
    return row


def program_verdict(p: ProgramPairRow) -> str:
    """One line: which program is faster at this layout, and whether the loss agrees within the noise."""
    speed = _speed(p.time_ratio, "the packaged trainer", p.command_run)
    if p.loss_max_rel_diff is not None and p.loss_max_rel_diff > LOSS_NOISE:
        # two programs need not build the same model or data: a gap says so, it is not a parity failure
        loss = f"loss differs by up to {p.loss_max_rel_diff:.1%} at equal samples (other model or data?)"
    else:
        loss = _loss_agrees(p.loss_max_rel_diff)
    return f"{speed}; {loss}"

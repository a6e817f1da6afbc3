"""Self-contained HTML report: tables plus inline-SVG plots (iteration time and per-GPU throughput vs nodes
with the ideal line, loss curves overlaid, phase breakdown). No scripts, no network: opens offline."""

from __future__ import annotations

from . import fmt, sections, svg
from .model import Report, RunRow, StudyInfo


def _by_nodes(rows: list[RunRow], val) -> list[tuple[float, float]]:
    groups: dict[int, list[float]] = {}
    for r in rows:
        v = val(r)
        if r.nodes is not None and v is not None:
            groups.setdefault(r.nodes, []).append(v)
    out = []
    for n in sorted(groups):
        vs = sorted(groups[n])
        out.append(
            (float(n), vs[len(vs) // 2] if len(vs) % 2 else (vs[len(vs) // 2 - 1] + vs[len(vs) // 2]) / 2)
        )
    return out


def _bars(rows: list[RunRow], val, title: str, ylabel: str, chart_id: str) -> str:
    """One bar per run (layouts of one size, or the runs of the heterogeneous/colocated pairs)."""
    rows = [r for r in rows if val(r) is not None]
    return svg.stacked_bars(
        [r.name for r in rows], {ylabel: [val(r) for r in rows]}, title, ylabel, chart_id=chart_id
    )


def _one_size(report: Report) -> bool:
    return bool(report.studies) and all(s.sizes <= 1 for s in report.studies)


def layout_charts(report: Report) -> dict[str, str]:
    """Runs of one node count are layouts, not points of a curve: a bar per run instead of lines vs nodes."""
    metric = report.studies[0].metric if report.studies else "tokens/s/GPU"
    rows = [r for r in report.runs if r.t_median_ms is not None]
    return {
        "iteration-time": _bars(
            rows, lambda r: r.t_median_ms, "Iteration time per layout (steady-state median)", "ms per iteration",
            "chart-iteration-time",
        ),
        "throughput": _bars(
            rows, lambda r: fmt.per_gpu(r, metric),
            f"Per-GPU throughput per layout ({metric}, all GPUs)", metric, "chart-throughput",
        ),
    }  # fmt: skip


def pair_charts(report: Report) -> list[str]:
    """Side by side, each heterogeneous run and its colocated baseline: iteration time and tokens/s/GPU."""
    if not report.pairs:
        return []
    keys = []
    for p in report.pairs:
        keys += [k for k in ((p.study, p.hetero_run), (p.study, p.colocated_run)) if k not in keys]
    rows = [r for k in keys for r in report.runs if (r.study, r.name) == k]
    metric = fmt.metric_of([r for r in rows if r.t_median_ms is not None])
    return [
        _bars(rows, lambda r: r.t_median_ms, "Heterogeneous vs colocated: iteration time", "ms per iteration",
              "chart-pair-time"),
        _bars(rows, lambda r: fmt.per_gpu(r, metric), f"Heterogeneous vs colocated: {metric}",
              metric, "chart-pair-throughput"),
    ]  # fmt: skip


def module_chart(report: Report) -> str:
    """Stacked bars of each module's step (modules.py): busy, waiting, optimizer and untimed ms."""
    mods = report.modules
    many = len({m.study for m in mods}) > 1
    labels = [(f"{m.study}/" if many else "") + f"{m.name} {m.module}" for m in mods]
    return svg.stacked_bars(
        labels,
        {
            "busy": [m.busy_ms for m in mods],
            "wait": [m.wait_ms for m in mods],
            "optimizer": [m.optimizer_ms for m in mods],
            "untimed": [max(0.0, m.untimed_ms) for m in mods],
        },
        "Each module's step (mean ms per iteration, own timers)",
        "ms",
        chart_id="chart-modules",
    )


def charts(report: Report) -> dict[str, str]:
    """The report's four plots as inline SVG: iteration time, per-GPU throughput, loss and phases."""
    if _one_size(report):
        return {**layout_charts(report), "loss": _loss_chart(report), "phases": _phase_chart(report)}
    t_series, p_series, ticks = _scaling_series(report)
    metric = report.studies[0].metric if report.studies else "tokens/s/GPU"
    return {
        "iteration-time": svg.line_chart(
            t_series,
            "Iteration time vs nodes (steady-state median)",
            "nodes",
            "ms per iteration",
            x_ticks=ticks,
            y_zero=True,
            chart_id="chart-iteration-time",
        ),
        "throughput": svg.line_chart(
            p_series,
            f"Per-GPU throughput vs nodes ({metric}, all GPUs)",
            "nodes",
            metric,
            x_ticks=ticks,
            y_zero=True,
            chart_id="chart-throughput",
        ),
        "loss": _loss_chart(report),
        "phases": _phase_chart(report),
    }


def _loss_chart(report: Report) -> str:
    return svg.line_chart(
        _loss_series(report), "Loss vs consumed samples", "consumed samples", "loss", chart_id="chart-loss"
    )


def _scaling_series(report: Report) -> tuple[list[svg.Series], list[svg.Series], list[float] | None]:
    """Per study, against nodes: the iteration time and the per-GPU throughput, each followed by its ideal
    line; and the node counts to tick."""
    t_series: list[svg.Series] = []
    p_series: list[svg.Series] = []
    node_ticks: set[float] = set()
    for i, s in enumerate(report.studies):
        rows = [r for r in report.runs if r.study == s.name and r.t_median_ms is not None]
        color = svg.PALETTE[i % len(svg.PALETTE)]
        t_pts = _by_nodes(rows, lambda r: r.t_median_ms)
        p_pts = _by_nodes(rows, lambda r, m=s.metric: fmt.per_gpu(r, m))
        node_ticks |= {x for x, _ in t_pts}
        label = s.name if len(report.studies) > 1 else "measured"
        t_series += [svg.Series(label, t_pts, color), *_ideal_time(s, t_pts)]
        p_series += [svg.Series(label, p_pts, color), *_ideal_throughput(s, p_pts)]
    return t_series, p_series, sorted(node_ticks) or None


def _ideal_time(s: StudyInfo, t_pts: list[tuple[float, float]]) -> list[svg.Series]:
    """The ideal iteration time from the baseline's: N0/N of it (strong scaling) or flat (weak scaling)."""
    n0 = s.baseline_nodes
    t0 = dict(t_pts).get(float(n0)) if n0 is not None else None
    if t0 is None or not t_pts:
        return []
    ideal = [(x, t0 * n0 / x if s.scaling == "strong" else t0) for x, _ in t_pts]
    return [svg.Series(f"ideal ({s.scaling})", ideal, svg.IDEAL, dashed=True, markers=False)]


def _ideal_throughput(s: StudyInfo, p_pts: list[tuple[float, float]]) -> list[svg.Series]:
    """The ideal per-GPU throughput: the baseline's at every node count (E = 1)."""
    n0 = s.baseline_nodes
    p0 = dict(p_pts).get(float(n0)) if n0 is not None else None
    if p0 is None or not p_pts:
        return []
    return [svg.Series("ideal (E=1)", [(x, p0) for x, _ in p_pts], svg.IDEAL, dashed=True, markers=False)]


def _loss_series(report: Report) -> list[svg.Series]:
    """Each run's loss curve (markers only on short ones), coloured by its place in the run list."""
    out = []
    for j, r in enumerate(report.runs):
        c = report.curves.get(r.run_id)
        if c:
            out.append(
                svg.Series(
                    f"{r.nodes}n {r.name}" if r.nodes else r.name,
                    c,
                    svg.PALETTE[j % len(svg.PALETTE)],
                    markers=len(c) <= 30,
                )
            )
    return out


def _phase_chart(report: Report) -> str:
    """Stacked bars of each run's mean phase times over the steady-state window."""
    phases = fmt.phase_names(report)
    rows = [r for r in report.runs if r.phase_ms]
    return svg.stacked_bars(
        [r.name for r in rows],
        {p: [r.phase_ms.get(p, 0.0) for r in rows] for p in phases},
        "Phase breakdown (mean ms per iteration, steady state)",
        "ms",
        chart_id="chart-phases",
    )


def _table(headers: list[str], rows: list[list[str]], cls: str = "") -> str:
    h = "".join(f"<th>{fmt.html_text(x)}</th>" for x in headers)
    body = "".join(
        "<tr"
        + (f' class="{c}"' if c else "")
        + ">"
        + "".join(f"<td>{fmt.html_text(x)}</td>" for x in cells)
        + "</tr>"
        for cells, c in rows
    )
    return f'<table class="{cls}"><thead><tr>{h}</tr></thead><tbody>{body}</tbody></table>'


CSS = """body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:18px;color:#222;background:#fff}
h1{font-size:20px;margin:0 0 6px}h2{font-size:16px;margin:22px 0 8px}
.grid{display:grid;grid-template-columns:repeat(2,560px);gap:14px}
table{border-collapse:collapse;font-size:12px}th,td{border:1px solid #ccc;padding:3px 6px;text-align:right}
th{background:#f3f3f3}td:nth-child(1),td:nth-child(2),td:last-child{text-align:left}
tr.bad td{background:#fde8e8}tr.warn td{background:#fff6dd}.note{font-size:12px;color:#555}"""


def render_html(report: Report) -> str:
    """The whole report as one page: the study list, the four plots, then the tables."""
    c = charts(report)
    parts = [
        *_head(report),
        '<div class="grid">',
        c["iteration-time"],
        c["throughput"],
        c["loss"],
        c["phases"],
        "</div>",
        *_runs_section(report),
        *_phase_section(report),
        *_comparison_sections(report),
        *_parity_section(report),
        *_triage_section(report),
        "</body></html>\n",
    ]
    return "\n".join(parts)


def _head(report: Report) -> list[str]:
    """The document's head, the title with the generation time and the list of studies."""
    # the text report's line: a single-node study is layouts of one size, with no scaling efficiency
    studies = "".join(
        f"<li><b>{fmt.html_text(s.name)}</b>{fmt.html_text(fmt.study_line(s))}</li>" for s in report.studies
    )
    return [
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>mimo-jobs scaling report</title>',
        f"<style>{CSS}</style></head><body>",
        f'<h1>Scaling report</h1><div class="note">generated {report.generated_at:%Y-%m-%d %H:%M} UTC</div>',
        f"<ul>{studies}</ul>",
    ]


def _runs_section(report: Report) -> list[str]:
    """The runs table (rows shaded by state) and the notes under it."""
    ids = fmt.names_repeat(report.runs)
    run_rows = [
        (
            fmt.run_cells(r, ids),
            "" if r.state == "COMPLETED" else ("warn" if r.state in ("RUNNING", "NO DATA") else "bad"),
        )
        for r in report.runs
    ]
    return [
        "<h2>Runs</h2>",
        _table(fmt.run_headers(ids), run_rows, "runs"),
        "".join(
            f'<div class="note">{"*" if n.startswith("per-GPU") else ""} {fmt.html_text(n)}</div>'
            for n in report.notes
        ),
    ]


def _phase_section(report: Report) -> list[str]:
    """Each run's share of the phase time per phase (nothing when no run has phases)."""
    names = fmt.phase_names(report)
    if not names:
        return []
    rows = [(row, "") for row in fmt.phase_rows(report, names)]
    return ["<h2>Phase time shares</h2>", _table(["study", "run", *names], rows)]


def _comparison_sections(report: Report) -> list[str]:
    """Layouts of one size, heterogeneous vs colocated (with its side-by-side bars), measured memory."""
    out = []
    for sec in sections.all_sections(report):
        out += [f"<h2>{fmt.html_text(sec.title)}</h2>", _table(sec.headers, [(r, "") for r in sec.rows])]
        out += [f'<p class="note">{fmt.html_text(x)}</p>' for x in sec.lines]
        if sec.title.startswith("Heterogeneous vs colocated"):
            out += ['<div class="grid">', *pair_charts(report), "</div>"]
        if sec.title.startswith("Module phases"):
            out += ['<div class="grid">', module_chart(report), "</div>"]
    return out


def _parity_section(report: Report) -> list[str]:
    """Loss parity against the baseline run (nothing when there is none)."""
    if not report.parity:
        return []
    return [
        "<h2>Loss parity at equal consumed samples</h2>",
        _table(
            ["run", "nodes", "samples", "loss", "baseline", "max rel diff"],
            [(fmt.parity_cells(p, abs_diff=False), "") for p in report.parity],
        ),
    ]


def _triage_section(report: Report) -> list[str]:
    """Why each failed or hung run stopped (nothing when none did)."""
    if not report.triage:
        return []
    rows = [
        (
            [x.name, x.job_id or "-", x.state, "-" if x.rank is None else str(x.rank), x.reason, x.evidence],
            "bad",
        )
        for x in report.triage
    ]
    return ["<h2>Failure triage</h2>", _table(["run", "job", "state", "rank", "why", "evidence"], rows)]

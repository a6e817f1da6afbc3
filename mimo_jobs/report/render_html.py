"""Self-contained HTML report: tables plus inline-SVG plots (iteration time and per-GPU throughput vs nodes
with the ideal line, loss curves overlaid, phase breakdown). No scripts, no network: opens offline."""

from __future__ import annotations

from html import escape

from . import fmt
from . import svg
from .model import Report, RunRow


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


def charts(report: Report) -> dict[str, str]:
    t_series: list[svg.Series] = []
    p_series: list[svg.Series] = []
    node_ticks: set[float] = set()
    for i, s in enumerate(report.studies):
        rows = [r for r in report.runs if r.study == s.name and r.t_median_ms is not None]
        color = svg.PALETTE[i % len(svg.PALETTE)]
        use_tok = s.metric.startswith("tokens")
        t_pts = _by_nodes(rows, lambda r: r.t_median_ms)
        p_pts = _by_nodes(rows, lambda r, use_tok=use_tok: r.tokens_per_s_per_gpu if use_tok else r.samples_per_s_per_gpu)
        node_ticks |= {x for x, _ in t_pts}
        label = s.name if len(report.studies) > 1 else "measured"
        t_series.append(svg.Series(label, t_pts, color))
        p_series.append(svg.Series(label, p_pts, color))
        n0 = s.baseline_nodes
        t0 = dict(t_pts).get(float(n0)) if n0 is not None else None
        p0 = dict(p_pts).get(float(n0)) if n0 is not None else None
        if t0 is not None and t_pts:
            # Strong scaling: ideal time falls as N0/N; weak scaling: it stays flat.
            ideal = [(x, t0 * n0 / x if s.scaling == "strong" else t0) for x, _ in t_pts]
            t_series.append(svg.Series(f"ideal ({s.scaling})", ideal, svg.IDEAL, dashed=True, markers=False))
        if p0 is not None and p_pts:
            p_series.append(
                svg.Series("ideal (E=1)", [(x, p0) for x, _ in p_pts], svg.IDEAL, dashed=True, markers=False)
            )
    metric = report.studies[0].metric if report.studies else "tokens/s/GPU"
    ticks = sorted(node_ticks) or None
    out = {
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
    }
    loss_series = []
    for j, r in enumerate(report.runs):
        c = report.curves.get(r.run_id)
        if c:
            loss_series.append(
                svg.Series(
                    f"{r.nodes}n {r.name}" if r.nodes else r.name,
                    c,
                    svg.PALETTE[j % len(svg.PALETTE)],
                    markers=len(c) <= 30,
                )
            )
    out["loss"] = svg.line_chart(
        loss_series, "Loss vs consumed samples", "consumed samples", "loss", chart_id="chart-loss"
    )
    phases = fmt.phase_names(report)
    rows = [r for r in report.runs if r.phase_ms]
    out["phases"] = svg.stacked_bars(
        [r.name for r in rows],
        {p: [r.phase_ms.get(p, 0.0) for r in rows] for p in phases},
        "Phase breakdown (mean ms per iteration, steady state)",
        "ms",
        chart_id="chart-phases",
    )
    return out


def _table(headers: list[str], rows: list[list[str]], cls: str = "") -> str:
    h = "".join(f"<th>{escape(x)}</th>" for x in headers)
    body = "".join(
        "<tr"
        + (f' class="{c}"' if c else "")
        + ">"
        + "".join(f"<td>{escape(x)}</td>" for x in cells)
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
    c = charts(report)
    studies = "".join(
        f"<li><b>{escape(s.name)}</b>: {escape(s.scaling)} scaling, baseline N0 = "
        f"{escape(str(s.baseline_nodes))} nodes, P(N) = {escape(s.metric)}, E(N) = P(N)/P(N0)</li>"
        for s in report.studies
    )
    run_rows = [
        (
            fmt.run_cells(r),
            "" if r.state == "COMPLETED" else ("warn" if r.state in ("RUNNING", "NO DATA") else "bad"),
        )
        for r in report.runs
    ]
    parts = [
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>mimo-jobs scaling report</title>',
        f"<style>{CSS}</style></head><body>",
        f'<h1>Scaling report</h1><div class="note">generated {report.generated_at:%Y-%m-%d %H:%M} UTC</div>',
        f"<ul>{studies}</ul>",
        '<div class="grid">',
        c["iteration-time"],
        c["throughput"],
        c["loss"],
        c["phases"],
        "</div>",
        "<h2>Runs</h2>",
        _table(fmt.RUN_HEADERS, run_rows, "runs"),
        "".join(
            f'<div class="note">{"*" if n.startswith("per-GPU") else ""} {escape(n)}</div>'
            for n in report.notes
        ),
    ]
    names = fmt.phase_names(report)
    if names:
        parts += [
            "<h2>Phase time shares</h2>",
            _table(
                ["run", *names],
                [
                    ([r.name, *[fmt.pct(r.phase_share.get(p)) for p in names]], "")
                    for r in report.runs
                    if r.phase_share
                ],
            ),
        ]
    if report.parity:
        parts += [
            "<h2>Loss parity at equal consumed samples</h2>",
            _table(
                ["run", "nodes", "samples", "loss", "baseline", "max rel diff"],
                [(fmt.parity_cells(p, abs_diff=False), "") for p in report.parity],
            ),
        ]
    if report.triage:
        parts += [
            "<h2>Failure triage</h2>",
            _table(
                ["run", "job", "state", "rank", "why", "evidence"],
                [
                    (
                        [
                            x.name,
                            x.job_id or "-",
                            x.state,
                            "-" if x.rank is None else str(x.rank),
                            x.reason,
                            x.evidence,
                        ],
                        "bad",
                    )
                    for x in report.triage
                ],
            ),
        ]
    parts.append("</body></html>\n")
    return "\n".join(parts)

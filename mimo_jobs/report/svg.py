"""Minimal inline-SVG charts (no plotting dependency; the HTML report stays a single offline file)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from html import escape

PALETTE = [
    "#1f77b4",
    "#d62728",
    "#2ca02c",
    "#9467bd",
    "#ff7f0e",
    "#8c564b",
    "#e377c2",
    "#17becf",
    "#bcbd22",
    "#7f7f7f",
]
IDEAL = "#b8860b"  # dashed ideal lines: a hue no text or table uses (greys would mix with anti-aliased text)


@dataclass
class Series:
    name: str
    points: list[tuple[float, float]]
    color: str
    dashed: bool = False
    markers: bool = True


@dataclass
class _Axis:
    lo: float
    hi: float
    log: bool = False
    ticks: list[float] = field(default_factory=list)



def _open(width: int, height: int, title: str, chart_id: str) -> list[str]:
    """The opening of every chart: the <svg> element, a white background and the title."""
    return [
        f'<svg xmlns="http://www.w3.org/2000/svg" id="{escape(chart_id)}" class="chart" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)}">',
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="#ffffff"/>',
        f'<text x="{width / 2}" y="20" text-anchor="middle" font-size="14" font-weight="bold">{escape(title)}</text>',
    ]

def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = min((m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw), default=10 * mag)
    start = math.floor(lo / step) * step
    out = []
    v = start
    while v <= hi + step * 1e-9:
        if v >= lo - step * 1e-9:
            out.append(round(v, 12))
        v += step
    return out


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    a = abs(v)
    if a >= 1e6 or a < 1e-3:
        return f"{v:.2g}"
    if a >= 100:
        return f"{v:,.0f}"
    return f"{v:.3g}"


def line_chart(
    series: list[Series],
    title: str,
    xlabel: str,
    ylabel: str,
    width: int = 560,
    height: int = 340,
    x_ticks: list[float] | None = None,
    y_zero: bool = False,
    chart_id: str = "",
) -> str:
    pts = [p for s in series for p in s.points if p[1] is not None and math.isfinite(p[1])]
    ml, mr, mt, mb = 70, 20, 34, 48
    pw, ph = width - ml - mr, height - mt - mb
    parts = _open(width, height, title, chart_id)
    if not pts:
        parts.append(
            f'<text x="{width / 2}" y="{height / 2}" text-anchor="middle" fill="#666">no data</text></svg>'
        )
        return "".join(parts)
    xs = [p[0] for p in pts]
    ys = [p[1] for p in pts]
    x0, x1 = min(xs), max(xs)
    if x0 == x1:
        x0, x1 = x0 - 1, x1 + 1
    y0, y1 = (0.0 if y_zero else min(ys)), max(ys)
    if y0 == y1:
        y0, y1 = y0 - abs(y0) * 0.1 - 1e-9, y1 + abs(y1) * 0.1 + 1e-9
    pad = (y1 - y0) * 0.05
    y0, y1 = (y0 if y_zero else y0 - pad), y1 + pad
    xt = x_ticks or nice_ticks(x0, x1)
    yt = nice_ticks(y0, y1)

    def sx(x: float) -> float:
        return ml + (x - x0) / (x1 - x0) * pw

    def sy(y: float) -> float:
        return mt + ph - (y - y0) / (y1 - y0) * ph

    parts.append(
        f'<rect x="{ml}" y="{mt}" width="{pw}" height="{ph}" fill="none" stroke="#333" stroke-width="1"/>'
    )
    for t in yt:
        if y0 <= t <= y1:
            parts.append(
                f'<line x1="{ml}" x2="{ml + pw}" y1="{sy(t):.1f}" y2="{sy(t):.1f}" stroke="#e5e5e5"/>'
                f'<text x="{ml - 6}" y="{sy(t) + 4:.1f}" text-anchor="end" font-size="11">{_fmt(t)}</text>'
            )
    for t in xt:
        if x0 <= t <= x1:
            parts.append(
                f'<line x1="{sx(t):.1f}" x2="{sx(t):.1f}" y1="{mt + ph}" y2="{mt + ph + 5}" stroke="#333"/>'
                f'<text x="{sx(t):.1f}" y="{mt + ph + 18}" text-anchor="middle" font-size="11">{_fmt(t)}</text>'
            )
    parts.append(
        f'<text x="{ml + pw / 2}" y="{height - 8}" text-anchor="middle" font-size="12">{escape(xlabel)}</text>'
    )
    parts.append(
        f'<text transform="translate(14,{mt + ph / 2}) rotate(-90)" text-anchor="middle" '
        f'font-size="12">{escape(ylabel)}</text>'
    )
    for s in series:
        good = [(x, y) for x, y in s.points if y is not None and math.isfinite(y)]
        if not good:
            continue
        d = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in good)
        dash = ' stroke-dasharray="6,4"' if s.dashed else ""
        parts.append(
            f'<polyline class="series" data-name="{escape(s.name)}" points="{d}" fill="none" '
            f'stroke="{s.color}" stroke-width="3"{dash}/>'
        )
        if s.markers:
            parts += [
                f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="4.5" fill="{s.color}"/>' for x, y in good
            ]
    ly = mt + 8
    for s in series:
        dash = ' stroke-dasharray="6,4"' if s.dashed else ""
        parts.append(
            f'<line x1="{ml + pw - 150}" x2="{ml + pw - 126}" y1="{ly}" y2="{ly}" stroke="{s.color}" '
            f'stroke-width="3"{dash}/><text x="{ml + pw - 120}" y="{ly + 4}" font-size="11">'
            f"{escape(s.name[:22])}</text>"
        )
        ly += 15
    parts.append("</svg>")
    return "".join(parts)


def stacked_bars(
    categories: list[str],
    stacks: dict[str, list[float]],
    title: str,
    ylabel: str,
    width: int = 560,
    height: int = 340,
    chart_id: str = "",
) -> str:
    ml, mr, mt, mb = 70, 130, 34, 70
    pw, ph = width - ml - mr, height - mt - mb
    parts = _open(width, height, title, chart_id)
    totals = [sum(v[i] for v in stacks.values()) for i in range(len(categories))]
    if not categories or not any(totals):
        parts.append(
            f'<text x="{width / 2}" y="{height / 2}" text-anchor="middle" fill="#666">no phase data</text></svg>'
        )
        return "".join(parts)
    top = max(totals) * 1.05
    yt = nice_ticks(0, top)
    parts.append(f'<rect x="{ml}" y="{mt}" width="{pw}" height="{ph}" fill="none" stroke="#333"/>')
    for t in yt:
        if t <= top:
            y = mt + ph - t / top * ph
            parts.append(
                f'<line x1="{ml}" x2="{ml + pw}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e5e5e5"/>'
                f'<text x="{ml - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="11">{_fmt(t)}</text>'
            )
    bw = pw / len(categories)
    for i, cat in enumerate(categories):
        base = 0.0
        for j, (name, vals) in enumerate(stacks.items()):
            v = vals[i]
            if v <= 0:
                continue
            y = mt + ph - (base + v) / top * ph
            h = v / top * ph
            parts.append(
                f'<rect x="{ml + i * bw + bw * 0.15:.1f}" y="{y:.1f}" width="{bw * 0.7:.1f}" '
                f'height="{h:.1f}" fill="{PALETTE[j % len(PALETTE)]}"><title>{escape(cat)} {escape(name)}: '
                f"{v:.1f}</title></rect>"
            )
            base += v
        cx = ml + i * bw + bw / 2
        parts.append(
            f'<text transform="translate({cx:.1f},{mt + ph + 12}) rotate(30)" font-size="10">'
            f"{escape(cat[:18])}</text>"
        )
    parts.append(
        f'<text transform="translate(14,{mt + ph / 2}) rotate(-90)" text-anchor="middle" '
        f'font-size="12">{escape(ylabel)}</text>'
    )
    ly = mt + 8
    for j, name in enumerate(stacks):
        parts.append(
            f'<rect x="{ml + pw + 10}" y="{ly - 8}" width="12" height="12" fill="{PALETTE[j % len(PALETTE)]}"/>'
            f'<text x="{ml + pw + 26}" y="{ly + 2}" font-size="11">{escape(name)}</text>'
        )
        ly += 16
    parts.append("</svg>")
    return "".join(parts)

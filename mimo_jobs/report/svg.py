"""Minimal inline-SVG charts (no plotting dependency; the HTML report stays a single offline file)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from .fmt import html_text

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


@dataclass(frozen=True)
class _Frame:
    """A chart's plot area in pixels (left, top, width, height) and the data range it shows."""

    left: int
    top: int
    width: int
    height: int
    x0: float = 0.0
    x1: float = 1.0
    y0: float = 0.0
    y1: float = 1.0

    def sx(self, x: float) -> float:
        return self.left + (x - self.x0) / (self.x1 - self.x0) * self.width

    def sy(self, y: float) -> float:
        return self.top + self.height - (y - self.y0) / (self.y1 - self.y0) * self.height


def _open(width: int, height: int, title: str, chart_id: str) -> list[str]:
    """The opening of every chart: the <svg> element, a white background and the title."""
    return [
        (
            f'<svg xmlns="http://www.w3.org/2000/svg" id="{html_text(chart_id)}" class="chart" width="{width}" '
            f'height="{height}" viewBox="0 0 {width} {height}" role="img" aria-label="{html_text(title)}">'
        ),
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="#ffffff"/>',
        (
            f'<text x="{width / 2}" y="20" text-anchor="middle" font-size="14" font-weight="bold">'
            f"{html_text(title)}</text>"
        ),
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
    """Lines (and markers) of `series` on shared axes, with a legend; points whose y is None or not finite
    are left out. `y_zero`: the y axis starts at 0."""
    pts = [p for s in series for p in s.points if _finite(p[1])]
    parts = _open(width, height, title, chart_id)
    if not pts:
        return _no_data(parts, width, height, "no data")
    f = _Frame(70, 34, width - 90, height - 82, *_data_range(pts, y_zero))
    parts.append(_plot_box(f, ' stroke-width="1"'))
    parts += _y_grid(f, nice_ticks(f.y0, f.y1))
    parts += _x_ticks(f, x_ticks or nice_ticks(f.x0, f.x1))
    parts.append(
        f'<text x="{f.left + f.width / 2}" y="{height - 8}" text-anchor="middle" font-size="12">'
        f"{html_text(xlabel)}</text>"
    )
    parts.append(_y_label(f, ylabel))
    for s in series:
        parts += _line(f, s)
    parts += _line_legend(f, series)
    parts.append("</svg>")
    return "".join(parts)


def _finite(y: float | None) -> bool:
    return y is not None and math.isfinite(y)


def _no_data(parts: list[str], width: int, height: int, text: str) -> str:
    """An empty chart that says `text` in its middle."""
    parts.append(
        f'<text x="{width / 2}" y="{height / 2}" text-anchor="middle" fill="#666">{text}</text></svg>'
    )
    return "".join(parts)


def _data_range(pts: list[tuple[float, float]], y_zero: bool) -> tuple[float, float, float, float]:
    """(x0, x1, y0, y1) a line chart shows: the points' range, never empty, y padded by 5%."""
    xs = [p[0] for p in pts]
    ys = [p[1] for p in pts]
    x0, x1 = min(xs), max(xs)
    if x0 == x1:
        x0, x1 = x0 - 1, x1 + 1
    y0, y1 = (0.0 if y_zero else min(ys)), max(ys)
    if y0 == y1:
        y0, y1 = y0 - abs(y0) * 0.1 - 1e-9, y1 + abs(y1) * 0.1 + 1e-9
    pad = (y1 - y0) * 0.05
    return x0, x1, (y0 if y_zero else y0 - pad), y1 + pad


def _plot_box(f: _Frame, extra: str = "") -> str:
    return (
        f'<rect x="{f.left}" y="{f.top}" width="{f.width}" height="{f.height}" fill="none" stroke="#333"'
        f"{extra}/>"
    )


def _y_grid(f: _Frame, ticks: list[float]) -> list[str]:
    """A horizontal grid line and a label at each y tick inside the frame."""
    right = f.left + f.width
    return [
        f'<line x1="{f.left}" x2="{right}" y1="{f.sy(t):.1f}" y2="{f.sy(t):.1f}" stroke="#e5e5e5"/>'
        f'<text x="{f.left - 6}" y="{f.sy(t) + 4:.1f}" text-anchor="end" font-size="11">{_fmt(t)}</text>'
        for t in ticks
        if f.y0 <= t <= f.y1
    ]


def _x_ticks(f: _Frame, ticks: list[float]) -> list[str]:
    """A tick mark under the frame and a label at each x tick inside it."""
    bottom = f.top + f.height
    return [
        f'<line x1="{f.sx(t):.1f}" x2="{f.sx(t):.1f}" y1="{bottom}" y2="{bottom + 5}" stroke="#333"/>'
        f'<text x="{f.sx(t):.1f}" y="{bottom + 18}" text-anchor="middle" font-size="11">{_fmt(t)}</text>'
        for t in ticks
        if f.x0 <= t <= f.x1
    ]


def _y_label(f: _Frame, label: str) -> str:
    return (
        f'<text transform="translate(14,{f.top + f.height / 2}) rotate(-90)" text-anchor="middle" '
        f'font-size="12">{html_text(label)}</text>'
    )


def _dash(s: Series) -> str:
    return ' stroke-dasharray="6,4"' if s.dashed else ""


def _line(f: _Frame, s: Series) -> list[str]:
    """One series: its polyline and (with `markers`) a dot at each point; nothing without a finite point."""
    good = [(x, y) for x, y in s.points if _finite(y)]
    if not good:
        return []
    d = " ".join(f"{f.sx(x):.1f},{f.sy(y):.1f}" for x, y in good)
    polyline = (
        f'<polyline class="series" data-name="{html_text(s.name)}" points="{d}" fill="none" '
        f'stroke="{s.color}" stroke-width="3"{_dash(s)}/>'
    )
    out = [polyline]
    if s.markers:
        out += [f'<circle cx="{f.sx(x):.1f}" cy="{f.sy(y):.1f}" r="4.5" fill="{s.color}"/>' for x, y in good]
    return out


def _line_legend(f: _Frame, series: list[Series]) -> list[str]:
    """A legend in the frame's top right corner: each series' line style and (shortened) name."""
    right = f.left + f.width
    out = []
    for k, s in enumerate(series):
        ly = f.top + 8 + 15 * k
        out.append(
            f'<line x1="{right - 150}" x2="{right - 126}" y1="{ly}" y2="{ly}" stroke="{s.color}" '
            f'stroke-width="3"{_dash(s)}/><text x="{right - 120}" y="{ly + 4}" font-size="11">'
            f"{html_text(s.name[:22])}</text>"
        )
    return out


def stacked_bars(
    categories: list[str],
    stacks: dict[str, list[float]],
    title: str,
    ylabel: str,
    width: int = 560,
    height: int = 340,
    chart_id: str = "",
) -> str:
    """One bar per category, stacked from `stacks` (name -> a value per category, one colour each), with a
    legend of the stacks right of the plot."""
    parts = _open(width, height, title, chart_id)
    totals = [sum(v[i] for v in stacks.values()) for i in range(len(categories))]
    if not categories or not any(totals):
        return _no_data(parts, width, height, "no phase data")
    top = max(totals) * 1.05
    f = _Frame(70, 34, width - 200, height - 104, y0=0.0, y1=top)
    parts.append(_plot_box(f))
    parts += _y_grid(f, nice_ticks(0, top))
    for i, cat in enumerate(categories):
        parts += _bar(f, i, len(categories), cat, [(name, vals[i]) for name, vals in stacks.items()])
    parts.append(_y_label(f, ylabel))
    parts += _bar_legend(f, list(stacks))
    parts.append("</svg>")
    return "".join(parts)


def _bar(f: _Frame, i: int, n: int, cat: str, values: list[tuple[str, float]]) -> list[str]:
    """Bar `i` of `n`: a rectangle per positive value, stacked bottom up, and the category's label."""
    bw = f.width / n
    out = []
    base = 0.0
    for j, (name, v) in enumerate(values):
        if v <= 0:
            continue
        out.append(
            f'<rect x="{f.left + i * bw + bw * 0.15:.1f}" y="{f.sy(base + v):.1f}" width="{bw * 0.7:.1f}" '
            f'height="{v / f.y1 * f.height:.1f}" fill="{PALETTE[j % len(PALETTE)]}"><title>{html_text(cat)} '
            f"{html_text(name)}: {v:.1f}</title></rect>"
        )
        base += v
    cx = f.left + i * bw + bw / 2
    out.append(
        f'<text transform="translate({cx:.1f},{f.top + f.height + 12}) rotate(30)" font-size="10">'
        f"{html_text(cat[:18])}</text>"
    )
    return out


def _bar_legend(f: _Frame, names: list[str]) -> list[str]:
    """A legend right of the frame: each stack's colour and name."""
    right = f.left + f.width
    return [
        (
            f'<rect x="{right + 10}" y="{f.top + 8 + 16 * j - 8}" width="12" height="12" '
            f'fill="{PALETTE[j % len(PALETTE)]}"/>'
            f'<text x="{right + 26}" y="{f.top + 8 + 16 * j + 2}" font-size="11">{html_text(name)}</text>'
        )
        for j, name in enumerate(names)
    ]

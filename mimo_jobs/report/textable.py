"""Plain-text tables drawn exactly as rich draws them (heavy-head box, one space of padding per side),
about 18x faster: rich measures and renders every cell through its generic renderable machinery, which
costs ~0.4 s for the few hundred rows of a 100-run report.

Pure string work: widths follow rich's Table rules (measure each column, collapse the wrappable columns
when the table is too wide, re-measure), and a cell that fits its column is padded here; a cell that must
wrap (rare) is wrapped by rich's own Text.wrap so the lines break where rich breaks them. Cells are literal
text (no markup, no emoji codes). Anything this module does not reproduce (non-ASCII or control
characters, columns too narrow to pad, a title wider than the table) returns None, and the caller draws
the table with rich. tests/report/test_textable.py compares the two on generated tables.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache

from mimo_jobs.textsafe import visible

# The rich release whose layout rules these are (tests/report/test_textable.py checks them against it). With
# any other rich, rich itself draws the tables: a layout change there must not change what users see.
RICH_LAYOUT = "15."


@lru_cache(maxsize=1)
def matches_rich() -> bool:
    from importlib.metadata import version

    try:
        return version("rich").startswith(RICH_LAYOUT)
    except Exception:  # noqa: BLE001 - no metadata: do not guess
        return False


# rich.box.HEAVY_HEAD
TOP = ("┏", "━", "┳", "┓")
HEAD = ("┃", "┃", "┃")
HEAD_SEP = ("┡", "━", "╇", "┩")
BODY = ("│", "│", "│")
BOTTOM = ("└", "─", "┴", "┘")
PAD = 1  # spaces left and right of every cell


@dataclass(frozen=True)
class Column:
    header: str
    justify: str = "left"  # left | right | center
    no_wrap: bool = False  # a cell is one line: a figure, never wrapped or cut (layout.fit sees to that)
    overflow: str = "ellipsis"  # fold | crop | ellipsis (rich's default), for cells that do not fit
    key: bool = False  # names the row: repeated in every part of a table split to fit (layout.fit)
    figures: bool = False  # cells are lists of figures: they wrap between figures, never inside one


@dataclass
class Table:
    """A table of literal text. Every title, header and cell is made `visible` on the way in: whatever
    renders the table (textable or rich) prints no control character a name or a log line brought."""

    title: str
    columns: list[Column]
    rows: list[list[str]] = field(default_factory=list)
    styles: list[str | None] = field(default_factory=list)  # per row, for the rich rendering only

    def __post_init__(self) -> None:
        self.title = visible(self.title)
        self.columns = [
            c if c.header == visible(c.header) else replace(c, header=visible(c.header)) for c in self.columns
        ]
        self.rows = [list(map(visible, r)) for r in self.rows]

    def add_row(self, cells: list[str], style: str | None = None) -> None:
        self.rows.append(list(map(visible, cells)))
        self.styles.append(style)


def _plain(s: str) -> bool:
    return s.isascii() and s.isprintable()


def _measure(text: str, max_width: int) -> tuple[int, int]:
    """rich's Measurement.get of Padding(Text(text), (0, 1)) under options.max_width = max_width."""
    if max_width < 1:
        return 0, 0
    if max_width - 2 * PAD < 1:
        return max_width, max_width
    hi = len(text)
    words = text.split()
    lo = max(map(len, words)) if words else hi
    lo = min(max(0, lo), hi)  # Text measurement, normalized and capped
    lo, hi = min(lo, max_width), min(hi, max_width)
    if hi < 1:
        lo = hi = 0
    lo, hi = min(lo + 2 * PAD, max_width), min(hi + 2 * PAD, max_width)
    return min(lo, hi), hi


def _measure_column(texts: list[str], max_width: int) -> tuple[int, int]:
    if max_width < 1:
        return 0, 0
    ms = [_measure(t, max_width) for t in texts]
    lo = max((m[0] for m in ms), default=1)
    hi = max((m[1] for m in ms), default=max_width)
    return min(lo, max_width), min(hi, max_width)


def _ratio_reduce(total: int, ratios: list[int], maximums: list[int], values: list[int]) -> list[int]:
    """rich._ratio.ratio_reduce."""
    ratios = [r if m else 0 for r, m in zip(ratios, maximums)]
    total_ratio = sum(ratios)
    if not total_ratio:
        return values[:]
    remaining = total
    out = []
    for ratio, maximum, value in zip(ratios, maximums, values):
        if ratio and total_ratio > 0:
            d = min(maximum, round(ratio * remaining / total_ratio))
            out.append(value - d)
            remaining -= d
            total_ratio -= ratio
        else:
            out.append(value)
    return out


def _collapse(widths: list[int], wrapable: list[bool], max_width: int) -> list[int]:
    """rich Table._collapse_widths: shrink the widest wrappable columns first."""
    total = sum(widths)
    excess = total - max_width
    if any(wrapable):
        while total and excess > 0:
            widest = max(w for w, ok in zip(widths, wrapable) if ok)
            second = max(w if ok and w != widest else 0 for w, ok in zip(widths, wrapable))
            diff = widest - second
            ratios = [1 if (w == widest and ok) else 0 for w, ok in zip(widths, wrapable)]
            if not any(ratios) or not diff:
                break
            widths = _ratio_reduce(excess, ratios, [min(excess, diff)] * len(widths), widths)
            total = sum(widths)
            excess = total - max_width
    return widths


def column_widths(table: Table, width: int) -> list[int]:
    """Widths of the columns, padding included, borders excluded (rich Table._calculate_column_widths
    for a table that does not expand and has no fixed-width columns)."""
    n = len(table.columns)
    max_width = width - (2 + n - 1)
    texts = [[c.header] + [r[i] for r in table.rows] for i, c in enumerate(table.columns)]
    widths = [_measure_column(t, max_width)[1] or 1 for t in texts]
    if sum(widths) > max_width:
        widths = _collapse(widths, [not c.no_wrap for c in table.columns], max_width)
        if sum(widths) > max_width:
            excess = sum(widths) - max_width
            widths = _ratio_reduce(excess, [1] * n, widths, widths)
        widths = [_measure_column(t, w)[1] or 0 for t, w in zip(texts, widths)]
    return widths


def _justify(text: str, width: int, how: str) -> str:
    if how == "left":
        return text.ljust(width)
    text = text.rstrip()
    if how == "right":
        return text.rjust(width)
    left = (width - len(text)) // 2
    return (" " * left + text).ljust(width)


class _Wrapper:
    """rich's own word wrap, for the rare cell that does not fit its column."""

    def __init__(self) -> None:
        from rich.console import Console

        self.console = Console(width=80, no_color=True, force_terminal=False)

    def lines(self, text: str, width: int, col: Column) -> list[str]:
        from rich.text import Text

        out = Text(text).wrap(
            self.console, width, justify=col.justify, overflow=col.overflow, no_wrap=col.no_wrap
        )
        return [line.plain[:width].ljust(width) for line in out]


def render(table: Table, width: int) -> list[str] | None:
    """The table's lines (title first) as rich prints them on a console `width` wide without colour;
    None when the caller should let rich draw it."""
    widths = _drawable_widths(table, width)
    if widths is None:
        return None
    total = sum(widths) + 2 + len(table.columns) - 1
    out = [table.title.ljust(total)] if table.title else []
    cells = _Cells(table.columns, widths)
    out.append(_rule(TOP, widths))
    out += cells.row([c.header for c in table.columns], HEAD, header=True)
    out.append(_rule(HEAD_SEP, widths))
    for r in table.rows:
        out += cells.row(r, BODY, header=False)
    out.append(_rule(BOTTOM, widths))
    return out


def _drawable_widths(table: Table, width: int) -> list[int] | None:
    """The column widths, or None for a table whose drawing this module does not reproduce: an unknown
    justification, text that is not plain, rows of another length, columns too narrow to pad, a title
    wider than the table."""
    cols = table.columns
    if not cols or any(c.justify not in ("left", "right", "center") for c in cols):
        return None
    texts = [table.title, *(c.header for c in cols), *(x for r in table.rows for x in r)]
    if not all(map(_plain, texts)) or any(len(r) != len(cols) for r in table.rows):
        return None
    widths = column_widths(table, width)
    if any(w < 2 * PAD + 1 for w in widths) or len(table.title) > sum(widths) + 2 + len(cols) - 1:
        return None
    return widths


def _rule(box: tuple[str, str, str, str], widths: list[int]) -> str:
    """A horizontal line of the box: left corner, a run per column joined by the crossing, right corner."""
    return box[0] + box[2].join(box[1] * w for w in widths) + box[3]


class _Cells:
    """Rows of cells padded to their columns' widths, between a box's vertical lines."""

    def __init__(self, cols: list[Column], widths: list[int]) -> None:
        self.cols = cols
        self.widths = widths
        self.wrapper: _Wrapper | None = None  # made for the first cell that must wrap (it loads rich)

    def cell(self, text: str, w: int, col: Column) -> list[str]:
        """A cell's lines: its text justified in the column, or wrapped by rich when it does not fit."""
        inner = w - 2 * PAD
        if len(text) <= inner:
            lines = [_justify(text, inner, col.justify)]
        else:
            self.wrapper = self.wrapper or _Wrapper()
            lines = self.wrapper.lines(text, inner, col)
        return [" " * PAD + x + " " * PAD for x in lines]

    def row(self, texts: list[str], box: tuple[str, str, str], header: bool) -> list[str]:
        """A row's lines: its cells side by side, each filled with blank lines to the tallest one."""
        cells = [self.cell(t, w, c) for t, w, c in zip(texts, self.widths, self.cols)]
        height = max(len(c) for c in cells)
        for c, w in zip(cells, self.widths):
            blank = [" " * w] * (height - len(c))
            if header:  # rich aligns the header to the bottom, rows to the top
                c[:0] = blank
            else:
                c.extend(blank)
        return [box[0] + box[1].join(c[i] for c in cells) + box[2] for i in range(height)]


def to_rich(table: Table):
    """The same table as a rich Table (for a colour terminal, or when render() returns None)."""
    from rich.table import Table as RichTable
    from rich.text import Text

    t = RichTable(title=table.title, title_justify="left")
    for c in table.columns:
        t.add_column(Text(c.header), justify=c.justify, no_wrap=c.no_wrap, overflow=c.overflow)
    for cells, style in zip(table.rows, table.styles or [None] * len(table.rows)):
        t.add_row(*[Text(x) for x in cells], style=style)
    return t

"""Fitting a table to a width without cutting a figure.

rich fits a table that is too wide by narrowing its wrappable columns and then, as a last resort, every
column: `300/300` comes out as `30`, a column as nothing. Here every column has a floor, the width below
which it would lose something: a no_wrap column (one figure a cell) its widest cell, a column of figure
lists its widest figure (it wraps between them), a text column TEXT_MIN characters (its text folds). A
table is drawn only at a width where rich's own layout (textable.column_widths) keeps every column at its
floor. A table too wide for that is split into parts of its columns, each repeating the key columns that
name its rows, the way wide data frames are printed; the parts are drawn one after the other.
"""

from __future__ import annotations

from .textable import PAD, Table, column_widths

TEXT_MIN = 8  # characters a text column keeps when the table is squeezed


def _cell_width(text: str) -> int:
    if text.isascii():
        return len(text)
    from rich.cells import cell_len

    return cell_len(text)


def _floors(table: Table) -> list[int]:
    """Each column's narrowest width (padding included) at which it loses nothing."""
    out = []
    for i, c in enumerate(table.columns):
        texts = [c.header, *(r[i] for r in table.rows)]
        natural = max(map(_cell_width, texts))
        if c.no_wrap:
            inner = natural
        elif c.figures:
            inner = max((_cell_width(w) for t in texts for w in t.split()), default=0)
        else:
            inner = min(natural, TEXT_MIN)
        out.append(inner + 2 * PAD)
    return out


def _fits(table: Table, floors: list[int], width: int) -> bool:
    if sum(floors) + len(floors) + 1 > width:
        return False
    return all(w >= f for w, f in zip(column_widths(table, width), floors))


def _width(table: Table, floors: list[int], width: int) -> int:
    """`width`, or the least width above it where the table keeps its floors (one too wide for `width`)."""
    w = max(width, sum(floors) + len(floors) + 1)
    while not _fits(table, floors, w) and w < width + sum(floors) * 2:  # bounded: wide enough long before
        w += 1
    return w


def _part(table: Table, cols: list[int], title: str) -> Table:
    return Table(
        title,
        [table.columns[j] for j in cols],
        [[r[j] for j in cols] for r in table.rows],
        list(table.styles),
    )


def fit(table: Table, width: int) -> list[tuple[Table, int]]:
    """The table, or the parts it splits into, each with the width to draw it at: `width`, or more for a
    part whose single figure column (with the key columns) cannot keep its floor in it; that part's lines
    are wider than asked, and no figure in them is cut."""
    floors = _floors(table)
    if _fits(table, floors, width):
        return [(table, width)]
    keys = [i for i, c in enumerate(table.columns) if c.key]
    groups: list[list[int]] = [[]]
    for i in (i for i in range(len(table.columns)) if i not in keys):
        cols = sorted(keys + groups[-1] + [i])
        if groups[-1] and not _fits(_part(table, cols, ""), [floors[j] for j in cols], width):
            groups.append([])
        groups[-1].append(i)
    if len(groups) < 2:
        return [(table, _width(table, floors, width))]
    out = []
    for n, g in enumerate(groups, 1):
        cols = sorted(keys + g)
        part = _part(table, cols, f"{table.title} ({n}/{len(groups)})" if table.title else "")
        out.append((part, _width(part, [floors[j] for j in cols], width)))
    return out

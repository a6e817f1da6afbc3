"""Text from users and logs on its way to a terminal: harmless, and whole.

Run, study and job names, flags and log excerpts are whatever someone typed or a process printed. Written
raw to a terminal, an escape sequence in them recolours the screen, retitles the window or moves the
cursor; a newline splits a table row; a right-to-left override (U+202E) makes text read backwards.
`visible` is the one rule for all of them; `console_width` is the one rule for how wide a console is.
Pure and import-light: the CLI imports it at start-up.
"""

from __future__ import annotations

import os
from typing import TextIO

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
PIPE_WIDTH = 200


def _shown(ch: str) -> str:
    if ch.isprintable():
        return ch
    if ch in _NAMED:
        return _NAMED[ch]
    o = ord(ch)
    return f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}" if o < 0x10000 else f"\\U{o:08x}"


def visible(s: str) -> str:
    """`s` with every character that is not printable shown as its Python escape (ESC as \\x1b, a
    newline as \\n, U+202E as \\u202e): control characters (C0, DEL, C1), format characters (bidi
    overrides, zero-width ones), line and paragraph separators, surrogates and unassigned code points.
    Made visible rather than dropped, so two names that differ only there still look different."""
    if s.isascii() and s.isprintable():  # nearly every name: no per-character work
        return s
    return "".join(map(_shown, s))


def console_width(stream: TextIO) -> int | None:
    """The width for a rich Console writing to `stream`: None (rich asks the terminal, or reads $COLUMNS)
    on a terminal or when COLUMNS holds a width; PIPE_WIDTH on a pipe or a file, where rich would assume
    80 columns and squeeze tables that nobody's screen limits."""
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        tty = False
    return None if tty or os.environ.get("COLUMNS", "").isdigit() else PIPE_WIDTH

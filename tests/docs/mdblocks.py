"""Markdown split into prose and fenced code, line by line (the docs tests read pages through this)."""

from __future__ import annotations

import re

_FENCE = re.compile(r"^\s*(`{3,}|~{3,})")


def code_flags(text: str) -> list[tuple[str, bool]]:
    """Each line of `text` with whether it is inside a fenced code block (fence lines count as code)."""
    out, fence = [], None
    for line in text.splitlines():
        m = _FENCE.match(line)
        if fence is None:
            if m:
                fence = m.group(1)
            out.append((line, m is not None))
            continue
        if (
            m
            and m.group(1)[0] == fence[0]
            and len(m.group(1)) >= len(fence)
            and not line.strip().strip(fence[0])
        ):
            fence = None
        out.append((line, True))
    return out


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks (fences and their content become empty lines)."""
    return ["" if code else line for line, code in code_flags(text)]


def code_lines(text: str) -> list[tuple[int, str]]:
    """(1-based line number, line) of every line inside a fenced code block, fences excluded."""
    return [
        (n, line) for n, (line, code) in enumerate(code_flags(text), 1) if code and not _FENCE.match(line)
    ]

"""A package docstring that lists its modules lists every one of them, and names nothing that is not there
(list lines: a name in backquotes after "- ", or a bare name indented, then two spaces and what it holds;
several names split by commas)."""

from __future__ import annotations

import ast
import re

from helpers import REPO

PACKAGE = REPO / "mimo_jobs"
LISTED = re.compile(
    r"^\s*(?:-\s+)?`?(?P<names>[A-Za-z_][\w.]*/?(?:`?, `?[A-Za-z_][\w.]*)*)`?(?:\s{2,}\S|/?$)"
)


def listed(doc: str) -> list[str]:
    names = []
    for line in doc.splitlines():
        m = LISTED.match(line)
        if m and (line.startswith((" ", "-")) or line.endswith("/")):
            names += [n.strip("`/ ") for n in m.group("names").split(",")]
    return names


def existing(pkg) -> set[str]:
    """Every module, subpackage and source file under the package, by name."""
    return (
        {p.stem for p in pkg.rglob("*.py")}
        | {p.name for p in pkg.rglob("*") if p.is_dir()}
        | {p.name for p in pkg.rglob("*.c")}
    )


def modules(pkg) -> set[str]:
    """The package's own modules and subpackages (what its docstring must name when it lists any)."""
    out = {p.stem for p in pkg.glob("*.py") if p.stem != "__init__"}
    return out | {p.name for p in pkg.iterdir() if p.is_dir() and (p / "__init__.py").exists()}


def test_package_docstrings_list_their_modules_truly():
    problems, checked = [], 0
    for init in sorted(PACKAGE.rglob("__init__.py")):
        pkg = init.parent
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        names = listed(doc)
        if len(names) < 3:  # a one-line summary, not a list of modules
            continue
        checked += 1
        where = pkg.relative_to(REPO)
        problems += [f"{where}: names {n!r}, which is not there" for n in names if n not in existing(pkg)]
        problems += [f"{where}: does not name {m!r}" for m in sorted(modules(pkg) - set(names))]
    assert checked >= 8 and not problems, "\n".join(problems)


def test_the_list_reader_sees_a_missing_and_a_stale_name():
    doc = "Pkg.\n\n- `a`   one\n  b, c    two\n  d/\nprose that is not a list: `e` here\n"
    assert listed(doc) == ["a", "b", "c", "d"]


def test_the_design_package_table_names_every_module():
    text = (REPO / "docs" / "design.md").read_text().split("## Package layout", 1)[1].split("\n## ", 1)[0]
    problems, rows = [], 0
    for line in text.splitlines():
        m = re.match(r"\| \[`mimo_jobs/(\w+)/`\]", line)
        if not m:
            continue
        rows += 1
        pkg = PACKAGE / m.group(1)
        for mod in sorted(modules(pkg) - {"__main__"}):
            if not any(f"`{mod}{end}" in line for end in (".py`", "/`", "`")):
                problems.append(f"docs/design.md: the row of mimo_jobs/{m.group(1)}/ does not name {mod}")
        for named in re.findall(r"`(\w+)\.py`", line):
            if named not in existing(pkg):
                problems.append(
                    f"docs/design.md: the row of mimo_jobs/{m.group(1)}/ names {named}.py, not there"
                )
    assert rows >= 10 and not problems, "\n".join(problems)

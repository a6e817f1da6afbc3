"""The examples of README.md and docs/*.md show no machine's paths, and every mimo_jobs path or module they
name exists."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest
from mdblocks import code_lines

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md"] + sorted((REPO / "docs").glob("*.md"))

# Directories that only exist on the machine an example was rendered on (a temp dir, a checkout, a home).
MACHINE_PATH = re.compile(r"(?<![\w.~-])/(?:tmp|work|home|root)/")
# `mimo_jobs/x/y.py` or `mimo_jobs.x.y`; a name with a placeholder (`<x>`, `*`, `{a,b}`) is a pattern, not a path.
NAMED = re.compile(r"(?<![\w-])mimo_jobs(?:[/.][A-Za-z0-9_.<>*{}-]+)+|(?<![\w/.-])mimo_jobs/")


def machine_paths(text: str) -> list[str]:
    return [f"{n}: {line.strip()}" for n, line in code_lines(text) if MACHINE_PATH.search(line)]


@cache
def _defined(module: Path) -> frozenset[str]:
    """Top-level names a module defines or imports."""
    names = set()
    for node in ast.parse(module.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return frozenset(names)


def _module_file(root: Path, parts: list[str]) -> Path | None:
    base = root.joinpath(*parts)
    for cand in (base.with_suffix(".py"), base / "__init__.py", base.with_suffix(".c")):
        if cand.is_file():
            return cand
    return None


def missing(name: str, root: Path = REPO) -> str | None:
    """Why `name` (a path under mimo_jobs/ or a dotted module, optionally with one attribute) does not exist."""
    if any(c in name for c in "<>*{}"):
        return None
    if "/" in name or name == "mimo_jobs":
        return None if (root / name).exists() else f"{name}: no such file or directory"
    parts = name.rstrip(".").split(".")
    if _module_file(root, parts):
        return None
    found = _module_file(root, parts[:-1])
    if found is None or found.suffix != ".py":
        return f"{name}: no such module"
    return None if parts[-1] in _defined(found) else f"{name}: {'.'.join(parts[:-1])} defines no {parts[-1]}"


def named_paths(text: str) -> list[tuple[int, str]]:
    """(line, name) of every mimo_jobs path or dotted module name in a page, prose and code alike."""
    return [
        (n, m.group(0).rstrip("."))
        for n, line in enumerate(text.splitlines(), 1)
        for m in NAMED.finditer(line)
    ]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_examples_show_no_machine_path(doc):
    bad = machine_paths(doc.read_text(encoding="utf-8"))
    assert not bad, (
        f"{doc.relative_to(REPO)}: examples with a machine's path (render them from a neutral directory, or "
        "write a path under the checkout as <checkout>/...):\n" + "\n".join(bad)
    )


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_named_mimo_jobs_paths_exist(doc):
    found = named_paths(doc.read_text(encoding="utf-8"))
    bad = [f"{n}: {why}" for n, name in found if (why := missing(name))]
    assert not bad, f"{doc.relative_to(REPO)} names what does not exist:\n" + "\n".join(bad)


def test_the_checks_can_fail(tmp_path):
    page = "\n".join(
        [
            "Run it from /tmp/x in prose: not an example.",
            "```console",
            "$ mimo-jobs render studies/a.yaml -o runs",
            "wrote /tmp/abc/runs/a",
            "see /home/me/x and ./work/y and <checkout>/runs/a",
            "```",
            "`mimo_jobs/study/spec.py`, `mimo_jobs/plan/spec.py`, `mimo_jobs.study.spec.StudySpec`,",
            "`mimo_jobs.study.spec.NoSuch`, `mimo_jobs.plan`, `mimo_jobs/cli/*`, `mimo_jobs.trainer`.",
        ]
    )
    assert machine_paths(page) == [
        "4: wrote /tmp/abc/runs/a",
        "5: see /home/me/x and ./work/y and <checkout>/runs/a",
    ]
    (tmp_path / "mimo_jobs" / "study").mkdir(parents=True)
    (tmp_path / "mimo_jobs" / "trainer").mkdir()
    (tmp_path / "mimo_jobs" / "__init__.py").write_text("")
    (tmp_path / "mimo_jobs" / "trainer" / "__init__.py").write_text("")
    (tmp_path / "mimo_jobs" / "study" / "spec.py").write_text("class StudySpec: ...\n")
    names = [name for _, name in named_paths(page)]
    assert names == [
        "mimo_jobs/study/spec.py",
        "mimo_jobs/plan/spec.py",
        "mimo_jobs.study.spec.StudySpec",
        "mimo_jobs.study.spec.NoSuch",
        "mimo_jobs.plan",
        "mimo_jobs/cli/*",
        "mimo_jobs.trainer",
    ]
    assert [why for name in names if (why := missing(name, tmp_path))] == [
        "mimo_jobs/plan/spec.py: no such file or directory",
        "mimo_jobs.study.spec.NoSuch: mimo_jobs.study.spec defines no NoSuch",
        "mimo_jobs.plan: mimo_jobs defines no plan",
    ]

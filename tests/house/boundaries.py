"""The import boundaries of mimo_jobs: one table of which package may import which, the checker that holds
every import of the source tree against it, and the drawing of the graph that docs/design.md shows.

Every `import` and `from ... import` statement counts, at any depth (function-local imports and imports under
`if TYPE_CHECKING:` included: a lazy import is still a dependency). Relative imports are resolved against
the importing module; `from a.b import c` points at module `a.b.c` when that module exists, else at `a.b`.

    python tests/house/boundaries.py            the allowed graph (the table below), as docs/design.md shows it
    python tests/house/boundaries.py --actual   the graph the code has now, and every import that breaks the table
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT_PACKAGE = "mimo_jobs"

# Layers, bottom first; each package lists what it may import. An entry is a package ("store") or one module
# of it ("submit.executors.slurm.sacct": that module only). The root module (`mimo_jobs`, which holds only
# __version__) may be imported by anyone and imports nothing.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("errors", ()),
    ("textsafe", ()),
    ("image", ()),
    ("strictread", ("errors",)),
    ("contract", ("errors",)),
    ("model", ("errors", "strictread")),
    ("study", ("contract", "model", "errors", "image", "strictread", "submit.executors.registry")),
    ("predict", ("study", "model", "contract", "errors", "textsafe")),
    ("store", ("contract", "errors")),
    ("data", ("contract", "model", "errors", "study")),
    ("trainer", ("data", "study", "predict", "model", "contract", "errors", "image")),
    ("submit", ("study", "store", "contract", "errors", "image")),
    ("ingest", ("store", "study", "contract", "errors", "strictread", "submit.executors.slurm.sacct")),
    ("report", ("store", "study", "predict", "model", "contract", "errors", "textsafe")),
)
# cli may import every package but the trainer: it starts the trainer as its own process.
CLI_NEVER = ("trainer",)
ALLOWED: dict[str, tuple[str, ...]] = dict(LAYERS)
ALLOWED["cli"] = tuple(p for p, _ in LAYERS if p not in CLI_NEVER)
ORDER: tuple[str, ...] = tuple(ALLOWED)


@dataclass(frozen=True)
class Import:
    """One import statement's edge: `importer` (a module) imports `target` (a module), at `path`:`line`."""

    path: str
    line: int
    importer: str
    target: str


def module_name(relpath: str) -> str:
    """'mimo_jobs/study/spec.py' -> 'mimo_jobs.study.spec'; a package's __init__.py names the package."""
    parts = relpath.removesuffix(".py").split("/")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(name: str, known: set[str]) -> str:
    """The longest known module that `name` starts with (a name imported from a module is not a module); a
    module missing from the tree keeps its whole name, so an import of it still counts as a crossing."""
    parts = name.split(".")
    while len(parts) > 2 and ".".join(parts) not in known:
        parts.pop()
    return ".".join(parts) if ".".join(parts) in known else name


def imports_of(relpath: str, source: str, known: set[str]) -> list[Import]:
    """The imports of ROOT_PACKAGE modules made anywhere in one module's source."""
    me = module_name(relpath)
    package = me if relpath.endswith("__init__.py") else me.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(source, filename=relpath)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                head = ".".join(base + ([node.module] if node.module else []))
            else:
                head = node.module or ""
            names = [f"{head}.{a.name}" if f"{head}.{a.name}" in known else head for a in node.names]
        for name in names:
            if name == ROOT_PACKAGE or name.startswith(ROOT_PACKAGE + "."):
                out.append(Import(relpath, node.lineno, me, _resolve(name, known)))
    return sorted(set(out), key=lambda i: (i.path, i.line, i.target))


def read_tree(repo: Path) -> dict[str, str]:
    """relative path -> source of every module of ROOT_PACKAGE under `repo`."""
    return {
        p.relative_to(repo).as_posix(): p.read_text(encoding="utf-8")
        for p in sorted((repo / ROOT_PACKAGE).rglob("*.py"))
    }


def all_imports(tree: dict[str, str]) -> list[Import]:
    known = {module_name(p) for p in tree}
    return [i for p, src in tree.items() for i in imports_of(p, src, known)]


def package_of(module: str) -> str:
    """'mimo_jobs.study.spec' -> 'study'; the root module -> ''."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _relative(module: str) -> str:
    return module.partition(".")[2]


def permits(allowed: dict[str, tuple[str, ...]], importer: str, target: str) -> bool:
    src, dst = package_of(importer), package_of(target)
    if src == dst or dst == "":
        return True
    rel = _relative(target)
    return any(rel == e or rel.startswith(e + ".") for e in allowed.get(src, ()))


def crossings(imports: list[Import], allowed: dict[str, tuple[str, ...]]) -> list[str]:
    """Every import that the table does not allow, as 'path:line: a -> b (module)'."""
    bad = []
    for i in imports:
        src = package_of(i.importer)
        if src and src not in allowed:
            bad.append(f"{i.path}:{i.line}: package {src!r} has no row in the table")
        elif not permits(allowed, i.importer, i.target):
            bad.append(f"{i.path}:{i.line}: {src} -> {package_of(i.target) or 'mimo_jobs'} ({i.target})")
        elif src == "" and i.target != i.importer:
            bad.append(f"{i.path}:{i.line}: the root module imports {i.target}")
    return bad


def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative (a deep package must not hit the recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    comp.append(m)
                    if m == node:
                        break
                out.append(sorted(comp))
    return out


def cycles(imports: list[Import]) -> list[str]:
    """Import cycles between the modules of one package, each with the imports that close it."""
    graph: dict[str, set[str]] = {}
    for i in imports:
        graph.setdefault(i.importer, set())
        graph.setdefault(i.target, set())
        if i.target != i.importer and package_of(i.importer) == package_of(i.target) != "":
            graph[i.importer].add(i.target)
    bad = []
    for comp in _strongly_connected(graph):
        if len(comp) < 2:
            continue
        members = set(comp)
        edges = [
            f"{i.path}:{i.line}: {i.importer} -> {i.target}"
            for i in imports
            if i.importer in members and i.target in members and i.importer != i.target
        ]
        bad.append(f"cycle in {package_of(comp[0])}: {' <-> '.join(comp)}\n    " + "\n    ".join(edges))
    return bad


def package_graph(imports: list[Import]) -> dict[str, tuple[str, ...]]:
    """package -> the packages (or single modules) it imports, from the code."""
    out: dict[str, set[str]] = {}
    for i in imports:
        src, dst = package_of(i.importer), package_of(i.target)
        if src and dst and src != dst:
            rel = _relative(i.target)
            listed = ALLOWED.get(src, ())
            # an import allowed through a one-module entry is drawn as that module
            out.setdefault(src, set()).add(next((e for e in listed if rel.startswith(e + ".")), dst))
    return {p: tuple(sorted(d, key=_rank)) for p, d in out.items()}


def _rank(name: str) -> tuple[int, str]:
    head = name.split(".")[0]
    return (ORDER.index(head) if head in ORDER else len(ORDER), name)


def draw(graph: dict[str, tuple[str, ...]]) -> str:
    """One line per package, bottom layer first: 'a  → b, c' (a imports b and c)."""
    packages = sorted(set(graph) | {d.split(".")[0] for ds in graph.values() for d in ds}, key=_rank)
    width = max(len(p) for p in packages)
    lines = []
    for p in packages:
        deps = sorted(graph.get(p, ()), key=_rank)
        lines.append(
            f"{p:<{width}}  → {', '.join(deps)}" if deps else f"{p:<{width}}  → (nothing of mimo_jobs)"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if argv not in ([], ["--actual"]):
        print("usage: python tests/house/boundaries.py [--actual]", file=sys.stderr)
        return 2
    if not argv:
        print(draw(ALLOWED))
        return 0
    imports = all_imports(read_tree(Path(__file__).resolve().parents[2]))
    print(draw(package_graph(imports)))
    bad = crossings(imports, ALLOWED) + cycles(imports)
    if bad:
        print(f"\n{len(bad)} import(s) break the table:\n" + "\n".join(bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

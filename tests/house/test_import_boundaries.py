"""Every import of mimo_jobs keeps to the one table of allowed dependencies in boundaries.py, no package has
an import cycle between its modules, and docs/design.md draws the table as it is."""

from __future__ import annotations

import re
from pathlib import Path

import boundaries as B

REPO = Path(__file__).resolve().parents[2]


def test_imports_keep_to_the_table():
    imports = B.all_imports(B.read_tree(REPO))
    assert len({i.importer for i in imports}) > 50, (
        "the walk found too few modules: is the tree where it was?"
    )
    bad = B.crossings(imports, B.ALLOWED)
    assert not bad, f"{len(bad)} import(s) cross the table in tests/house/boundaries.py:\n" + "\n".join(bad)


def test_no_import_cycle_inside_a_package():
    bad = B.cycles(B.all_imports(B.read_tree(REPO)))
    assert not bad, "\n".join(bad)


def test_every_package_has_a_row():
    packages = {p.name for p in (REPO / "mimo_jobs").iterdir() if (p / "__init__.py").exists()}
    packages |= {p.stem for p in (REPO / "mimo_jobs").glob("*.py") if p.stem != "__init__"}
    assert packages - set(B.ALLOWED) == set(), "packages missing from the table"
    assert set(B.ALLOWED) - packages == set(), "table rows for packages that do not exist"


def test_the_toolkit_never_imports_the_trainer():
    """Held by the table; this keeps a later edit of the table from loosening it."""
    for pkg in ("cli", "submit", "report", "ingest", "store"):
        assert "trainer" not in B.ALLOWED[pkg], pkg
    for pkg in ("submit", "report", "ingest", "store"):
        assert "data" not in B.ALLOWED[pkg], pkg
    assert not [p for p, deps in B.ALLOWED.items() if "cli" in deps]
    for pkg in ("submit", "report"):
        assert not [d for d in B.ALLOWED[pkg] if d.split(".")[0] == "ingest"], pkg


def test_design_doc_draws_the_table():
    text = (REPO / "docs" / "design.md").read_text(encoding="utf-8")
    section = re.search(r"^## Dependency direction\n(.*?)^## ", text, re.M | re.S)
    assert section, "docs/design.md has no '## Dependency direction' section"
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", section.group(1), re.M | re.S)
    assert B.draw(B.ALLOWED) + "\n" in blocks, (
        "docs/design.md's drawing differs from the table; paste the output of "
        "`python tests/house/boundaries.py`:\n" + B.draw(B.ALLOWED)
    )


# ---------------------------------------------------------------- the checker itself


def _tree(files: dict[str, str]) -> dict[str, str]:
    return {f"mimo_jobs/{p}": src for p, src in files.items()}


SYNTHETIC = _tree(
    {
        "__init__.py": "__version__ = '0'\n",
        "errors.py": "",
        "contract/__init__.py": "",
        "contract/iteration.py": "from ..errors import X\n",
        "store/__init__.py": "",
        "store/connection.py": "from . import schema\n",
        "store/schema.py": "def f():\n    from mimo_jobs import __version__\n",
        "ingest/__init__.py": "",
        "ingest/pipeline.py": "from mimo_jobs.submit.executors.slurm.sacct import parse\n",
        "submit/__init__.py": "",
        "submit/executors/__init__.py": "",
        "submit/executors/slurm/__init__.py": "",
        "submit/executors/slurm/sacct.py": "",
        "submit/executors/slurm/executor.py": "from .sacct import parse\nfrom ...service import go\n",
        "submit/service.py": "import mimo_jobs.store.connection\n",
    }
)


def test_checker_passes_a_clean_tree(tmp_path):
    for rel, src in SYNTHETIC.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(src)
    imports = B.all_imports(B.read_tree(tmp_path))
    assert {(i.importer, i.target) for i in imports} == {
        ("mimo_jobs.contract.iteration", "mimo_jobs.errors"),
        ("mimo_jobs.store.connection", "mimo_jobs.store.schema"),
        ("mimo_jobs.store.schema", "mimo_jobs"),
        ("mimo_jobs.ingest.pipeline", "mimo_jobs.submit.executors.slurm.sacct"),
        ("mimo_jobs.submit.executors.slurm.executor", "mimo_jobs.submit.executors.slurm.sacct"),
        ("mimo_jobs.submit.executors.slurm.executor", "mimo_jobs.submit.service"),
        ("mimo_jobs.submit.service", "mimo_jobs.store.connection"),
    }
    assert B.crossings(imports, B.ALLOWED) == []
    assert B.cycles(imports) == []


def test_checker_sees_a_reintroduced_crossing(tmp_path):
    """A function-local, relative import from submit into ingest, and ingest reaching past its one module."""
    tree = dict(SYNTHETIC)
    tree["mimo_jobs/submit/service.py"] += "def refresh():\n    from ..ingest.pipeline import run\n"
    tree["mimo_jobs/ingest/pipeline.py"] += "from mimo_jobs.submit import service\n"
    tree["mimo_jobs/contract/iteration.py"] += "import mimo_jobs.trainer.step\n"
    imports = B.all_imports(tree)
    assert B.crossings(imports, B.ALLOWED) == [
        "mimo_jobs/contract/iteration.py:2: contract -> trainer (mimo_jobs.trainer.step)",
        "mimo_jobs/ingest/pipeline.py:2: ingest -> submit (mimo_jobs.submit.service)",
        "mimo_jobs/submit/service.py:3: submit -> ingest (mimo_jobs.ingest.pipeline)",
    ]


def test_checker_sees_a_cycle_inside_a_package():
    tree = dict(SYNTHETIC)
    tree["mimo_jobs/store/schema.py"] += "def migrate():\n    from .connection import transaction\n"
    (cycle,) = B.cycles(B.all_imports(tree))
    assert cycle.splitlines() == [
        "cycle in store: mimo_jobs.store.connection <-> mimo_jobs.store.schema",
        "    mimo_jobs/store/connection.py:1: mimo_jobs.store.connection -> mimo_jobs.store.schema",
        "    mimo_jobs/store/schema.py:4: mimo_jobs.store.schema -> mimo_jobs.store.connection",
    ]


def test_checker_sees_an_unknown_package():
    tree = dict(SYNTHETIC, **{"mimo_jobs/newpkg/__init__.py": "from mimo_jobs import errors\n"})
    assert B.crossings(B.all_imports(tree), B.ALLOWED) == [
        "mimo_jobs/newpkg/__init__.py:1: package 'newpkg' has no row in the table"
    ]


def test_draw():
    assert B.draw({"store": ("errors", "contract"), "contract": ("errors",)}).splitlines() == [
        "errors    → (nothing of mimo_jobs)",
        "contract  → errors",
        "store     → errors, contract",
    ]

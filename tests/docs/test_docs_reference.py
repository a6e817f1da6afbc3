"""The docs stay true to the code: the study-file reference tables against the pydantic models, and every
relative link of README.md and docs/*.md against the files (and headings) it points to.

docs/study-file.md has one table per model under a heading that names the model in backticks, e.g.
"## `cluster` (`ClusterSpec`)"; the first column of each row holds the backticked key name(s) of that row
("`partition`, `account`, `qos`"), the second its default ("required", "unset", a phrase, or one backticked
literal that must equal the field's default).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from mdblocks import prose_lines

import mimo_jobs.study.spec as spec
from mimo_jobs.submit.executors.registry import REGISTRY

REPO = Path(__file__).resolve().parents[2]
STUDY_DOC = REPO / "docs" / "study-file.md"
MODELS = {
    name: getattr(spec, name)
    for name in (
        "StudySpec",
        "ClusterSpec",
        "ContainerSpec",
        "HardwareSpec",
        "TrainerSpec",
        "LRSpec",
        "OptimizerSpec",
        "DataSpec",
        "FreezeSpec",
        "PointSpec",
        "EncoderAxes",
        "LLMAxes",
        "MatrixSpec",
    )
}
# each executor's study section (`cluster.slurm`, `cluster.kubernetes`), from the executor registry
MODELS |= {e.section.__name__: e.section for e in REGISTRY.values() if e.section is not None}

_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_TICKS = re.compile(r"`([^`]+)`")
_CELL_SPLIT = re.compile(r"(?<!\\)\|")


def _cells(row: str) -> list[str]:
    return [c.strip() for c in _CELL_SPLIT.split(row.strip().strip("|"))]


def reference_tables(text: str) -> dict[str, list[tuple[list[str], str]]]:
    """model name -> [(key names of a row, default cell)] from the table under the heading naming it."""
    tables: dict[str, list[tuple[list[str], str]]] = {}
    current: str | None = None
    for line in prose_lines(text):
        h = _HEADING.match(line)
        if h:
            named = [t for t in _TICKS.findall(h.group(2)) if t in MODELS]
            assert len(named) <= 1, f"heading {line!r} names more than one model"
            current = named[0] if named else None
            if current is not None:
                assert current not in tables, f"{current} has two sections in {STUDY_DOC.name}"
                tables[current] = []
            continue
        if current is None or not line.lstrip().startswith("|"):
            continue
        cells = _cells(line)
        if cells[0] == "key" or set(cells[0]) <= set("-: "):
            continue  # header and separator rows
        keys = _TICKS.findall(cells[0])
        assert keys, f"{current}: row {line!r} has no backticked key in its first column"
        tables[current].append((keys, cells[1] if len(cells) > 1 else ""))
    return tables


@pytest.fixture(scope="module")
def tables() -> dict[str, list[tuple[list[str], str]]]:
    return reference_tables(STUDY_DOC.read_text(encoding="utf-8"))


def test_every_model_has_a_table(tables):
    assert sorted(tables) == sorted(MODELS), f"sections for {sorted(set(MODELS) - set(tables))} are missing"
    assert all(tables[m] for m in MODELS), [m for m in MODELS if not tables[m]]


@pytest.mark.parametrize("model", sorted(MODELS))
def test_table_lists_exactly_the_fields(tables, model):
    fields = set(MODELS[model].model_fields)
    documented = [k for keys, _ in tables[model] for k in keys]
    assert len(documented) == len(set(documented)), f"{model}: a key is documented twice: {documented}"
    missing = sorted(fields - set(documented))
    unknown = sorted(set(documented) - fields)
    assert not missing, f"docs/study-file.md: {model} fields without a row: {missing}"
    assert not unknown, f"docs/study-file.md: {model} rows that are not fields: {unknown}"


def _same_default(cell_literal: str, default) -> bool:
    import yaml

    if isinstance(default, bool):
        return cell_literal == str(default).lower()
    if isinstance(default, (int, float)):
        try:
            return float(cell_literal) == float(default)
        except ValueError:
            return False
    if isinstance(default, str):
        return cell_literal == default or yaml.safe_load(cell_literal) == default
    return yaml.safe_load(cell_literal) == default


@pytest.mark.parametrize("model", sorted(MODELS))
def test_defaults_match(tables, model):
    """`required` exactly for required fields, and a single backticked literal equals the field's default."""
    fields = MODELS[model].model_fields
    bad = []
    for keys, cell in tables[model]:
        for k in keys:
            f = fields.get(k)
            if f is None:
                continue  # reported by test_table_lists_exactly_the_fields
            if (cell == "required") != f.is_required():
                bad.append(
                    f"{k}: default column {cell!r}, but the field is "
                    + ("required" if f.is_required() else "optional")
                )
                continue
            m = re.fullmatch(r"`([^`]*)`", cell)
            if m and not f.is_required():
                default = f.get_default(call_default_factory=True)
                if not _same_default(m.group(1), default):
                    bad.append(f"{k}: the doc says {m.group(1)!r}, the default is {default!r}")
    assert not bad, f"docs/study-file.md, {model}: " + "; ".join(bad)


# ---------------------------------------------------------------- links

_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_INLINE_CODE = re.compile(r"`[^`]*`")


def _doc_files() -> list[Path]:
    return [REPO / "README.md"] + sorted((REPO / "docs").glob("*.md"))


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: the text (links by their label, no backticks), lower case, punctuation
    dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "")
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in prose_lines(path.read_text(encoding="utf-8")):
        h = _HEADING.match(line)
        if h:
            s = _slug(h.group(2))
            n = seen.get(s, 0)
            seen[s] = n + 1
            out.add(s if n == 0 else f"{s}-{n}")
    return out


def relative_links(path: Path) -> list[str]:
    links = []
    for line in prose_lines(path.read_text(encoding="utf-8")):
        for target in _LINK.findall(_INLINE_CODE.sub("", line)):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):
                continue  # http(s):, mailto: ... (outside the repository by design)
            links.append(target)
    return links


def test_docs_pages_exist_and_readme_links_them():
    pages = sorted(p.name for p in (REPO / "docs").glob("*.md"))
    assert pages, "docs/ has no pages"
    linked = {t.split("#")[0] for t in relative_links(REPO / "README.md")}
    assert not [p for p in pages if f"docs/{p}" not in linked], "README.md does not link every docs page"


@pytest.mark.parametrize("doc", _doc_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(doc):
    bad = []
    for target in relative_links(doc):
        file_part, _, anchor = target.partition("#")
        dest = (doc.parent / file_part).resolve() if file_part else doc
        if not dest.exists():
            bad.append(f"{target}: {dest} does not exist")
            continue
        try:
            dest.relative_to(REPO)
        except ValueError:
            bad.append(f"{target}: points outside the repository")
            continue
        if anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            bad.append(f"{target}: no heading with anchor #{anchor} in {dest.relative_to(REPO)}")
    assert not bad, f"{doc.relative_to(REPO)}: broken links: " + "; ".join(bad)


def test_reference_parser_sees_a_missing_row():
    """The check can fail: a table without one of its model's rows, or with a row too many, is seen."""
    doc = "\n".join(
        [
            "## `trainer.freeze` (`FreezeSpec`)",
            "",
            "| key | default | meaning |",
            "|---|---|---|",
            "| `encoder` | `false` | freeze the encoders |",
            "| `encoders` | `{}` | freeze the named encoders |",
            "| `llm_head` | `false` | not a field |",
            "```",
            "| `llm` | `false` | inside a code block: not a row |",
            "```",
        ]
    )
    rows = reference_tables(doc)["FreezeSpec"]
    documented = {k for keys, _ in rows for k in keys}
    fields = set(MODELS["FreezeSpec"].model_fields)
    assert fields - documented == {"llm"} and documented - fields == {"llm_head"}


def test_design_states_the_stores_schema_version():
    from mimo_jobs.store.schema import SCHEMA_VERSION

    text = (REPO / "docs" / "design.md").read_text()
    assert re.findall(r"schema version (\d+)", text) == [str(SCHEMA_VERSION)]

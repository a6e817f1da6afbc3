"""The trainer, data, store, ingest, report and contract packages name encoder modules, not one encoder: the
one-encoder names (a layout's enc_tp/enc_pp/enc_dp/enc_ranks, the trainer state's enc_shape/enc_plan, the
grids' `encoder`, the images/audio aliases of batch.flatten, the mock config's one-module fields) stay
retired there. What reads the older form of a store (the runs table's enc_* columns) is named here. A
Layout is built from its modules everywhere (mimo_jobs, benchmarks, tests): its flat enc_tp/enc_pp/enc_dp
keywords are gone, and only Layout.from_dict reads them, from a record of one vision encoder."""

from __future__ import annotations

import ast
import inspect
import re

import pytest

from helpers import REPO

AREA = ("trainer", "data", "store", "ingest", "report", "contract")
# the readers of the older form: the runs table's one-encoder columns, written for a one-encoder run and
# copied into run_modules by a migration
OLDER_FORM = {"store/catalog.py", "store/modules.py"}
RETIRED = {
    "a layout's one-encoder sizes": re.compile(r"\.enc_(tp|pp|dp|ranks)\b"),
    "the trainer state's one encoder": re.compile(r"\benc_(shape|plan)\b"),
    "the grids' one encoder": re.compile(r"\bgrids\.encoder\b|\.encoder\.pgc\b"),
    "the aliases of batch.flatten": re.compile(r"\b(encoder_inputs|audio_inputs)\b"),
}


def _sources() -> list[tuple[str, str]]:
    root = REPO / "mimo_jobs"
    return [
        (str(p.relative_to(root)), p.read_text()) for pkg in AREA for p in sorted((root / pkg).rglob("*.py"))
    ]


@pytest.mark.parametrize("what", list(RETIRED))
def test_the_one_encoder_names_stay_retired(what):
    found = [
        f"mimo_jobs/{path}:{n}: {line.strip()}"
        for path, text in _sources()
        if path not in OLDER_FORM
        for n, line in enumerate(text.splitlines(), 1)
        if RETIRED[what].search(line)
    ]
    assert not found, f"{what}: " + "; ".join(found)


FLAT = {"enc_tp", "enc_pp", "enc_dp"}
# what builds a Layout from keywords: the class and dataclasses.replace of one
BUILDERS = {"Layout", "replace"}


def _callee(call: ast.Call) -> str | None:
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None


def test_a_layout_is_built_from_its_modules_not_the_flat_keywords():
    from mimo_jobs.study.topology import Layout

    assert not FLAT & set(inspect.signature(Layout).parameters), (
        "Layout takes encoders=(ModuleShape(...), ...)"
    )
    found = []
    for top in ("mimo_jobs", "benchmarks", "tests"):
        for p in sorted((REPO / top).rglob("*.py")):
            for node in ast.walk(ast.parse(p.read_text())):
                if isinstance(node, ast.Call) and _callee(node) in BUILDERS:
                    flat = sorted(FLAT & {k.arg for k in node.keywords})
                    if flat:
                        found.append(
                            f"{p.relative_to(REPO)}:{node.lineno}: {_callee(node)}({', '.join(flat)}=...)"
                        )
    assert not found, "build the module form, encoders=(ModuleShape(name, tp, pp, dp), ...): " + "; ".join(
        found
    )


def test_only_from_dict_reads_a_records_flat_encoder():
    from mimo_jobs.study.topology import Layout, ModuleShape

    record = {"nodes": 1, "gpus_per_node": 8, "enc_tp": 2, "enc_pp": 1, "enc_dp": 3, "llm_dp": 2}
    lay = Layout.from_dict(record)
    assert lay.encoders == (ModuleShape("vision", 2, 1, 3),) and lay.llm_dp == 2
    assert Layout.from_dict(lay.to_dict()) == lay and lay.to_dict()["enc_dp"] == 3


def _fields(path: str, cls: str) -> set[str]:
    tree = ast.parse((REPO / "mimo_jobs" / path).read_text())
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    return {s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}


def test_the_per_module_structures_have_no_one_module_fields():
    assert "encoder" not in _fields("trainer/parallel/grids.py", "Grids")
    assert not {"enc_shape", "enc_plan"} & _fields("trainer/build.py", "TrainState")
    # MockConfig.one_module is the one place the older one-module form becomes towers
    assert not {"patch_size", "downsample", "audio"} & _fields("data/mock.py", "MockConfig")

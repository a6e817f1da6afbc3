"""Hostile model descriptions to `plan --model`, `validate` and `ingest --model`: YAML or a HuggingFace
config.json nested far past Python's recursion limit, a key given twice, a billion layers, a missing
hf_config of a study in the working directory. Each is one line naming the argument or file and what is
wrong, exit 2, no traceback (mimo_jobs/strictread.py reads them; model/fields.py bounds the sizes). One line
per case (see tests/helpers/hostile.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import STUDIES
from helpers.hostile import Case, run_case

BASE = (STUDIES / "cpu_local.yaml").read_text()
DEEP_JSON = '{"model_type": "qwen2", "x": ' + "[" * 100_000 + "]" * 100_000 + "}"
DEEP_ARG = "{llm: " + "[" * 5_000 + "]" * 5_000 + "}"  # within the 16,384 characters an argument holds


def model(description: str) -> str:
    assert "  model: tiny\n" in BASE
    return BASE.replace("  model: tiny\n", f"  model: {description}\n", 1)


def names_its_folder(tmp: Path, out: str) -> None:
    assert f"no such file: missing.json (relative to {tmp})" in out, out


PLAN = ["plan", "--nodes", "1", "--gbs", "64", "--model"]
V = ["validate", "s.yaml"]  # run in the case's directory: the study's folder is "."

CASES = [
    Case("plan-deep-yaml", [*PLAN, DEEP_ARG], 2, ("--model", "nested more than 32 levels deep")),
    Case("plan-key-twice", [*PLAN, "{llm: qwen2.5-7b, llm: tiny}"], 2,
         ("--model", "key 'llm' appears twice in the same mapping")),
    Case("plan-deep-config-json", [*PLAN, "{tmp}/config.json"], 2,
         ("config.json: nested more than 32 levels deep",), files={"config.json": DEEP_JSON}),
    Case("plan-billion-layers", [*PLAN, "{llm: {preset: qwen2.5-7b, num_layers: 1000000000}}"], 2,
         ("llm.num_layers: 1,000,000,000 is beyond any model this plans or trains; at most 1,024",)),
    Case("validate-deep-hf-config", V, 2, ("c.json: nested more than 32 levels deep",),
         files={"s.yaml": model("{encoder: tiny, llm: {hf_config: c.json}}"), "c.json": DEEP_JSON}),
    Case("validate-billion-layers", V, 2, ("llm.num_layers: 1,000,000,000", "at most 1,024"),
         files={"s.yaml": model("{encoder: tiny, llm: {preset: tiny, num_layers: 1000000000}}")}),
    Case("validate-missing-hf-config", V, 2, ("llm.hf_config",), check=names_its_folder,
         files={"s.yaml": model("{encoder: tiny, llm: {hf_config: missing.json}}")}),
    Case("ingest-model-key-twice", ["ingest", "{tmp}/slurm-1.out", "--model", "{llm: tiny, llm: tiny}"], 2,
         ("--model", "key 'llm' appears twice"), files={"slurm-1.out": "hello\n"}),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_model(case: Case, tmp_path: Path) -> None:
    run_case(case, tmp_path)

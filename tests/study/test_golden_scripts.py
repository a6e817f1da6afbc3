"""Golden rendered scripts: the production and CPU studies' sbatch.sh and launch.sh, byte for byte.

A template or context change shows up here as a reviewable diff of tests/study/golden/. After an intended
change, regenerate them with `MIMO_JOBS_UPDATE_GOLDEN=1 python3 -m pytest tests/study/test_golden_scripts.py`
and review `git diff tests/study/golden`. The runs root is written as /runs so the files do not depend on
where the test ran; study files are read with an empty environment (their documented defaults).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from helpers import STUDIES
from mimo_jobs.study.load import load_study
from mimo_jobs.study.render import render_study

GOLDEN = Path(__file__).parent / "golden"
STUDY_FILES = ("scale_33n_68n_100n.yaml", "cpu_local.yaml", "megatron_gpt_mock.yaml")
SCRIPTS = ("sbatch.sh", "launch.sh")
UPDATE = os.environ.get("MIMO_JOBS_UPDATE_GOLDEN") == "1"


def _rendered(study_file: str, root: Path) -> dict[str, str]:
    """relative path -> text of every rendered script, with the runs root written as /runs."""
    out = {}
    for r in render_study(load_study(STUDIES / study_file, env={}), root):
        for name in SCRIPTS:
            rel = f"{r.run.study}/{r.run.name}/{name}"
            out[rel] = (r.run_dir / name).read_text().replace(str(root), "/runs")
    return out


@pytest.mark.parametrize("study_file", STUDY_FILES)
def test_rendered_scripts_match_the_golden_files(study_file, tmp_path):
    got = _rendered(study_file, tmp_path.resolve())
    assert got, f"{study_file} rendered no scripts"
    if UPDATE:
        for rel, text in got.items():
            (GOLDEN / rel).parent.mkdir(parents=True, exist_ok=True)
            (GOLDEN / rel).write_text(text)
    study_dir = GOLDEN / next(iter(got)).split("/")[0]
    on_disk = {str(p.relative_to(GOLDEN)) for p in study_dir.rglob("*.sh")}
    assert on_disk == set(got), f"golden files differ from the rendered runs: {sorted(on_disk ^ set(got))}"
    for rel, text in got.items():
        want = (GOLDEN / rel).read_text()
        assert text == want, (
            f"{rel} differs from tests/study/golden/{rel} (MIMO_JOBS_UPDATE_GOLDEN=1 regenerates)"
        )

"""`predict` and `validate` on a study holding a packaged-trainer point and a point running its own command,
with no trainer.model written: the packaged point is priced as the default preset it trains, the command's
point is not priced at all (its program builds what it builds), and both commands say why."""

from __future__ import annotations

import json

import yaml

from helpers.ingest_runs import study_doc
from helpers.submit import cli
from mimo_jobs.study.priced import NO_MODEL


def _study(path):
    doc = study_doc(name="mixed", nodes=(1,), gbs=8, train_iters=20)
    del doc["trainer"]["model"]
    point = doc["matrix"]["points"][0]
    doc["matrix"]["points"] = [point, {**point, "command": "python train.py --gbs {{ gbs }}"}]
    path.write_text(yaml.safe_dump(doc))
    return path


def test_predict_and_validate_skip_a_command_without_model(tmp_path):
    f = _study(tmp_path / "mixed.yaml")
    doc = json.loads(cli("predict", f, "--json", check=True).stdout)
    assert [r["name"] for r in doc["runs"]] == ["1n-e1x1-l1x1x1-g8"] and doc["model"] is not None
    assert doc["unpriced"] == [
        {"name": "1n-e1x1-l1x1x1-g8-cmd", "run_id": doc["unpriced"][0]["run_id"], "why": NO_MODEL}
    ]
    out = cli("validate", f, check=True).stdout
    (own,) = [x for x in out.splitlines() if x.startswith(f"run {doc['unpriced'][0]['run_id']}")]
    assert own.endswith(f"memory not judged: {NO_MODEL}")
    assert "memory on H100" in out  # the packaged point is judged

"""trainer.init as the study file states it: one kind of source, paths made absolute, train_iters 0 only as
a conversion."""

from __future__ import annotations

import pytest
import yaml
from test_study import minimal

from mimo_jobs.study.load import load_study
from mimo_jobs.study.spec import StudyError


@pytest.mark.parametrize(
    "init, words",
    [
        ({"checkpoint": "runs/x/checkpoints", "llm": "models/llm"}, "not both"),
        ({"weights_only": True}, "names no source"),
        ({"llm": {"megatron": ""}}, "megatron"),
        ({"llm": "models/llm", "optimizer": True}, "optimizer"),
        # a path that cannot be made absolute: one line naming it, never a traceback
        ({"llm": "~nosuchuser-mimo/llm"}, "Could not determine home directory"),
        ({"encoder": "loop"}, "Symlink loop"),
        ({"llm": {"megatron": "loop/iter_0000001"}}, "loop"),
        ({"checkpoint": "~nosuchuser-mimo/ckpt"}, "Could not determine home directory"),
    ],
)
def test_bad_sources_are_refused_with_their_field(tmp_path, init, words):
    doc = minimal()
    doc["trainer"]["init"] = init
    (tmp_path / "loop").symlink_to("loop")
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump(doc))
    with pytest.raises(StudyError) as e:
        load_study(f, env={})
    text = str(e.value) + "".join(str(p) for p in e.value.problems)
    assert "trainer.init" in text and words in text, text


def test_every_source_is_found_beside_the_study_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "studies").mkdir()
    doc = minimal()
    doc["trainer"]["init"] = {"llm": {"megatron": "ckpts/llm"}, "encoder": "models/vit"}
    f = tmp_path / "studies" / "s.yaml"
    f.write_text(yaml.safe_dump(doc))
    init = load_study(f, env={}).trainer.init
    assert init.llm.megatron == str(tmp_path / "studies" / "ckpts" / "llm")
    assert init.encoder == str(tmp_path / "studies" / "models" / "vit")
    # a mimo-jobs checkpoint too (the one path rule, study/paths.py): ../runs from a study in studies/
    doc["trainer"]["init"] = {"checkpoint": "../runs/s/a/checkpoints"}
    f.write_text(yaml.safe_dump(doc))
    assert load_study(f, env={}).trainer.init.checkpoint == str(tmp_path / "runs/s/a/checkpoints")


def test_zero_iterations_only_convert(tmp_path):
    doc = minimal()
    doc["trainer"]["train_iters"] = 0
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump(doc))
    with pytest.raises(StudyError) as e:
        load_study(f, env={})
    assert "train_iters" in "".join(str(p) for p in e.value.problems)
    doc["trainer"]["init"] = {"checkpoint": str(tmp_path)}
    f.write_text(yaml.safe_dump(doc))
    assert load_study(f, env={}).trainer.train_iters == 0

"""Run ids: a hash of what a run is. A field added to the study format later leaves the ids of studies that do
not use it unchanged (a completed run is never run again after an upgrade), and changes the id once set."""

from __future__ import annotations

import pytest
from test_study import minimal

from mimo_jobs.study.expand import id_payload, runs_of
from mimo_jobs.study.load import parse_study
from mimo_jobs.study.spec import DataSpec, InitSpec, PointSpec, StudyError, StudySpec, TrainerSpec


def _ids(doc: dict) -> list[str]:
    return [r.run_id for r in runs_of(parse_study(doc))]


def test_later_fields_at_their_default_are_not_hashed():
    t = TrainerSpec(train_iters=3)
    assert "init" not in id_payload(t) and "command" not in id_payload(t)
    assert "seed" in id_payload(t)  # an original field is hashed at its default too
    p = PointSpec(nodes=1, gbs=2)
    assert "command" not in id_payload(p)


def test_setting_a_later_field_changes_the_id():
    doc = minimal()
    base = _ids(doc)
    doc["trainer"]["init"] = {"checkpoint": "runs/x/checkpoints"}
    assert all(a != b for a, b in zip(base, _ids(doc), strict=True))
    assert len(set(base)) == len(base)


def test_every_later_field_names_a_real_field():
    for cls in (TrainerSpec, PointSpec, StudySpec, DataSpec, InitSpec):
        assert cls.ID_LATER <= set(cls.model_fields), cls


def test_init_of_one_encoder_keeps_its_ids_and_a_named_module_changes_them(tmp_path):
    (tmp_path / "vit").mkdir()
    (tmp_path / "whisper").mkdir()
    doc = minimal()
    doc["trainer"]["init"] = {"encoder": str(tmp_path / "vit")}
    one = parse_study(doc).trainer.init
    # the payload of `encoder:` alone is what it was before trainer.init.encoders existed
    assert set(id_payload(one)) == {"llm", "encoder", "checkpoint", "weights_only"}
    base = _ids(doc)
    doc["trainer"]["init"]["encoders"] = {"audio": str(tmp_path / "whisper")}
    assert all(a != b for a, b in zip(base, _ids(doc), strict=True))


def test_trainer_attention_keeps_the_ids_at_its_default_and_changes_them_when_unfused():
    doc = minimal()
    base = _ids(doc)
    assert "attention" not in id_payload(parse_study(doc).trainer)
    doc["trainer"]["attention"] = "sdpa"  # written out at its default: the same runs
    assert _ids(doc) == base
    doc["trainer"]["attention"] = "unfused"
    assert all(a != b for a, b in zip(base, _ids(doc), strict=True))
    doc["trainer"]["attention"] = "flash"
    with pytest.raises(StudyError, match=r"trainer.attention: Input should be 'sdpa' or 'unfused'"):
        parse_study(doc)

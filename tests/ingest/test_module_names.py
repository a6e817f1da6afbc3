"""The one rule between a study's module names and the trainer's slot names (contract/modules.py): both
ways, for every name a study may give a module, and the planner's one image encoder."""

from __future__ import annotations

import pytest

from mimo_jobs.contract import modules as M
from mimo_jobs.model import arch


def test_the_vision_module_is_the_models_one():
    assert M.VISION == arch.VISION


@pytest.mark.parametrize(
    "name, slot",
    [
        ("vision", "encoder"),  # every one-encoder checkpoint's name
        ("audio", "encoder.audio"),
        ("vision_hr", "encoder.vision_hr"),
        ("encoder", "encoder.encoder"),  # a study may name a module so: its slot stays apart
        ("language", "encoder.language"),
        ("llm", "language"),
    ],
)
def test_each_name_and_its_slot_map_both_ways(name, slot):
    assert arch.module_name_problem(name) is None or name == "llm"
    assert M.trainer_slot(name) == slot
    assert M.study_name(slot) == name


def test_the_planners_one_encoder_is_the_runs_one_module():
    assert M.study_name("encoder", ["vision"]) == "vision"
    assert M.study_name("encoder", []) == "vision"  # a run known only from its logs: the one of `encoder:`
    assert M.study_name("encoder", ["siglip"]) == "siglip"
    assert M.study_name("audio", ["vision", "audio"]) == "audio"  # already the study's
    assert M.study_name("llm") == "llm"

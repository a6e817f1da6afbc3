"""The trainer's encoder modules of a vision + audio model (studies/cpu_omni.yaml), built as the --reference
build builds them in a real process: each module under its own name, the vision tower's weights those of the
same seed's one-encoder model (its name and canonical init unchanged), the audio encoder's position table the
sinusoids after the random init, and freezing by module name."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers.launch import worker_env
from helpers.trainer import OMNI_STUDY, make_run_yaml, study_run_yaml

WORKER = Path(__file__).with_name("encoder_modules_worker.py")

pytestmark = (
    pytest.mark.slow
)  # a process that builds the models three times: CI runs it, the fast default not


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    d = tmp_path_factory.mktemp("modules")
    ryamls = [
        study_run_yaml(d / "omni", OMNI_STUDY, 0, train_iters=3),
        make_run_yaml(d / "tiny", gpn=2, gbs=4, llm={"dp": 2}, colocated=True),
        study_run_yaml(d / "frozen", OMNI_STUDY, 0, train_iters=3, freeze={"encoders": {"audio": True}}),
    ]
    out = d / "states.pt"
    p = subprocess.run(
        [sys.executable, str(WORKER), str(out), *map(str, ryamls)],
        capture_output=True,
        text=True,
        timeout=300,
        env=worker_env(),
        check=False,
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    return torch.load(out, weights_only=False)


def _mods(state) -> dict:
    return {m["name"]: m for m in state["modules"]}


def test_each_module_has_its_own_name_slot_and_projector(built):
    omni = built[0]
    assert [(m["name"], m["modality"]) for m in omni["modules"]] == [
        ("encoder", "image"),
        ("encoder.audio", "audio"),
        ("language", ""),
    ]
    assert omni["slots"] == omni["optimizers"] == ["encoder", "encoder.audio", "language"]
    audio = _mods(omni)["encoder.audio"]["state"]
    # its own projector from the audio width (16) into the LLM's (32)
    assert audio["projector.encoder.linear_fc1.weight"].shape == (32, 16)


def test_the_vision_tower_keeps_the_one_encoder_models_weights(built):
    omni, tiny = _mods(built[0]), _mods(built[1])
    assert list(tiny) == ["encoder", "language"]
    a, b = omni["encoder"]["state"], tiny["encoder"]["state"]
    assert sorted(a) == sorted(b)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_the_audio_position_table_is_the_sinusoids_after_the_random_init(built):
    from mimo_jobs.trainer.model.audio_encoder import sinusoids

    audio = _mods(built[0])["encoder.audio"]["state"]
    assert torch.equal(audio["encoder.embed_positions"], sinusoids(32, 16))
    w = audio["encoder.conv1.weight"]
    assert 0.01 < float(w.std()) < 0.03  # drawn, as every weight of the canonical init


def test_freezing_the_audio_encoder_by_name_leaves_the_others_training(built):
    mods = _mods(built[2])
    assert {n: m["frozen"] for n, m in mods.items()} == {
        "encoder": False,
        "encoder.audio": True,
        "language": False,
    }
    assert built[2]["optimizers"] == ["encoder", "language"]
    assert built[2]["slots"] == ["encoder", "encoder.audio", "language"]

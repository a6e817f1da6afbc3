"""What the trainer refuses at start-up, `validate` refuses first (mimo_jobs/study/runtime_rules.py owns each
rule): mock image sizes against the encoder's patch, both modules frozen, bf16 on CPU, TP communication
overlap without Transformer Engine's userbuffers, a tracker whose package
is missing, an encoder module the data gives nothing of its kind, two modules of one kind on a dataset, a mock clip outside an audio
module's window. Each rule on a study that passes and on the
same study changed to break it."""

from __future__ import annotations

import copy

import pytest
import yaml
from typer.testing import CliRunner

from helpers import REPO
from mimo_jobs.cli.app import app
from mimo_jobs.contract.mocktokens import MIN_VOCAB
from mimo_jobs.model.arch import EncoderArch
from mimo_jobs.study.diagnose import diagnose_data
from mimo_jobs.study.runtime_rules import (
    image_size_problems,
    package_installed,
    runtime_problems,
    tracker_problems,
)

CPU = REPO / "studies/cpu_local.yaml"
runner = CliRunner()

BREAKS = {
    "image-size": lambda d: d["trainer"].setdefault("data", {}).update(image_sizes=[8, 10]),
    "freeze": lambda d: d["trainer"].update(freeze={"encoder": True, "llm": True}),
    "precision": lambda d: d["trainer"].update(precision="bf16"),
    "tp-comm-overlap": lambda d: d["trainer"].update(tp_comm_overlap=True),
    # a vocabulary smaller than the mock data's token ids
    "data": lambda d: d["trainer"].update(
        model={"encoder": "tiny", "llm": {"preset": "tiny", "vocab_size": 12}}
    ),
    # an image module, and mock data without images
    "module-data": lambda d: d["trainer"].setdefault("data", {}).update(text_only_fraction=1.0),
}
OMNI = REPO / "studies/cpu_omni.yaml"


def _validate(tmp_path, doc: dict):
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(doc, sort_keys=False))
    return runner.invoke(app, ["validate", str(p)], env={"COLUMNS": "250"})


def test_the_base_study_passes(tmp_path):
    r = _validate(tmp_path, yaml.safe_load(CPU.read_text()))
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize("rule", sorted(BREAKS))
def test_validate_refuses_what_the_trainer_would(tmp_path, rule):
    doc = copy.deepcopy(yaml.safe_load(CPU.read_text()))
    BREAKS[rule](doc)
    r = _validate(tmp_path, doc)
    assert r.exit_code == 2, r.output
    assert f"[{rule}]" in r.output
    assert r.output.count(f"[{rule}]") == 1  # one problem, not one per run


def test_the_trainer_preflight_refuses_the_same(tmp_path):
    pytest.importorskip("torch")
    from mimo_jobs.data.mock import DataConfigError, mock_config
    from mimo_jobs.trainer.main import PreflightError, preflight

    for rule, brk in BREAKS.items():
        doc = copy.deepcopy(yaml.safe_load(CPU.read_text()))
        brk(doc)
        run = diagnose_data(doc, "s", env={}).runs[0]
        with pytest.raises((PreflightError, DataConfigError)) as e:
            preflight(run, {}, reference=True)
        expected = runtime_problems(run.trainer, "cpu", package_installed, _model_of(run))[0]
        assert expected.message in str(e.value), rule
    assert mock_config  # the image rule reaches the trainer through the mock provider


def _model_of(run):
    from mimo_jobs.predict.run import shape_of

    return shape_of(run.layout, run.trainer).preset


def test_the_omni_study_passes(tmp_path):
    r = _validate(tmp_path, yaml.safe_load(OMNI.read_text()))
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize(
    "data, line",
    [
        (
            {"audio_fraction": 0.0},
            "trainer.data.audio_fraction: [module-data] the encoder module 'audio' (audio) gets no audio from "
            "the mock data",
        ),
        (
            {"text_only_fraction": 1.0},
            "trainer.data.text_only_fraction: [module-data] the encoder module 'vision' (image) gets no image "
            "from the mock data",
        ),
    ],
)
def test_a_module_with_no_data_of_its_kind_is_one_line_and_exit_2(tmp_path, data, line):
    doc = yaml.safe_load(OMNI.read_text())
    doc["trainer"].setdefault("data", {}).update(data)
    r = _validate(tmp_path, doc)
    assert r.exit_code == 2, r.output
    flat = " ".join(r.output.split())
    assert flat.count(line) == 1, r.output


def test_audio_data_without_an_audio_module_is_refused(tmp_path):
    doc = copy.deepcopy(yaml.safe_load(CPU.read_text()))
    doc["trainer"].setdefault("data", {}).update(audio_fraction=0.5, audio_frames=[16])
    r = _validate(tmp_path, doc)
    assert r.exit_code == 2, r.output
    assert "0.5 of the samples carry audio but trainer.model has no audio encoder" in " ".join(
        r.output.split()
    )


@pytest.mark.parametrize(
    "field, value", [("norm_epsilon", float("nan")), ("norm_epsilon", 0.0), ("rotary_base", -1.0)]
)
def test_model_numbers_the_trainer_cannot_run_are_refused(tmp_path, field, value):
    # each would make every iteration NaN, found only after the job ran
    doc = copy.deepcopy(yaml.safe_load(CPU.read_text()))
    doc["trainer"]["model"] = {"encoder": "tiny", "llm": {"preset": "tiny", field: value}}
    r = _validate(tmp_path, doc)
    assert r.exit_code == 2, r.output
    assert f"llm.{field}: must be a finite number above 0" in r.output


def test_image_sizes_rule():
    # patch 4 and a 2 x 2 pixel shuffle: 8 px a token along a side, by the family's rule
    enc = EncoderArch("clip", 1, 32, 4, 64, patch_size=4, image_size=32, downsample=2)
    tokens = lambda side: enc.tokens_for(side, side)  # noqa: E731
    assert image_size_problems([8, 16], 8, 16, 64, 0.25, tokens) == []
    (p,) = image_size_problems([12], 8, 16, 64, 0.25, tokens)
    assert "multiple of the encoder's patch x downsample (8 px)" in p.message and p.fit == "use 8"
    (p,) = image_size_problems([32], 8, 32, 10, 0.25, tokens)  # 16 tokens leave no room for text in 10
    assert "does not fit seq_length=10" in p.message
    assert image_size_problems([], 8, 16, 64, 1.0, tokens) == []
    assert image_size_problems([], 8, 16, 64, 0.5, tokens)


def test_tracker_rule_asks_the_environment():
    doc = yaml.safe_load(CPU.read_text())
    doc["trainer"]["wandb"] = {"project": "p"}
    trainer = diagnose_data(doc, "s", env={}).runs[0].trainer
    missing = tracker_problems(trainer, lambda name: False)
    assert [p.path for p in missing] == ["trainer.wandb", "trainer.tensorboard"]
    assert tracker_problems(trainer, lambda name: True) == []
    doc["trainer"]["wandb"]["mode"] = "disabled"
    doc["trainer"]["tensorboard"] = False
    assert tracker_problems(diagnose_data(doc, "s", env={}).runs[0].trainer, lambda name: False) == []


# every start-up refusal of a vision + audio model: the `validate` line and the trainer preflight's words
OMNI_BREAKS = {
    # the feature extractor's 30 s padding: 3000 frames, far above tiny-audio's window
    "audio-clip": (
        lambda d: d["trainer"]["data"].update(audio_frames=[16, 3000]),
        "trainer.data.audio_frames: [audio-clip] a clip of 3000 mel frames is longer than the encoder takes",
    ),
    "audio-clip-short": (
        lambda d: d["trainer"]["data"].update(audio_frames=[1]),
        "trainer.data.audio_frames: [audio-clip] a clip of 1 mel frames gives 1 time steps, fewer than the "
        "pooling stride 2: no audio token",
    ),
    # two image modules each fill their own placeholders on mock data, but a dataset's samples carry one
    # placeholder run per marker
    "module-kind": (
        lambda d: (
            d["trainer"]["model"]["encoders"].update(audio="tiny"),
            d["trainer"].update(data={"provider": "energon", "path": str(REPO)}),
        ),
        "trainer.model.encoders: [module-kind] vision, audio all embed image: a dataset's samples",
    ),
    "module-data": (
        lambda d: d["trainer"]["data"].update(audio_fraction=0.0),
        "trainer.data.audio_fraction: [module-data] the encoder module 'audio' (audio) gets no audio",
    ),
    # a 16 px image (16 tokens) fits 20 positions and so does a 48-frame clip (12 tokens), not both at once
    "clip-room": (
        lambda d: (
            d["trainer"]["data"].update(image_sizes=[16], audio_frames=[48]),
            d["trainer"].update(seq_length=20),
        ),
        "trainer.seq_length: [audio-clip] 20 cannot hold the largest image (16 tokens) and clip (12 tokens) "
        "plus 2 text tokens",
    ),
    # the image placeholder is the vocabulary's last id, the audio one the id before: one id more than a
    # vision-only model's least vocabulary
    "vocab": (
        lambda d: d["trainer"]["model"].update(llm={"preset": "tiny", "vocab_size": MIN_VOCAB}),
        f"trainer.model.llm.vocab_size: [data] the mock provider needs a vocabulary of at least {MIN_VOCAB + 1} "
        "tokens for its text and the placeholders of vision, audio (2 ids at the vocabulary's end), the model "
        f"has {MIN_VOCAB}",
    ),
    # two vision towers on mock data: the second takes the id below the audio placeholder's, kept free
    "vocab-two-towers": (
        lambda d: (
            d["trainer"]["model"].update(
                encoders={"vision": "tiny", "vision2": "tiny"},
                llm={"preset": "tiny", "vocab_size": MIN_VOCAB + 1},
            ),
            d["trainer"]["data"].update(audio_fraction=0.0, audio_frames=[]),
        ),
        f"trainer.model.llm.vocab_size: [data] the mock provider needs a vocabulary of at least {MIN_VOCAB + 2} "
        "tokens for its text and the placeholders of vision, vision2 (3 ids at the vocabulary's end)",
    ),
}


def _omni_broken(case: str) -> dict:
    doc = copy.deepcopy(yaml.safe_load(OMNI.read_text()))
    OMNI_BREAKS[case][0](doc)
    return doc


@pytest.mark.parametrize("case", sorted(OMNI_BREAKS))
def test_validate_refuses_each_omni_start_up_refusal_once(tmp_path, case):
    r = _validate(tmp_path, _omni_broken(case))
    assert r.exit_code == 2, r.output
    assert " ".join(r.output.split()).count(OMNI_BREAKS[case][1]) == 1, r.output


@pytest.mark.parametrize("case", sorted(OMNI_BREAKS))
def test_the_preflight_refuses_each_omni_case_with_validates_words(case):
    pytest.importorskip("torch")
    from mimo_jobs.trainer.main import PreflightError, preflight

    path, _, words = OMNI_BREAKS[case][1].partition(": [")
    words = words.partition("] ")[2]
    for run in diagnose_data(_omni_broken(case), "s", env={}).runs:
        with pytest.raises(PreflightError) as e:
            preflight(run, {}, reference=True)
        assert str(e.value).startswith(f"run.yaml: {path}: {words}"), str(e.value)


@pytest.mark.parametrize("rule", ["freeze", "precision"])
def test_the_trainers_own_build_guard_says_the_rules_words(rule):
    """build_state refuses a run.yaml that skipped the preflight (both modules frozen, bf16 on a CPU) before
    any collective, in the words of the rule validate and the preflight apply."""
    pytest.importorskip("torch")
    from datetime import timedelta

    from mimo_jobs.trainer.build import build_state

    doc = copy.deepcopy(yaml.safe_load(CPU.read_text()))
    BREAKS[rule](doc)
    run = diagnose_data(doc, "s", env={}).runs[0]
    expected = runtime_problems(run.trainer, "cpu", package_installed, _model_of(run))[0]
    assert expected.rule == rule
    with pytest.raises(ValueError) as e:
        build_state(run, run.rank_layout(), True, timedelta(seconds=5))
    assert str(e.value) == str(expected)


def _energon_doc(path) -> dict:
    doc = copy.deepcopy(yaml.safe_load(CPU.read_text()))
    doc["trainer"]["data"] = {"provider": "energon", "path": str(path)}
    return doc


def test_a_folder_that_is_not_an_energon_dataset_is_refused_by_validate_and_the_provider_alike(tmp_path):
    """The energon provider checks its path before any loader exists (data/check.py); validate runs the
    same check and prints its words, once for every run."""
    from mimo_jobs.data.check import check_data_path
    from mimo_jobs.data.errors import DataError

    folder = tmp_path / "images"
    folder.mkdir()
    with pytest.raises(DataError) as want:
        check_data_path(str(folder))
    r = _validate(tmp_path, _energon_doc(folder))
    assert r.exit_code == 2, r.output
    flat = " ".join(r.output.split())
    assert flat.count(f"trainer.data.path: [dataset] {want.value}") == 1, r.output
    assert "is not a prepared energon dataset (no .nv-meta/dataset.yaml)" in str(want.value)

    pytest.importorskip("megatron.energon")
    from mimo_jobs.data.energon_provider import make_energon_provider

    run = diagnose_data(_energon_doc(folder), "s", env={}).runs[0]
    with pytest.raises(DataError) as got:
        make_energon_provider(run, run.rank_layout(), [0], True, True)
    assert str(got.value) == str(want.value)


def _packing_doc(path, layers: str | None) -> dict:
    doc = _energon_doc(path)
    doc["trainer"]["data"]["packing"] = True
    doc["cluster"].update(accelerator="gpu")
    if layers:
        doc["cluster"]["hardware"] = {"layers": layers}
    return doc


def test_packing_on_transformer_engine_is_refused_by_validate_and_the_preflight_alike(tmp_path):
    """A GPU study planned on Transformer Engine's layers (the default) cannot pack: validate says so in the
    words the trainer's preflight says them on a rank with TE; planned on the local layers it passes (their
    fused softmax, which only the host can tell, stays the preflight's to judge)."""
    pytest.importorskip("torch")
    from mimo_jobs.trainer.main import kernel_problem
    from mimo_jobs.trainer.model.kernels import Installed, kernels_for

    r = _validate(tmp_path, _packing_doc(tmp_path / "ds", None))
    assert r.exit_code == 2, r.output
    flat = " ".join(r.output.split())
    run = diagnose_data(_packing_doc(tmp_path / "ds", None), "s", env={}).runs[0]
    said = kernel_problem(run, kernels_for(True, Installed(te=True)))
    path, _, rest = said.partition(": ")
    assert flat.count(f"{path}: [packing] {rest.replace('; ', ' -> ', 1)}") == 1, (said, r.output)
    assert "Transformer Engine's causal attention ignores" in said
    local = " ".join(_validate(tmp_path, _packing_doc(tmp_path / "ds", "local")).output.split())
    assert "[packing]" not in local


def test_a_tp_an_encoder_module_cannot_split_is_named_alike_by_validate_and_the_trainers_guard(tmp_path):
    """Colocated at LLM TP 4 the audio module (2 heads) cannot split: validate names the module's field
    (study/expand.split_problems), and the trainer's own guard (models.unsupported, the preflight's check
    for a run.yaml that skipped validate) says the same words of the same module."""
    pytest.importorskip("torch")
    import dataclasses

    from mimo_jobs.model.resolve import arch_of
    from mimo_jobs.study.topology import ModuleShape
    from mimo_jobs.trainer.model.models import unsupported

    doc = yaml.safe_load(OMNI.read_text())
    doc["cluster"]["gpus_per_node"] = 4
    doc["matrix"]["points"] = [{"colocated": True, "llm": {"tp": 4}}]
    r = _validate(tmp_path, doc)
    assert r.exit_code == 2, r.output
    want = "encoders.audio.tp=4 does not divide encoders.audio.num_attention_heads=2"
    assert f"[model-tp] {want}" in " ".join(r.output.split()), r.output

    doc["matrix"]["points"] = [{"colocated": True, "llm": {"tp": 2, "dp": 2}}]
    run = diagnose_data(doc, "s", env={}).runs[0]
    mods = tuple(ModuleShape(m.name, 4, 1, 1) for m in run.layout.encoders)
    lay = dataclasses.replace(run.layout, llm_tp=4, llm_dp=1, encoders=mods)
    said = unsupported(arch_of(run.trainer.model), lay)
    fit = "encoders.audio.tp in [1, 2] divides it"
    assert said == f"trainer.model: {want} ({fit})", said
    assert f"{want} -> {fit}" in " ".join(r.output.split()), r.output

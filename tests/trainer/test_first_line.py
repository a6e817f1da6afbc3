"""The trainer's first line names the model in a few words (run.yaml holds the description), keeps the
fields other commands read from it (`| layers <backend> |`), and is followed by one line per module saying
where its weights start."""

from __future__ import annotations

import pytest

from helpers.trainer import OMNI, OMNI_STUDY, study_run_yaml
from mimo_jobs.model.resolve import arch_of
from mimo_jobs.study.runspec import load_run_yaml
from mimo_jobs.study.spec import InitSpec, MegatronCheckpoint
from mimo_jobs.trainer.observe.iterlog import init_lines, layout_line, model_summary

WHOLE_DESCRIPTION = 400  # characters: the description of the packaged omni model alone is longer


def test_the_first_line_names_the_model_without_its_description(tmp_path) -> None:
    run, _ = load_run_yaml(study_run_yaml(tmp_path / "run", OMNI_STUDY, 0))
    assert len(str(run.trainer.model)) > WHOLE_DESCRIPTION  # what the line held before
    line = layout_line(run, run.rank_layout(), "hetero", "gloo", "layers local | fused none")
    assert "{" not in line and len(line) < 2 * WHOLE_DESCRIPTION, line
    assert f"| model {model_summary(run.trainer.model)} seq=" in line and "| layers local |" in line
    assert model_summary(OMNI).endswith("(vision tiny, audio tiny-audio, llm tiny)"), model_summary(OMNI)
    assert model_summary("tiny") == "tiny"
    assert model_summary({"encoder": {"hf_config": "/w/clip/config.json"}, "llm": {"num_layers": 2}}) == (
        "custom (encoder config.json, llm inline)"
    )


@pytest.mark.parametrize(
    ("init", "want"),
    [
        (None, ["vision: random init", "audio: random init", "llm: random init"]),
        (
            InitSpec(encoders={"audio": "/w/whisper"}, llm="/w/qwen"),
            ["vision: random init", "audio: loaded from /w/whisper", "llm: loaded from /w/qwen"],
        ),
        (
            InitSpec(encoders={"vision": "/w/siglip"}, llm=MegatronCheckpoint(megatron="/w/mcore")),
            [
                "vision: loaded from /w/siglip",
                "audio: random init",
                "llm: loaded from the Megatron checkpoint /w/mcore",
            ],
        ),
        (
            InitSpec(checkpoint="/w/ckpts", weights_only=True),
            ["every module: from the checkpoint /w/ckpts (weights only)"],
        ),
    ],
)
def test_one_line_per_module_says_where_its_weights_start(init, want) -> None:
    assert init_lines(init, arch_of(OMNI)) == want

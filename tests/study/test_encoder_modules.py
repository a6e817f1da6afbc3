"""Several encoder modules, each under its name: the study file's `trainer.model.encoders` and a point's
`encoders`, their errors through the real command line (exit 2 and one line naming the field), the topology
of two encoders (rank ranges, each module's fan, colocated), run names and ids, and a two-encoder study that
validates and renders scripts bash and shellcheck accept."""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess

import pytest
import yaml

from helpers.submit import cli
from mimo_jobs.study.expand import runs_of
from mimo_jobs.study.load import parse_study
from mimo_jobs.study.render import render_study
from mimo_jobs.study.runspec import load_run_yaml
from mimo_jobs.study.topology import Layout, ModuleShape, TopologyError, check, module_ranges, rank_layout

TWO = {
    "name": "two",
    "cluster": {"gpus_per_node": 8},
    "trainer": {
        "model": {
            "encoders": {"vision": {"preset": "tiny"}, "audio": "tiny-audio"},
            "llm": {"preset": "tiny"},
        },
        "data": {"audio_fraction": 0.5, "audio_frames": [16]},
        "train_iters": 5,
    },
    "matrix": {
        "points": [
            {
                "nodes": 4,
                "encoders": {"vision": {"tp": 1, "dp": 4}, "audio": {"tp": 2, "dp": 2}},
                "llm": {"tp": 2},
                "gbs": 48,
            },
            {"nodes": 4, "colocated": True, "llm": {"tp": 2}, "gbs": 64},
        ]
    },
}


def two(**edits) -> dict:
    doc = copy.deepcopy(TWO)
    for path, value in edits.items():
        cur = doc
        *head, last = path.split("/")
        for k in head:
            cur = cur[int(k)] if isinstance(cur, list) else cur[k]
        if value is None:
            del cur[last]
        else:
            cur[last] = value
    return doc


def validate(doc: dict, tmp_path) -> subprocess.CompletedProcess:
    f = tmp_path / "study.yaml"
    f.write_text(yaml.safe_dump(doc, sort_keys=False))  # the modules in the order written
    return cli("validate", f)


# ---------------------------------------------------------------- the study file's errors, via the CLI


@pytest.mark.parametrize(
    "edits, line",
    [
        (
            {"trainer/model/encoder": {"preset": "tiny"}},
            "trainer.model: [schema] encoders.vision: two modules named 'vision': `encoder:` is the module 'vision'",
        ),
        (
            {"trainer/model/encoders": {"vis-ion": {"preset": "tiny"}}},
            "encoders.vis-ion: 'vis-ion' cannot name an encoder: use letters, digits and _",
        ),
        (
            {"matrix/points/0/encoders/sound": {"dp": 1}},
            "matrix.points[0].encoders.sound: [schema] unknown module 'sound': the model's encoders are vision, audio",
        ),
        (
            {"matrix/points/0/encoders/audio": None},
            "matrix.points[0].encoders: [schema] no sizes for audio: a point of a model with encoders vision, audio sizes "
            "each one",
        ),
        (
            {"matrix/points/0/encoders": None},
            "matrix.points[0].encoders: [schema] no sizes for vision, audio:",
        ),
        (
            {"matrix/points/0/encoder": {"dp": 4}},
            "matrix.points[0].<root>: [schema] give encoder (the one encoder, module vision) or encoders (sizes by module name), "
            "not both",
        ),
        (
            {"matrix/points/0/encoders/a b": {"dp": 1}},
            "matrix.points[0].encoders: [schema] 'a b' cannot name an encoder",
        ),
    ],
)
def test_each_mistake_is_one_line_and_exit_2(edits, line, tmp_path):
    r = validate(two(**edits), tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    hits = [x for x in r.stderr.splitlines() if line in x]
    assert len(hits) == 1, r.stderr


def test_a_rule_broken_by_one_module_names_that_module(tmp_path):
    r = validate(
        two(
            **{
                "matrix/points/0/encoders/audio": {"tp": 2, "dp": 3},
                "matrix/points/0/llm": {"tp": 2, "dp": 11},
            }
        ),
        tmp_path,
    )
    assert r.returncode == 2
    assert "[bridge-ratio] encoders.audio.dp=3 and llm.dp=11: neither divides the other" in r.stderr
    assert "[bridge-ratio] encoders.vision.dp=4 and llm.dp=11" in r.stderr  # each module its own line


# ---------------------------------------------------------------- a two-encoder study: validate, render


def test_a_two_encoder_study_validates_with_each_module_and_is_priced(tmp_path):
    r = validate(TWO, tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "4n-vision1x4-audio2x2-l2x1x12-g48" in r.stdout and "4n-colo-l2x1x16-g64" in r.stdout
    assert "vision TP1 DP4 (ranks 0-3); audio TP2 DP2 (ranks 4-7)" in r.stdout
    assert "vision out, audio out" in r.stdout and "vision 3, audio 6" in r.stdout  # each module's fan, lanes
    assert r.stdout.count("memory on H100: fits") == 2, (
        r.stdout
    )  # priced module by module (predict/several.py)
    p = cli("predict", tmp_path / "study.yaml")
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stdout + p.stderr
    assert "not priced" not in p.stdout + p.stderr
    plan = cli("plan", "--from", tmp_path / "study.yaml", "--nodes", "4")
    assert plan.returncode == 0 and "Traceback" not in plan.stderr, plan.stdout + plan.stderr
    assert "encoders: {vision: {tp: " in plan.stdout and "colocated: true" in plan.stdout


def test_a_two_encoder_study_renders_scripts_bash_and_shellcheck_accept(tmp_path):
    rendered = render_study(parse_study(TWO), tmp_path)
    scripts = [str(p) for r in rendered for p in (r.sbatch_sh, r.launch_sh)]
    for s in scripts:
        subprocess.run(["bash", "-n", s], check=True)
    sc = shutil.which("shellcheck")
    assert sc, "shellcheck missing: tests/run.sh installs the Debian package"
    out = subprocess.run([sc, "--shell=bash", *scripts], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    het = next(r for r in rendered if not r.run.layout.colocated)
    spec, doc = load_run_yaml(het.run_dir / "run.yaml")
    assert spec == het.run  # run.yaml reads back as the same run, every module in it
    assert doc["run"]["layout"]["encoders"] == [
        {"name": "vision", "tp": 1, "pp": 1, "dp": 4},
        {"name": "audio", "tp": 2, "pp": 1, "dp": 2},
    ]
    assert [(m["name"], m["rank_start"], m["rank_end"], m["fan"]) for m in doc["plan"]["encoders"]] == [
        ("vision", 0, 4, "out"),
        ("audio", 4, 8, "out"),
    ]
    assert json.loads(json.dumps(spec.catalog_fields()["modules"]))[1]["kind"] == "audio"


# ---------------------------------------------------------------- run names and ids


def test_encoders_of_the_one_module_vision_is_encoder_same_name_same_id():
    one = {
        "name": "t",
        "cluster": {"gpus_per_node": 4, "accelerator": "cpu", "executor": "local"},
        "trainer": {"model": {"encoder": "tiny", "llm": "tiny"}, "train_iters": 5},
        "matrix": {"points": [{"nodes": 1, "encoder": {"dp": 1}, "llm": {"dp": 3}, "gbs": 6}]},
    }
    named = copy.deepcopy(one)
    named["trainer"]["model"] = {"encoders": {"vision": "tiny"}, "llm": "tiny"}
    named["matrix"]["points"][0] = {"nodes": 1, "encoders": {"vision": {"dp": 1}}, "llm": {"dp": 3}, "gbs": 6}
    a, b = runs_of(parse_study(one)), runs_of(parse_study(named))
    assert [(r.name, r.run_id) for r in a] == [(r.name, r.run_id) for r in b]
    assert a[0].name == "1n-e1x1-l1x1x3-g6"
    ids = {r.run_id for r in runs_of(parse_study(TWO))}
    assert len(ids) == 2 and not ids & {a[0].run_id}


# ---------------------------------------------------------------- topology of two encoders


def lay2(**kw) -> Layout:
    base = dict(
        nodes=4,
        gpus_per_node=8,
        encoders=(ModuleShape("vision", 1, 1, 4), ModuleShape("audio", 2, 1, 2)),
        llm_tp=2,
        llm_pp=1,
        llm_dp=12,
        gbs=48,
    )
    return Layout(**(base | kw))


def test_two_encoders_take_consecutive_rank_ranges_then_the_llm():
    p = rank_layout(lay2())
    assert [(m.name, m.rank_start, m.rank_end) for m in p.encoders] == [("vision", 0, 4), ("audio", 4, 8)]
    assert (p.enc_rank_start, p.enc_rank_end, p.llm_rank_start, p.llm_rank_end) == (0, 8, 8, 32)
    assert p.encoder_nodes == [0] and p.llm_nodes == [1, 2, 3]
    # each module's own bridge: vision 4 replicas -> 3 lanes each, audio 2 replicas -> 6 lanes each
    assert [(m.fan, m.lanes_per_encoder, m.samples_per_encoder_microbatch) for m in p.encoders] == [
        ("out", 3, 3),
        ("out", 6, 6),
    ]
    assert p.fan == "modules" and p.num_microbatches == 4


def test_one_module_fans_in_while_another_fans_out():
    mods = (ModuleShape("vision", 1, 1, 4), ModuleShape("audio", 4, 1, 1))
    p = rank_layout(lay2(nodes=2, encoders=mods, llm_tp=4, llm_dp=2, gbs=8, mbs=2))
    assert [(m.name, m.rank_start, m.rank_end) for m in p.encoders] == [("vision", 0, 4), ("audio", 4, 8)]
    assert [
        (m.fan, m.lanes_per_encoder, m.encoders_per_lane, m.samples_per_encoder_microbatch)
        for m in p.encoders
    ] == [
        ("in", 1, 2, 1),
        ("out", 2, 1, 4),
    ]
    assert (p.llm_rank_start, p.llm_rank_end) == (8, 16)


def test_every_rule_per_module_names_it():
    bad = lay2(encoders=(ModuleShape("vision", 3, 2, 4), ModuleShape("audio", 2, 1, 3)), llm_dp=10)
    got = {(v.rule, v.message.split("=")[0]) for v in check(bad)}
    assert ("encoder-pp", "encoders.vision.pp") in got
    assert ("bridge-ratio", "encoders.audio.dp") in got
    assert ("tp-within-node", "encoders.vision.tp") in got
    assert any(
        r == "tiling" and "encoders vision 3x2x4=24 + audio 2x1x3=6" in m
        for r, m in ((v.rule, v.message) for v in check(bad))
    )


def test_colocated_runs_every_module_on_every_rank_with_the_llms_tp_and_dp():
    lay = lay2(
        colocated=True,
        encoders=(ModuleShape("vision", 2, 1, 16), ModuleShape("audio", 2, 1, 16)),
        llm_dp=16,
        gbs=64,
    )
    p = rank_layout(lay)
    assert [(m.name, m.rank_start, m.rank_end, m.fan) for m in p.encoders] == [
        ("vision", 0, 32, "colocated"),
        ("audio", 0, 32, "colocated"),
    ]
    assert p.fan == "colocated" and (p.llm_rank_start, p.llm_rank_end) == (0, 32)
    off = lay2(
        colocated=True, encoders=(ModuleShape("vision", 2, 1, 16), ModuleShape("audio", 1, 1, 32)), llm_dp=16
    )
    assert [v.message for v in check(off) if v.rule == "colocated"] == [
        "colocated: the encoder runs with the LLM's TP and DP on the same ranks, got encoders.audio 1x1x32 for "
        "llm.tp=2, llm.dp=16"
    ]


def test_a_rule_broken_by_the_one_module_of_an_encoders_study_names_it_as_the_study_does():
    """One module the study names `eye` (its `encoders:` form) is `encoders.eye` in a violation; only the one
    vision encoder of the `encoder:` form is `encoder`."""
    eye = Layout(
        nodes=1, gpus_per_node=8, encoders=(ModuleShape("eye", 3, 1, 1),), llm_tp=1, llm_pp=1, llm_dp=5
    )
    flat = Layout(
        nodes=1, gpus_per_node=8, encoders=(ModuleShape("vision", 3, 1, 1),), llm_tp=1, llm_pp=1, llm_dp=5
    )
    eye_fields = {f for v in check(eye) for f in re.findall(r"encoders?(?:\.\w+)?\.tp", v.message)}
    flat_fields = {f for v in check(flat) for f in re.findall(r"encoders?(?:\.\w+)?\.tp", v.message)}
    assert eye_fields == {"encoders.eye.tp"}, [v.message for v in check(eye)]
    assert flat_fields == {"encoder.tp"}, [v.message for v in check(flat)]


def test_the_flat_encoder_sizes_of_several_encoders_are_refused_naming_the_rule():
    with pytest.raises(TopologyError, match=r"\[encoders\] 2 encoders \(vision, audio\)"):
        _ = lay2().single.dp
    one = Layout(
        nodes=1, gpus_per_node=8, encoders=(ModuleShape("vision", 1, 1, 1),), llm_tp=1, llm_pp=1, llm_dp=7
    )
    assert (one.single.tp, one.single.dp, one.single.ranks) == (1, 1, 1)
    assert one.to_dict()["enc_dp"] == 1 and "encoders" not in one.to_dict()
    assert Layout.from_dict(one.to_dict()) == one
    assert Layout.from_dict(lay2().to_dict()) == lay2()
    assert module_ranges(one)[0].fan == "out"


def test_two_modules_of_one_kind_train_on_mock_data_and_are_refused_on_a_dataset_by_validate_and_the_preflight(
    tmp_path,
):
    pytest.importorskip("torch")
    from mimo_jobs.trainer.main import PreflightError, preflight

    # two image towers: on mock data each fills placeholders of its own, in every layout
    doc = two(**{"trainer/model/encoders/audio": {"preset": "tiny"}, "trainer/data": None})
    r = validate(doc, tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    runs = runs_of(parse_study(doc))
    assert {r.layout.colocated for r in runs} == {True, False}
    for run in runs:
        assert preflight(run, {}, reference=True) == []
    # a dataset's samples carry one placeholder run per marker: the second tower would get nothing
    data = tmp_path / "data"
    data.mkdir()
    doc["trainer"]["data"] = {"provider": "energon", "path": str(data)}
    words = (
        "vision, audio all embed image: a dataset's samples (trainer.data.provider energon) carry one "
        "placeholder run per marker, for one module of each kind"
    )
    r = validate(doc, tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    line = f"trainer.model.encoders: [module-kind] {words}"
    assert len([x for x in r.stderr.splitlines() if line in x]) == 1, r.stderr  # once for both layouts
    line = f"trainer.model.encoders: {words}"
    for run in runs_of(parse_study(doc)):
        for reference in (True, False):
            with pytest.raises(PreflightError, match="^run\\.yaml: " + re.escape(line)):
                preflight(run, {}, reference=reference)
    runs = runs_of(parse_study(TWO))
    het = next(r for r in runs if not r.layout.colocated)
    col = next(r for r in runs if r.layout.colocated)
    assert preflight(col, {}, reference=True) == []
    assert preflight(het, {}, reference=True) == []
    # a vision tower and an audio encoder on ranks of their own pass every check of the run itself: what is
    # left is this process's launch (no torchrun world here)
    with pytest.raises(
        PreflightError, match=r"^world size mismatch: launched with WORLD_SIZE=1 but run\.yaml"
    ):
        preflight(het, {}, reference=False)


def test_freezing_a_module_the_model_lacks_is_one_line_and_exit_2(tmp_path):
    r = validate(two(**{"trainer/freeze": {"encoders": {"sound": True}}}), tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    line = "freeze.encoders: 'sound' is not an encoder module of trainer.model; its modules are vision, audio"
    assert len([x for x in r.stderr.splitlines() if line in x]) == 1, r.stderr


@pytest.mark.parametrize(
    "freeze, refused",
    [
        ({"encoders": {"vision": True, "audio": True}, "llm": True}, True),
        ({"encoder": True, "llm": True}, True),
        ({"encoders": {"audio": True}, "llm": True}, False),  # the vision tower still trains
        ({"encoders": {"vision": True, "audio": True}}, False),
    ],
)
def test_the_trainer_preflight_refuses_every_module_frozen(freeze, refused):
    pytest.importorskip("torch")
    from mimo_jobs.trainer.main import PreflightError, preflight

    run = next(r for r in runs_of(parse_study(two(**{"trainer/freeze": freeze}))) if r.layout.colocated)
    if not refused:
        assert preflight(run, {}, reference=True) == []
        return
    with pytest.raises(PreflightError, match=r"trainer\.freeze: .*nothing to train"):
        preflight(run, {}, reference=True)


def test_a_tp_the_one_module_of_an_encoders_model_cannot_split_names_it_as_the_study_does():
    """The model rules (study/expand.split_problems, what validate and the trainer's guard say) name the one
    module of an `encoders: {eye: ...}` model `encoders.eye`; only the `encoder:` form's module is `encoder`.
    Every other word of the message is the same."""
    from mimo_jobs.model.arch import ModelArch
    from mimo_jobs.model.presets import PRESETS
    from mimo_jobs.study.expand import split_problems

    tiny = PRESETS["tiny"]  # an encoder of 4 heads, FFN 64, before an LLM of width 32
    eye = ModelArch("m", None, tiny.llm, encoders={"eye": tiny.encoder})
    lay = Layout(nodes=1, gpus_per_node=8, encoders=(ModuleShape("eye", 3, 1, 1),), llm_tp=1, llm_dp=5)
    said = split_problems(eye, lay)
    assert said == [
        (
            "model-tp",
            "encoders.eye.tp=3 does not divide encoders.eye.num_attention_heads=4",
            "encoders.eye.tp in [1, 2] divides it",
        ),
        (
            "model-tp",
            "encoders.eye.tp=3 does not divide encoders.eye.ffn_hidden_size=64",
            "encoders.eye.tp in [1, 2] divides it",
        ),
        (
            "model-tp",
            "encoders.eye.tp=3 does not divide llm.hidden_size (the projector's width)=32",
            "encoders.eye.tp in [1, 2] divides it",
        ),
    ]
    flat = Layout(nodes=1, gpus_per_node=8, encoders=(ModuleShape("vision", 3, 1, 1),), llm_tp=1, llm_dp=5)
    assert split_problems(tiny, flat) == [
        (r, m.replace("encoders.eye.", "encoder."), f.replace("encoders.eye.", "encoder."))
        for r, m, f in said
    ]
    # a text-only model at an LLM TP that splits nothing: the packaged trainer's need of an encoder, once
    text = ModelArch("t", None, tiny.llm)
    one = Layout(nodes=1, gpus_per_node=8, llm_tp=3, llm_dp=2)
    rules = [r for r, _, _ in split_problems(text, one)]
    assert rules[0] == "model-encoder" and rules.count("model-encoder") == 1 and "model-tp" in rules
    assert split_problems(text, one, packaged=False) == split_problems(text, one)[1:]

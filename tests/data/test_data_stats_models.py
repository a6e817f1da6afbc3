"""`data stats` measures for any model trainer.model takes (a HuggingFace config.json, an inline description
with overrides, an encoder preset alone) and for a study (`--study`: its model, tiling, tokenizer,
seq_length and data, written where predict finds it); per-sample image tokens equal a hand count of the
generator's recorded image sizes through the model's geometry, and a refusal's example works as written."""

from __future__ import annotations

import contextlib
import io
import json
import re
import shlex

import pytest
import yaml
from typer.testing import CliRunner

from mimo_jobs.cli.app import app
from mimo_jobs.contract.datastats import stats_file_for
from mimo_jobs.model.tiling import ImageGeometry

runner = CliRunner()
pytestmark = pytest.mark.filterwarnings("ignore:'pin_memory' argument is set as true")
# (h, w): three images within 16 px (one piece each) and one larger, which max_tiles > 1 tiles
SIZES = ((8, 8), (12, 12), (16, 8), (24, 40))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    from mimo_jobs.data.synth import SynthConfig, synth

    root = tmp_path_factory.mktemp("models")
    cfg = SynthConfig(samples=24, text_only_fraction=0.25, image_sizes=SIZES, samples_per_shard=12, seed=3)
    with contextlib.redirect_stdout(io.StringIO()):
        res = synth(root / "ds", cfg)
    recorded = json.loads((res.root / "synth.json").read_text())["image_sizes_by_key"]
    return root, res.blend, recorded


def _stats(*args: str) -> dict:
    r = runner.invoke(app, ["data", "stats", *args, "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def _by_hand(doc: dict, recorded: dict, geom: ImageGeometry) -> None:
    """Every sample's image tokens and tiles as the geometry gives them for its recorded image sizes."""
    assert len(doc["per_sample"]) == len(recorded)
    for s in doc["per_sample"]:
        sizes = recorded[s["key"]]
        assert s["image_tokens"] == sum(geom.tokens(h, w) for h, w in sizes), s["key"]
        assert s["tiles"] == sum(geom.plan(h, w).tiles for h, w in sizes), s["key"]


def test_an_hf_config_and_its_overrides(data, tmp_path):
    transformers = pytest.importorskip("transformers")
    _, blend, recorded = data
    cfg = transformers.SiglipVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        image_size=16,
        patch_size=4,
    )
    cfg.save_pretrained(tmp_path / "vit")
    config = tmp_path / "vit" / "config.json"
    doc = _stats(str(blend), "--seq-length", "64", "--model", str(config), "-o", str(tmp_path / "a.json"))
    assert doc["geometry"] == {
        "patch_size": 4,
        "image_size": 16,
        "downsample": 1,
        "max_tiles": 1,
        "thumbnail": False,
    }
    _by_hand(doc, recorded, ImageGeometry(patch_size=4, image_size=16))
    # the same config at 8 px and tiled: an inline description over the file, relative to the working dir
    with contextlib.chdir(tmp_path):
        model = "{encoder: {hf_config: vit/config.json, image_size: 8}, llm: tiny}"
        doc = _stats(str(blend), "--seq-length", "64", "--model", model, "--max-tiles", "4", "-o", "b.json")
    geom = ImageGeometry(patch_size=4, image_size=8, max_tiles=4)
    assert doc["geometry"]["image_size"] == 8 and doc["geometry"]["max_tiles"] == 4
    _by_hand(doc, recorded, geom)
    assert any(s["tiles"] > 1 for s in doc["per_sample"])  # 8 px tiles: the larger images are cut


def test_an_overridden_preset_and_an_encoder_alone(data, tmp_path):
    _, blend, recorded = data
    doc = _stats(
        str(blend), "--seq-length", "64", "--model", "{encoder: {preset: tiny, patch_size: 2}, llm: tiny}",
        "--max-tiles", "4", "--thumbnail", "-o", str(tmp_path / "o.json"),
    )  # fmt: skip
    _by_hand(doc, recorded, ImageGeometry(patch_size=2, image_size=16, max_tiles=4, thumbnail=True))
    # a packaged encoder without its LLM: the encoder alone decides image tokens
    doc = _stats(
        str(blend), "--seq-length", "64", "--model", "siglip-so400m-14-384", "-o", str(tmp_path / "s.json")
    )
    _by_hand(doc, recorded, ImageGeometry(patch_size=14, image_size=384))


def test_a_refusal_names_what_fits_and_its_example_works(data, tmp_path):
    _, blend, _ = data
    for bad, why in (
        ("nope", "'nope' is no model this knows"),
        ("qwen2.5-7b", "an LLM preset, which sees no images"),
        ("{encoder: tiny", "is not a YAML mapping"),
        (str(tmp_path / "missing.json"), "no such file"),
        ("{encoder: &e tiny, llm: *e}", "anchors and aliases (& and *) are not read here"),
        ("x" * 20_000, "a model argument holds at most 16,384"),
    ):
        r = runner.invoke(app, ["data", "stats", str(blend), "--seq-length", "64", "--model", bad])
        assert r.exit_code == 2 and why in r.output, r.output
    r = runner.invoke(app, ["data", "stats", str(blend), "--seq-length", "64", "--model", "nope"])
    msg = " ".join(r.output.split())
    assert "an encoder preset (e.g. siglip-so400m-14-384)" in msg and "HuggingFace config.json" in msg
    (example,) = re.findall(r"e\.g\. ('\{.*\}')", msg)
    ok = runner.invoke(
        app,
        [
            "data",
            "stats",
            str(blend),
            "--seq-length",
            "64",
            "--model",
            *shlex.split(example),
            "-o",
            str(tmp_path / "e.json"),
        ],
    )
    assert ok.exit_code == 0, ok.output


def _study(root, blend, **data) -> str:
    doc = {
        "name": "measured",
        "cluster": {"executor": "local", "accelerator": "cpu", "gpus_per_node": 3},
        "trainer": {
            "model": {"encoder": {"preset": "tiny", "patch_size": 2}, "llm": "tiny"},
            "seq_length": 96,
            "train_iters": 2,
            "data": {"provider": "energon", "path": str(blend), **data},
        },
        "matrix": {"points": [{"nodes": 1, "encoder": {"dp": 1}, "llm": {"dp": 2}, "gbs": 4}]},
    }
    path = root / "study.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def test_study_measures_as_the_study_trains_and_predict_then_prices_it(data, tmp_path):
    import shutil

    _, blend, recorded = data
    ds = tmp_path / "ds"
    shutil.copytree(blend.parent, ds)
    study = _study(tmp_path, ds / blend.name, max_tiles=4, thumbnail=True, packing=True)
    before = runner.invoke(app, ["predict", study, "--json"])
    assert json.loads(before.output)["runs"][0]["image_tokens"]["assumed"] is True
    r = runner.invoke(app, ["data", "stats", "--study", study])
    assert r.exit_code == 0, r.output
    written = stats_file_for(ds / blend.name)
    assert f"wrote {written}" in r.output
    doc = json.loads(written.read_text())
    assert doc["seq_length"] == 96 and doc["study"] == study
    _by_hand(doc, recorded, ImageGeometry(patch_size=2, image_size=16, max_tiles=4, thumbnail=True))
    after = json.loads(runner.invoke(app, ["predict", study, "--json"]).output)["runs"][0]["image_tokens"]
    assert after["assumed"] is False and str(written) in after["source"] and after["range"] is None
    # a study naming its statistics file: measured for another tiling, validate refuses the study, and
    # `data stats --study` (what the refusal advises) replaces the file
    shutil.copy(written, tmp_path / "named.json")
    named = _study(tmp_path, ds / blend.name, max_tiles=2, stats="named.json")
    refused = runner.invoke(app, ["validate", named])
    assert refused.exit_code == 2 and "data stats --study STUDY.yaml" in " ".join(refused.output.split())
    r = runner.invoke(app, ["data", "stats", "--study", named])
    assert r.exit_code == 0 and f"wrote {tmp_path / 'named.json'}" in r.output, r.output
    assert runner.invoke(app, ["validate", named]).exit_code == 0
    assert json.loads((tmp_path / "named.json").read_text())["geometry"]["max_tiles"] == 2
    # the study gives the model, tiling and data: options that would contradict it are refused
    r = runner.invoke(app, ["data", "stats", "--study", study, "--model", "tiny", "--max-tiles", "2"])
    assert r.exit_code == 2 and "leave out --model, --max-tiles" in " ".join(r.output.split())
    mock = _study(tmp_path, ds / blend.name)
    doc = yaml.safe_load(open(mock))
    doc["trainer"]["data"] = {"provider": "mock"}
    open(mock, "w").write(yaml.safe_dump(doc))
    r = runner.invoke(app, ["data", "stats", "--study", mock])
    assert r.exit_code == 2 and "mock provider" in r.output

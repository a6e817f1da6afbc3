"""`validate` applies the trainer preflight's checks of trainer.init's HuggingFace sources (model/hf_check.py,
their one owner) before a job is queued: config.json against the model description and every tensor's shape
from the safetensors headers, without torch and without reading a tensor."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml
from typer.testing import CliRunner

pytest.importorskip("transformers")

import hf_models  # noqa: E402

from mimo_jobs.cli.app import app  # noqa: E402

runner = CliRunner()


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    d = tmp_path_factory.mktemp("hf")
    return hf_models.save_llm("llama", d / "llm"), hf_models.save_encoder("siglip", d / "vit")


def _study(tmp_path, sources, encoder_over=None) -> str:
    llm, vit = sources
    doc = {
        "name": "init",
        "cluster": {"executor": "local", "gpus_per_node": 2, "accelerator": "cpu"},
        "trainer": {
            "model": {
                "encoder": {"hf_config": str(vit / "config.json"), **(encoder_over or {})},
                "llm": {"hf_config": str(llm / "config.json")},
            },
            "init": {"llm": str(llm), "encoder": str(vit)},
            "train_iters": 1,
            "tensorboard": False,
            "lr": {"schedule": "constant"},
            "data": {"image_sizes": [4, 8]},
        },
        "matrix": {"points": [{"nodes": 1, "encoder": {"dp": 1}, "llm": {"dp": 1}, "gbs": 2}]},
    }
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump(doc))
    return str(f)


def _validate(f: str) -> tuple[int, dict]:
    r = runner.invoke(app, ["validate", f, "--json"])
    return r.exit_code, json.loads(r.output)


def test_matching_sources_validate(tmp_path, sources):
    code, out = _validate(_study(tmp_path, sources))
    assert code == 0, out["problems"]


def test_a_checkpoint_of_another_model_is_refused_before_the_job(tmp_path, sources):
    code, out = _validate(_study(tmp_path, sources, {"num_layers": 7}))
    (p,) = [p for p in out["problems"] if p["rule"] == "init"]
    assert code == 2 and p["path"] == "trainer.init.encoder"
    assert "num_layers=7" in p["message"] and "describes another model" in p["message"], p


def test_a_checkpoint_of_another_image_size_validates_as_the_trainer_resamples_it(tmp_path, sources):
    """The trainer resamples the position table to another image_size (same patch): validate agrees."""
    code, out = _validate(_study(tmp_path, sources, {"image_size": 32}))
    assert code == 0, out["problems"]
    code, out = _validate(_study(tmp_path, sources, {"image_size": 32, "patch_size": 8}))
    (p,) = [p for p in out["problems"] if p["rule"] == "init"]
    assert code == 2 and "keep patch_size" in p["message"], p


def test_a_tensor_of_another_shape_and_a_truncated_file_are_each_one_problem(tmp_path, sources):
    import shutil

    llm, vit = (tmp_path / "llm", tmp_path / "vit")
    shutil.copytree(sources[0], llm)
    shutil.copytree(sources[1], vit)
    data = (llm / "model.safetensors").read_bytes()
    (llm / "model.safetensors").write_bytes(data[: len(data) - 100])
    n = int.from_bytes((vit / "model.safetensors").read_bytes()[:8], "little")
    raw = bytearray((vit / "model.safetensors").read_bytes())
    header = json.loads(raw[8 : 8 + n])
    name = next(k for k in header if k.endswith("patch_embedding.weight"))
    header[name]["shape"] = list(reversed(header[name]["shape"]))  # same bytes, another shape
    text = json.dumps(header, separators=(",", ":")).encode().ljust(n)
    assert len(text) == n
    (vit / "model.safetensors").write_bytes(bytes(raw[:8]) + text + bytes(raw[8 + n :]))
    code, out = _validate(_study(tmp_path, (llm, vit)))
    got = {p["path"]: p["message"] for p in out["problems"] if p["rule"] == "init"}
    assert code == 2 and set(got) == {"trainer.init.llm", "trainer.init.encoder"}
    assert got["trainer.init.llm"].startswith(f"{llm / 'model.safetensors'}: unreadable safetensors file")
    assert f"tensor {name} has shape" in got["trainer.init.encoder"]


def test_tensors_sharing_bytes_are_refused_before_the_job(tmp_path, sources):
    a, b = "model.layers.0.mlp.up_proj.weight", "model.layers.1.mlp.up_proj.weight"
    llm = hf_models.share_bytes(sources[0], tmp_path / "llm", a, b)
    code, out = _validate(_study(tmp_path, (llm, sources[1])))
    (p,) = [p for p in out["problems"] if p["rule"] == "init"]
    assert code == 2 and p["path"] == "trainer.init.llm"
    assert str(llm / "model.safetensors") in p["message"] and "share bytes" in p["message"]
    assert f"'{a}'" in p["message"] and f"'{b}'" in p["message"]


def test_a_missing_side_does_not_hide_the_other_sides_problem(tmp_path, sources):
    f = _study(tmp_path, sources)
    doc = yaml.safe_load(open(f).read())
    doc["trainer"]["init"] = {"llm": str(sources[1]), "encoder": str(tmp_path / "no-vit")}  # a ViT as LLM
    open(f, "w").write(yaml.safe_dump(doc))
    code, out = _validate(f)
    got = {(p["path"], p["rule"]) for p in out["problems"]}
    assert code == 2 and got == {("trainer.init.encoder", "path"), ("trainer.init.llm", "init")}, got


def test_the_check_imports_no_torch(sources):
    code = (
        "import sys\n"
        "from mimo_jobs.model.hf_check import read_source\n"
        f"src = read_source({str(sources[0])!r}, 'trainer.init.llm')\n"
        "assert src.shapes['model.embed_tokens.weight'] == (250, 64), src.shapes\n"
        "heavy = [m for m in ('torch', 'safetensors', 'numpy') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr


def test_a_pipe_in_place_of_a_shard_is_refused_without_waiting(tmp_path, sources):
    import os
    import shutil

    from mimo_jobs.model.hf_check import HFInitError, read_source

    d = tmp_path / "llm"
    shutil.copytree(sources[0], d)
    (d / "model.safetensors").unlink()
    os.mkfifo(d / "model.safetensors")  # nobody writes to it: reading it would wait for ever
    with pytest.raises(
        HFInitError, match="model.safetensors: unreadable safetensors file .*not a regular file"
    ):
        read_source(d, "trainer.init.llm")

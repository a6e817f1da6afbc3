"""Bad HuggingFace sources of trainer.init: each is one line naming the file and the field or tensor (with
both values or shapes), found from config.json and the safetensors headers alone (no tensor read, no
collective), and the trainer exits 2 before starting its process group, having written nothing."""

from __future__ import annotations

import json
import subprocess

import pytest

pytest.importorskip("transformers")

import hf_models  # noqa: E402

from mimo_jobs.model import hf  # noqa: E402
from mimo_jobs.model.arch import EncoderArch, LLMArch  # noqa: E402
from mimo_jobs.trainer.weights.hf_load import HFInitError, check_encoder, check_llm  # noqa: E402


def _llm(family="llama", **over) -> LLMArch:
    cfg = hf_models.llm_config(family).to_dict() | over
    return LLMArch(**hf.llm_fields(cfg))


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return hf_models.save_llm("llama", tmp_path_factory.mktemp("hf") / "llama")


def _err(fn, *args) -> str:
    with pytest.raises(HFInitError) as e:
        fn(*args)
    msg = e.value.describe()
    assert "\n" not in msg
    return msg


def test_a_good_directory_passes(llama):
    src, fam = check_llm(llama, _llm(), 2)
    assert fam == "llama" and "model.embed_tokens.weight" in src.shapes


def test_a_checkpoint_of_another_architecture_names_the_field_and_both_values(llama):
    msg = _err(check_llm, llama, _llm(num_hidden_layers=3), 1)
    assert str(llama / "config.json") in msg and "num_layers=2" in msg and "num_layers=3" in msg


def test_a_directory_without_config_json(tmp_path):
    msg = _err(check_llm, tmp_path, _llm(), 1)
    assert msg.startswith("trainer.init.llm: ") and f"{tmp_path}: no config.json" in msg


def test_a_truncated_shard_names_the_file(llama, tmp_path):
    d = tmp_path / "cut"
    d.mkdir()
    (d / "config.json").write_text((llama / "config.json").read_text())
    data = (llama / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(data[: len(data) // 2])
    msg = _err(check_llm, d, _llm(), 1)
    assert f"{d / 'model.safetensors'}: unreadable safetensors file (truncated" in msg


def test_an_index_naming_a_missing_file_and_a_missing_tensor(tmp_path):
    d = hf_models.save_llm("llama", tmp_path / "sharded", max_shard_size="100KB")
    index = json.loads((d / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 1
    (d / files[-1]).unlink()
    msg = _err(check_llm, d, _llm(), 1)
    assert f"names {files[-1]}" in msg and "which is missing" in msg
    # the index without that file's tensors: now a tensor the model needs is missing
    index["weight_map"] = {k: v for k, v in index["weight_map"].items() if v != files[-1]}
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    msg = _err(check_llm, d, _llm(), 1)
    assert f"{d}: no tensor " in msg and "expected" in msg


def test_a_tensor_of_another_shape_names_the_file_tensor_and_both_shapes(llama, tmp_path):
    import torch
    from safetensors.torch import load_file, save_file

    d = tmp_path / "reshaped"
    d.mkdir()
    (d / "config.json").write_text((llama / "config.json").read_text())
    t = load_file(llama / "model.safetensors")
    t["model.layers.1.self_attn.k_proj.weight"] = torch.zeros(8, 64)
    save_file(t, d / "model.safetensors")
    msg = _err(check_llm, d, _llm(), 1)
    assert "model.layers.1.self_attn.k_proj.weight has shape [8, 64], this model needs [32, 64]" in msg


def _copy_with(llama, d, change_tensors=None, change_config=None):
    from safetensors.torch import load_file, save_file

    d.mkdir()
    cfg = json.loads((llama / "config.json").read_text())
    (d / "config.json").write_text(json.dumps(change_config(cfg) if change_config else cfg))
    t = load_file(llama / "model.safetensors")
    save_file(change_tensors(t) if change_tensors else t, d / "model.safetensors")
    return d


K = "model.layers.1.self_attn.k_proj.weight"


@pytest.mark.parametrize(
    "dtype, shown", [("int32", "I32"), ("bool", "BOOL"), ("float8_e4m3fn", "F8_E4M3"), ("uint8", "U8")]
)
def test_a_tensor_of_the_right_shape_but_not_floating_point_is_refused(llama, tmp_path, dtype, shown):
    import torch

    def retype(t):
        t[K] = torch.ones(32, 64).to(getattr(torch, dtype))
        return t

    d = _copy_with(llama, tmp_path / dtype, retype)
    msg = _err(check_llm, d, _llm(), 1)
    assert f"tensor {K} is {shown}, not floating-point weights" in msg, msg


def test_an_fp8_checkpoint_is_refused_from_its_config(llama, tmp_path):
    import torch

    # the public FP8 layout (e.g. Qwen3-30B-A3B-FP8): quantization_config, FP8 codes and their *_scale_inv
    def fp8(t):
        t[K] = t[K].to(torch.float8_e4m3fn)
        t[K + "_scale_inv"] = torch.ones(1, 1)
        return t

    def quantized(cfg):
        return cfg | {"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}

    d = _copy_with(llama, tmp_path / "fp8", fp8, quantized)
    msg = _err(check_llm, d, _llm(), 1)
    assert "quantized weights (quantization_config, quant_method 'fp8')" in msg, msg


@pytest.mark.parametrize("weight_map", [["model.safetensors"], {"a": 3}, "model.safetensors"])
def test_a_wrongly_typed_weight_map_is_one_line(llama, tmp_path, weight_map):
    d = _copy_with(llama, tmp_path / "idx")
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    msg = _err(check_llm, d, _llm(), 1)
    assert "model.safetensors.index.json: weight_map is not an object" in msg, msg


def test_a_config_that_is_not_an_object_is_one_line(llama, tmp_path):
    d = _copy_with(llama, tmp_path / "cfg")
    (d / "config.json").write_text("[1, 2]")
    assert "config.json: a JSON list, not a model config" in _err(check_llm, d, _llm(), 1)


def test_a_vision_config_of_another_width(tmp_path):
    # another image_size is resampled (test_hf_resample.py); another width is another model
    d = hf_models.save_encoder("siglip", tmp_path / "siglip")
    fields = hf.encoder_fields(hf_models.encoder_config("siglip").to_dict())
    msg = _err(check_encoder, d, EncoderArch(**(fields | {"hidden_size": 48, "image_size": 32})))
    assert msg.startswith("trainer.init.encoder: ") and "hidden_size=32" in msg and "hidden_size=48" in msg


def test_train_iters_0_is_a_conversion_and_needs_init():
    from mimo_jobs.study.spec import TrainerSpec

    with pytest.raises(ValueError, match="train_iters: 0 trains nothing"):
        TrainerSpec(train_iters=0)
    assert TrainerSpec(train_iters=0, init={"encoder": "/x"}).train_iters == 0


@pytest.mark.slow
def test_the_trainer_exits_2_with_one_line_before_any_collective(tmp_path, llama):
    from helpers.launch import trainer, worker_env
    from helpers.trainer import make_run_yaml

    bad = tmp_path / "no-config"
    bad.mkdir()
    model = {"encoder": "tiny", "llm": {"hf_config": str(llama / "config.json")}}
    y = make_run_yaml(tmp_path / "run", gpn=2, gbs=2, trainer={"model": model, "init": {"llm": str(bad)}})
    p = subprocess.run(
        trainer(y, "--reference"),
        capture_output=True,
        text=True,
        timeout=300,
        env=worker_env(),
    )
    assert p.returncode == 2, p.stderr[-3000:]
    lines = [ln for ln in p.stderr.splitlines() if "error" in ln]
    assert len(lines) == 1, p.stderr[-3000:]
    assert lines[0].startswith(f"mimo-jobs trainer: error: trainer.init.llm: {bad}: no config.json")
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.slow
def test_nan_weights_are_named_and_the_run_stops_instead_of_completing(tmp_path, llama):
    from helpers.launch import trainer, worker_env
    from helpers.trainer import make_run_yaml

    def poison(t):
        t[K] = t[K].clone()
        t[K][3, 5] = float("nan")
        return t

    d = _copy_with(llama, tmp_path / "nan", poison)
    model = {"encoder": "tiny", "llm": {"hf_config": str(llama / "config.json")}}
    y = make_run_yaml(
        tmp_path / "run", gpn=2, gbs=2, iters=6, trainer={"model": model, "init": {"llm": str(d)}}
    )
    p = subprocess.run(
        trainer(y, "--reference"), capture_output=True, text=True, timeout=300, env=worker_env()
    )
    assert p.returncode == 1, p.stderr[-3000:]
    warned = [ln for ln in p.stderr.splitlines() if "warning:" in ln]
    assert warned == [
        f"mimo-jobs trainer: warning: {d / 'model.safetensors'}: tensor {K} holds NaN or Inf values"
    ]
    assert "error: iterations 1-3 all had a NaN/Inf loss or gradient and were skipped" in p.stderr


def test_tensors_sharing_bytes_are_refused_naming_the_file_and_both(llama, tmp_path):
    a = "model.layers.0.self_attn.k_proj.weight"
    d = hf_models.share_bytes(llama, tmp_path / "shared", a, K)
    msg = _err(check_llm, d, _llm(), 1)
    assert str(d / "model.safetensors") in msg and "share bytes" in msg
    assert f"'{a}'" in msg and f"'{K}'" in msg

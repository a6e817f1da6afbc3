"""Model descriptions and HuggingFace files someone hands over, read strictly (mimo_jobs/strictread.py): a
`--model` argument, a config.json, a safetensors index or header nested thousands of levels deep is one
clear error naming the file (never a RecursionError), a key given twice is refused (never the last one taken
silently), two tensors whose bytes overlap or a tensor past the end of the data are refused naming the file
and the tensors, a size field far beyond any real model is refused with the bound, and a missing hf_config
names the folder it was looked for in."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest

from mimo_jobs.errors import MimoJobsError
from mimo_jobs.model import presets
from mimo_jobs.model.arch import ArchError, LLMArch
from mimo_jobs.model.hf_check import HFInitError, read_source, safetensors_header
from mimo_jobs.model.resolve import arch_of, image_model, model_argument

DEEP = 100_000  # far past Python's recursion limit: the readers' own recursion would end in a traceback

# A real public config: Qwen2.5-0.5B's config.json (huggingface.co/Qwen/Qwen2.5-0.5B), the fields read here.
QWEN = {
    "architectures": ["Qwen2ForCausalLM"],
    "hidden_act": "silu",
    "hidden_size": 896,
    "intermediate_size": 4864,
    "max_position_embeddings": 32768,
    "model_type": "qwen2",
    "num_attention_heads": 14,
    "num_hidden_layers": 24,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": True,
    "vocab_size": 151936,
}


def _deep_json() -> str:
    return '{"model_type": "qwen2", "x": ' + "[" * DEEP + "]" * DEEP + "}"


def _safetensors(path: Path, header: dict | str, data: int) -> Path:
    """A .safetensors file by the format's own rule (huggingface/safetensors' README: an 8-byte
    little-endian header length, the JSON header, then the data)."""
    text = (header if isinstance(header, str) else json.dumps(header)).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + bytes(data))
    return path


def _err(exc, fn, *args) -> str:
    with pytest.raises(exc) as e:
        fn(*args)
    assert isinstance(e.value, MimoJobsError)
    msg = e.value.describe()
    assert "\n" not in msg
    return msg


# ------------------------------------------------------------------ `--model` arguments (plan, data stats)


@pytest.mark.parametrize("read", [model_argument, image_model])
def test_a_model_argument_nested_very_deep_is_one_error(read):
    deep = 5_000  # within the 16,384 characters an argument may hold; far past the recursion limit
    msg = _err(ArchError, read, "{llm: " + "[" * deep + "]" * deep + "}")
    assert "nested more than 32 levels deep" in msg


@pytest.mark.parametrize("read", [model_argument, image_model])
def test_a_model_argument_with_a_key_given_twice_is_refused(read):
    msg = _err(ArchError, read, "{encoder: tiny, llm: qwen2.5-7b, llm: tiny}")
    assert "key 'llm' appears twice in the same mapping" in msg


def test_a_model_argument_that_holds_is_read_as_before():
    assert model_argument("{llm: qwen2.5-7b}") == {"llm": "qwen2.5-7b"}


# ------------------------------------------------------------------ hf_config (a study, `plan --model`)


def test_a_config_json_nested_very_deep_names_the_file(tmp_path):
    (tmp_path / "config.json").write_text(_deep_json())
    msg = _err(ArchError, arch_of, {"llm": {"hf_config": "config.json"}}, tmp_path)
    assert "llm.hf_config" in msg and "config.json: nested more than 32 levels deep" in msg


def test_a_config_json_with_a_key_given_twice_names_the_file_and_key(tmp_path):
    text = json.dumps(QWEN)[:-1] + ', "num_hidden_layers": 2}'
    (tmp_path / "config.json").write_text(text)
    msg = _err(ArchError, arch_of, {"llm": {"hf_config": "config.json"}}, tmp_path)
    assert "config.json: key 'num_hidden_layers' appears twice in the same object" in msg


def test_the_depth_bound_is_exact_and_blind_to_brackets_in_strings():
    from mimo_jobs import strictread

    inner = "[" * 40 + '\\"{'  # brackets (and an escaped quote) inside a string are no nesting
    value = strictread.json_text("[" * 32 + json.dumps(inner) + "]" * 32)
    for _ in range(32):
        (value,) = value
    assert value == inner
    with pytest.raises(strictread.DocumentError, match="nested more than 32 levels deep"):
        strictread.json_text("[" * 33 + "1" + "]" * 33)


def test_a_real_config_json_still_reads(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(QWEN))
    m = arch_of({"llm": {"hf_config": "config.json"}}, tmp_path)
    assert (m.llm.num_layers, m.llm.hidden_size, m.llm.vocab_size) == (24, 896, 151936)


def test_a_missing_hf_config_names_the_folder_it_was_looked_for_in(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a study in the working directory: its folder is "."
    msg = _err(ArchError, arch_of, {"llm": {"hf_config": "missing.json"}}, Path("."))
    assert f"no such file: missing.json (relative to {os.path.abspath(tmp_path)})" in msg
    assert "(relative to .)" not in msg


# ------------------------------------------------------------------ a HuggingFace directory (trainer.init)


def _hf_dir(tmp_path: Path, header: dict | str, data: int) -> Path:
    d = tmp_path / "hf"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps(QWEN))
    _safetensors(d / "model.safetensors", header, data)
    return d


def test_a_config_json_of_a_directory_nested_very_deep_names_it(tmp_path):
    d = _hf_dir(tmp_path, {"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, 4)
    (d / "config.json").write_text(_deep_json())
    msg = _err(HFInitError, read_source, d, "trainer.init.llm")
    assert f"{d / 'config.json'}: nested more than 32 levels deep" in msg


def test_a_safetensors_index_nested_very_deep_names_it(tmp_path):
    d = _hf_dir(tmp_path, {"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, 4)
    (d / "model.safetensors.index.json").write_text('{"weight_map": ' + "[" * DEEP + "]" * DEEP + "}")
    msg = _err(HFInitError, read_source, d, "trainer.init.llm")
    assert "model.safetensors.index.json" in msg and "nested more than 32 levels deep" in msg


def test_a_safetensors_header_nested_very_deep_names_the_file(tmp_path):
    p = _safetensors(tmp_path / "model.safetensors", '{"__metadata__": ' + "[" * DEEP + "]" * DEEP + "}", 0)
    msg = _err(HFInitError, safetensors_header, p, "trainer.init.llm")
    assert f"{p}: unreadable safetensors file" in msg and "nested more than 32 levels deep" in msg


def test_a_safetensors_header_naming_a_tensor_twice_is_refused(tmp_path):
    text = (
        '{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, '
        '"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}'
    )
    p = _safetensors(tmp_path / "model.safetensors", text, 8)
    msg = _err(HFInitError, safetensors_header, p, "trainer.init.llm")
    assert "key 'a' appears twice" in msg


def test_tensors_whose_bytes_overlap_are_refused_naming_both(tmp_path):
    header = {
        "model.embed_tokens.weight": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
        "model.norm.weight": {"dtype": "F32", "shape": [2], "data_offsets": [16, 24]},
        "lm_head.weight": {"dtype": "F32", "shape": [2, 2], "data_offsets": [8, 24]},  # over both others
    }
    d = _hf_dir(tmp_path, header, 24)
    msg = _err(HFInitError, read_source, d, "trainer.init.llm")
    assert msg.startswith("trainer.init.llm: ") and str(d / "model.safetensors") in msg
    assert (
        "'model.embed_tokens.weight' (data_offsets [0, 16]) and 'lm_head.weight' ([8, 24]) share bytes" in msg
    )


def test_a_tensor_past_the_data_is_refused_naming_it(tmp_path):
    header = {
        "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
        "b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]},
    }
    p = _safetensors(tmp_path / "model.safetensors", header, 12)
    msg = _err(HFInitError, safetensors_header, p, "trainer.init.llm")
    assert "tensor 'b' (data_offsets [8, 16]) reaches past the 12 bytes of data" in msg


def test_adjacent_and_empty_tensors_share_no_byte(tmp_path):
    header = {
        "__metadata__": {"format": "pt"},
        "a": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 8]},
        "empty": {"dtype": "F32", "shape": [0], "data_offsets": [4, 4]},  # inside a's span, but no byte
        "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]},
    }
    p = _safetensors(tmp_path / "model.safetensors", header, 12)
    assert safetensors_header(p, "trainer.init.llm") == {
        "a": ("BF16", (4,)),
        "empty": ("F32", (0,)),
        "b": ("F32", (1,)),
    }


# ------------------------------------------------------------------ size fields


def test_a_billion_layers_is_refused_with_the_bound():
    base = presets.LLMS["qwen2.5-7b"].to_dict()
    with pytest.raises(ArchError) as e:
        LLMArch(**(base | {"num_layers": 10**9}))
    assert (
        e.value.field == "num_layers" and "1,000,000,000" in str(e.value) and "at most 1,024" in str(e.value)
    )
    with pytest.raises(ArchError, match="at most 1,024") as e:  # a description, as a study or --model gives
        arch_of({"llm": {"preset": "qwen2.5-7b", "num_layers": 10**9}})
    assert e.value.field == "llm.num_layers"


@pytest.mark.parametrize("field", ["hidden_size", "ffn_hidden_size", "vocab_size", "num_attention_heads"])
def test_widths_beyond_any_model_are_refused(field):
    with pytest.raises(ArchError, match="at most") as e:
        arch_of({"llm": {"preset": "qwen2.5-7b", field: 10**30}})
    assert e.value.field == f"llm.{field}"


def test_the_largest_public_model_fits_the_bounds():
    # Llama 3.1 405B's config.json (huggingface.co/meta-llama/Llama-3.1-405B): the deepest and widest
    # public dense LLM
    llama405 = LLMArch(
        num_layers=126,
        hidden_size=16384,
        num_attention_heads=128,
        num_query_groups=8,
        ffn_hidden_size=53248,
        vocab_size=128256,
        activation="silu",
        gated_linear_unit=True,
        normalization="RMSNorm",
    )
    assert llama405.num_layers == 126

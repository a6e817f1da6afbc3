"""`mimo-jobs export` refuses bad input with one line and exit code 2, writing nothing (the round trip
through a real checkpoint is test_hf_roundtrip.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


def _export(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mimo_jobs.cli", "export", *args], capture_output=True, text=True, timeout=120
    )


def _error_line(p: subprocess.CompletedProcess) -> str:
    assert p.returncode == 2, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), p.stderr
    return lines[0]


def test_an_unfinished_save_and_a_missing_directory_are_refused(tmp_path):
    ckpts = tmp_path / "checkpoints"
    (ckpts / "iter_0000004.tmp").mkdir(parents=True)
    out = tmp_path / "out"
    line = _error_line(_export(str(ckpts / "iter_0000004.tmp"), str(out), "--to", "hf"))
    assert "an unfinished save" in line and not out.exists()
    line = _error_line(_export(str(ckpts), str(out), "--to", "hf"))
    assert f"{ckpts}: no complete checkpoint" in line and not out.exists()
    line = _error_line(_export(str(tmp_path / "nothing"), str(out), "--to", "hf"))
    assert "no such checkpoint directory" in line and not out.exists()


def test_an_unknown_format_and_a_non_empty_output_are_refused(tmp_path):
    assert "--to 'onnx'" in _error_line(_export(str(tmp_path), str(tmp_path / "o"), "--to", "onnx"))
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("keep me")
    line = _error_line(_export(str(tmp_path), str(tmp_path / "full"), "--to", "hf"))
    assert "already exists and is not empty" in line
    assert (tmp_path / "full" / "x").read_text() == "keep me"


def _checkpoint(root: Path) -> Path:
    """A complete checkpoint's directory as far as the manifest goes (what export resolves first)."""
    from mimo_jobs.contract.manifest import LATEST, MANIFEST, Provenance, manifest_doc

    d = root / "checkpoints" / "iter_0000002"
    d.mkdir(parents=True)
    prov = Provenance(run_id="r1", study="s", run_name="n", layout={"gbs": 4}, world=2)
    doc = manifest_doc(
        iteration=2, consumed_samples=8, provenance=prov, files={}, rank_modules={}, save_s=0.1
    )
    (d / MANIFEST).write_text(json.dumps(doc))
    (d.parent / LATEST).write_text(d.name)
    return d.parent


def test_a_dtype_it_does_not_write_is_one_line(tmp_path):
    line = _error_line(_export(str(tmp_path), str(tmp_path / "o"), "--to", "hf", "--dtype", "int8"))
    assert "--dtype 'int8': the dtypes are float32, bfloat16, float16" in line
    assert not (tmp_path / "o").exists()


def test_a_dangling_symlink_as_the_output_is_refused(tmp_path):
    (tmp_path / "o").symlink_to(tmp_path / "gone")
    line = _error_line(_export(str(tmp_path), str(tmp_path / "o"), "--to", "hf"))
    assert f"{tmp_path / 'o'}: a symbolic link to {tmp_path / 'gone'}, which does not exist" in line
    assert not (tmp_path / "gone").exists()


def test_an_output_inside_the_checkpoint_directory_is_refused(tmp_path):
    # pruning (keep_checkpoints) and the next save manage that directory: an export there would be deleted
    ckpts = _checkpoint(tmp_path)
    for inside in (ckpts / "iter_0000002" / "hf", ckpts / "iter_0000004.tmp", ckpts / "export"):
        line = _error_line(_export(str(ckpts), str(inside), "--to", "hf"))
        assert "inside the checkpoint directory" in line and not inside.exists(), line


def _tokenizer(d: Path) -> Path:
    """A small real HuggingFace tokenizer directory (built here, no download), with a model's config and
    weights beside it that the export must not take for tokenizer files."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<pad>", "<s>", "</s>", "<unk>", "a", "red", "square"]
    tk = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tk, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>"
    )
    fast.save_pretrained(d)
    (d / "config.json").write_text('{"model_type": "not-this-one"}')
    (d / "model.safetensors").write_bytes(b"not copied")
    return d


@pytest.mark.slow
def test_an_export_is_readable_by_the_group_and_carries_the_runs_tokenizer(tmp_path):
    import os

    from helpers.launch import worker_env
    from helpers.trainer import assert_ok, make_run_yaml, run_torchrun

    tok = _tokenizer(tmp_path / "tok")
    (tok / "tokenizer_config.json").chmod(0o600)  # kept private: the copy must not be more readable
    trainer = {
        "save_interval": 1,
        "data": {"tokenizer": str(tok), "image_sizes": [8, 16]},
        "lr": {"schedule": "constant"},
    }
    y = make_run_yaml(tmp_path / "run", gpn=2, gbs=2, iters=1, model="tiny-swiglu", trainer=trainer)
    assert_ok(run_torchrun(y, 2, tmp_path / "run" / "metrics.jsonl"), "one iteration")
    out = tmp_path / "out"
    out.mkdir()  # an empty directory, named through a link: the export goes where the link points
    (tmp_path / "link").symlink_to(out)
    cmd = [
        sys.executable,
        "-m",
        "mimo_jobs.cli",
        "export",
        str(tmp_path / "run" / "checkpoints"),
        str(tmp_path / "link"),
    ]
    env = worker_env()
    p = subprocess.run(
        ["sh", "-c", 'umask 022 && exec "$@"', "sh", *cmd, "--to", "hf"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    files = [f for f in out.rglob("*") if f.is_file()]
    assert any(f.suffix == ".safetensors" for f in files)
    private = out / "llm" / "tokenizer_config.json"
    assert oct(private.stat().st_mode & 0o777) == "0o600"
    assert {oct(f.stat().st_mode & 0o777) for f in files if f != private} == {"0o644"}
    assert {oct(d.stat().st_mode & 0o777) for d in [out, *(f.parent for f in files)]} == {"0o755"}
    copied = {f.name for f in (out / "llm").iterdir()} - {"config.json", "model.safetensors"}
    assert copied == set(os.listdir(tok)) - {"config.json", "model.safetensors"}
    assert "tokenizer.json" in copied
    assert json.loads((out / "llm" / "config.json").read_text())["model_type"] != "not-this-one"
    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained(out / "llm").encode("a red square") == [4, 5, 6]
    assert "tokenizer.json" in p.stdout


def test_a_tokenizer_gone_since_the_run_is_one_line_and_nothing_is_written(tmp_path):
    from helpers.trainer import make_run_yaml

    ckpts = _checkpoint(tmp_path)
    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "tokenizer.json").write_text("{}")
    y = make_run_yaml(
        tmp_path / "run",
        gpn=2,
        gbs=2,
        iters=1,
        model="tiny-swiglu",
        trainer={"data": {"tokenizer": str(tok)}, "lr": {"schedule": "constant"}},
    )
    (ckpts / "iter_0000002" / "run.yaml").write_text(y.read_text())
    (tok / "tokenizer.json").unlink()
    tok.rmdir()
    out = tmp_path / "out"
    line = _error_line(_export(str(ckpts), str(out), "--to", "hf"))
    assert f"trainer.data.tokenizer {str(tok)!r} does not exist any more" in line and not out.exists()


def _run_naming(tmp_path: Path, tokenizer: Path) -> Path:
    """A checkpoint whose run.yaml names `tokenizer` as trainer.data.tokenizer (a run.yaml someone handed over)."""
    from helpers.trainer import make_run_yaml

    ckpts = _checkpoint(tmp_path)
    y = make_run_yaml(
        tmp_path / "run",
        gpn=2,
        gbs=2,
        iters=1,
        model="tiny-swiglu",
        trainer={"data": {"tokenizer": str(tokenizer)}, "lr": {"schedule": "constant"}},
    )
    (ckpts / "iter_0000002" / "run.yaml").write_text(y.read_text())
    return ckpts


def test_a_file_named_as_the_tokenizer_that_is_no_tokenizer_file_is_not_copied(tmp_path):
    key = tmp_path / "id_rsa"
    key.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    key.chmod(0o600)
    out = tmp_path / "out"
    line = _error_line(_export(str(_run_naming(tmp_path, key)), str(out), "--to", "hf"))
    assert f"{str(key)!r} is a file that no HuggingFace tokenizer is made of" in line
    assert not out.exists()


def test_a_tokenizer_file_linking_outside_its_directory_is_not_copied(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("not a vocabulary")
    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "tokenizer.json").write_text("{}")
    (tok / "vocab.json").symlink_to(secret)
    out = tmp_path / "out"
    line = _error_line(_export(str(_run_naming(tmp_path, tok)), str(out), "--to", "hf"))
    assert f"vocab.json is a link to {secret}, outside the tokenizer's directory" in line
    assert not out.exists()

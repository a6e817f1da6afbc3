"""`mimo-jobs export` refuses bad input with one line and exit code 2, writing nothing (the round trip
through a real checkpoint is test_hf_roundtrip.py)."""

from __future__ import annotations

import subprocess
import sys


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

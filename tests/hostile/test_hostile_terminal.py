"""Names a study or `--model` gives reach the terminal with their control characters and bidi overrides
made visible (mimo_jobs/textsafe.py `visible`): a model's module names with a window-title change, a
clipboard write (OSC 52), a screen clear and a right-to-left override, through `validate`, `predict` and
`plan --model`, the real CLI in a subprocess."""

from __future__ import annotations

import subprocess
import sys

import yaml

from helpers import STUDIES
from helpers.launch import worker_env

TITLE, CLIPBOARD, CLEAR, RTL = "\x1b]0;pwned\x07", "\x1b]52;c;aGk=\x07", "\x1b[2J", "\u202e"
RAW = ("\x1b", "\x07", RTL)


def _cli(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mimo_jobs.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
        env=worker_env({"COLUMNS": "300"}),
    )


def test_module_names_with_escapes_are_shown_not_obeyed(tmp_path):
    doc = yaml.safe_load((STUDIES / "scale_33n_68n_100n.yaml").read_text())
    doc["trainer"]["model"] = {
        "encoder": {"preset": "siglip-so400m-14-384", "name": f"enc{TITLE}{CLEAR}"},
        "llm": {"preset": "qwen3-30b-a3b", "name": f"llm{RTL}abc{CLIPBOARD}"},
    }
    study = tmp_path / "s.yaml"
    study.write_text(yaml.safe_dump(doc, allow_unicode=True))
    for cmd in ("validate", "predict"):
        p = _cli(cmd, str(study), cwd=tmp_path)
        assert p.returncode == 0, (cmd, p.stderr)
        out = p.stdout + p.stderr
        assert not any(c in out for c in RAW), (cmd, [c for c in RAW if c in out])
        assert r"enc\x1b]0;pwned\x07\x1b[2J" in out and r"llm\u202eabc\x1b]52;c;aGk=\x07" in out, cmd


def test_plan_model_text_with_a_right_to_left_override_is_shown_not_obeyed(tmp_path):
    model = f'{{encoder: {{preset: siglip-so400m-14-384, name: "x{RTL}y"}}, llm: qwen3-30b-a3b}}'
    p = _cli("plan", "--model", model, "--gbs", "64", "--nodes", "4", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert RTL not in p.stdout + p.stderr
    assert r'name: "x\u202ey"' in p.stdout

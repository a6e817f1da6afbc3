"""The toolkit alone (no `train` extra) installs and runs on Python 3.10, the oldest the package declares:
a fresh venv on the machine's Python 3.10, `pip install <checkout>` (no extras), then `validate` and a
`submit --dry-run` of a shipped study, and the trainer refusing in one line that it needs Python 3.12."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO

pytestmark = pytest.mark.slow


def python310() -> str | None:
    found = [shutil.which("python3.10")] + sorted(
        glob.glob(os.path.expanduser("~/.pyenv/versions/3.10*/bin/python3.10"))
    )
    for p in filter(None, found):
        r = subprocess.run(
            [p, "-c", "import sys; print(sys.version_info[:2] == (3, 10))"], capture_output=True, text=True
        )
        if r.stdout.strip() == "True":
            return p
    return None


def test_toolkit_installs_and_runs_on_python_310(tmp_path: Path):
    py = python310()
    if py is None:
        pytest.skip("no Python 3.10 on this machine (pyenv install 3.10 brings one)")
    venv = tmp_path / "venv"
    subprocess.run([py, "-m", "venv", str(venv)], check=True, timeout=600)
    pip = subprocess.run(
        [str(venv / "bin/python"), "-m", "pip", "install", "-q", "--disable-pip-version-check", str(REPO)],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert pip.returncode == 0, pip.stdout[-3000:] + pip.stderr[-3000:]
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = os.pathsep.join([str(venv / "bin"), "/usr/bin", "/bin"])

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(list(args), capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600)

    study = str(
        REPO / "studies/scale_33n_68n_100n.yaml"
    )  # a GPU study: nothing of the trainer's is needed here
    v = run("mimo-jobs", "validate", study)
    assert v.returncode == 0 and "OK, 3 run(s) feasible" in v.stdout, v.stdout + v.stderr
    d = run("mimo-jobs", "submit", study, "--dry-run")
    assert d.returncode == 0 and "nothing submitted" in d.stdout, d.stdout + d.stderr
    t = run("python", "-m", "mimo_jobs.trainer", "run.yaml")
    assert t.returncode == 2, t.stdout + t.stderr
    assert t.stderr.startswith("mimo-jobs trainer: error: the trainer needs Python >= 3.12"), t.stderr
    assert sys.version_info >= (3, 12)  # and the suite itself runs on the trainer's Python

"""The trainer refuses a Python or megatron-core it was not written for, in one line, before importing
megatron (mimo_jobs/trainer/stack.py)."""

from __future__ import annotations

import subprocess
import sys

import tomllib

from helpers import REPO
from mimo_jobs.trainer.stack import required_megatron_core, stack_problem


def test_this_environment_is_the_trainers_stack():
    assert stack_problem() is None
    # the release comes from the package's own pin, read independently here from pyproject.toml
    pins = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["train"]
    (pin,) = [p for p in pins if p.startswith("megatron-core==")]
    assert required_megatron_core() == ".".join(pin.split("==")[1].split(".")[:2])


def test_an_old_python_or_another_megatron_core_is_refused_with_what_to_install():
    old_python = stack_problem(python=(3, 11), megatron="0.19.2", required="0.19")
    assert old_python.startswith("the trainer needs Python >= 3.12 (megatron-core 0.19), this is 3.11: ")
    assert "bash install.sh" in old_python
    assert stack_problem(python=(3, 12), megatron="0.16.1", required="0.19").startswith(
        "megatron-core 0.16.1 is installed, the trainer needs 0.19.x: "
    )
    assert stack_problem(python=(3, 12), megatron=None).startswith("megatron-core is not installed: ")
    assert stack_problem(python=(3, 13), megatron="0.19.0", required="0.19") is None
    assert stack_problem(python=(3, 12), megatron="0.20.1", required="0.19").startswith(
        "megatron-core 0.20.1 is"
    )


def test_python_m_trainer_says_so_and_exits_2_without_importing_megatron(tmp_path):
    # a Python that has this checkout but no megatron-core: the machine's other interpreter, or this one
    # with megatron-core hidden from importlib.metadata
    code = (
        "import sys, importlib.metadata as md; real = md.version\n"
        "def version(n):\n"
        "    if n == 'megatron-core':\n"
        "        raise md.PackageNotFoundError(n)\n"
        "    return real(n)\n"
        "md.version = version\n"
        "sys.argv = ['mimo_jobs.trainer', 'run.yaml']\n"
        "import runpy\n"
        "try:\n"
        "    runpy.run_module('mimo_jobs.trainer', run_name='__main__')\n"
        "except SystemExit as e:\n"
        "    print('megatron imported:', any(m.startswith('megatron') for m in sys.modules))\n"
        "    raise\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=600
    )
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("mimo-jobs trainer: error: megatron-core is not installed: "), r.stderr
    assert "Traceback" not in r.stderr and r.stdout.strip() == "megatron imported: False"

"""The trainer refuses a Python or megatron-core it was not written for, in one line, before importing
megatron (mimo_jobs/trainer/stack.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import tomllib

from helpers import REPO
from mimo_jobs.trainer.stack import required_megatron_core, stack_problem, te_import_problem


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


def _broken_te(root, raise_line: str):
    """A stand-in for an installed Transformer Engine that does not load (TE cannot be installed here): its
    package raises on import as a broken install does."""
    pkg = root / "transformer_engine"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(raise_line + "\n")
    return root


def test_a_te_that_does_not_import_is_named_with_what_to_do(tmp_path):
    """megatron-core guards its Transformer Engine imports with `except ModuleNotFoundError` in places
    (megatron/core/tensor_parallel/random.py): an installed TE that fails otherwise crashes `import
    megatron.core`. The trainer says so in one line and exits 2."""
    from helpers.launch import trainer, worker_env

    te = _broken_te(
        tmp_path / "site",
        'raise ImportError("transformer_engine_torch.so: undefined symbol: _ZN3c1017RegisterOperatorsD1Ev")',
    )
    env = worker_env(zygote=False)
    env["PYTHONPATH"] = os.pathsep.join([str(te), env["PYTHONPATH"]])
    r = subprocess.run(
        trainer(Path("run.yaml")),
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=600,
    )
    assert r.returncode == 2, r.stderr[-3000:]
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "mimo-jobs trainer: error: Transformer Engine is installed but does not import (ImportError: "
        "transformer_engine_torch.so: undefined symbol: "
    ), r.stderr[-3000:]
    assert "install its distributions together at one version" in last
    assert "Traceback" not in r.stderr


def test_the_te_message_names_versions_that_differ_and_leaves_other_failures_alone():
    try:
        raise AssertionError("Transformer Engine package version mismatch")
    except AssertionError as e:  # raised here, not in transformer_engine: not TE's
        assert te_import_problem(e, {}) is None
    err = ModuleNotFoundError(
        "No module named 'transformer_engine.pytorch.fp8'", name="transformer_engine.pytorch.fp8"
    )
    said = te_import_problem(err, {"transformer-engine": "2.18.0", "transformer-engine-cu13": "2.17.0"})
    assert "installed: transformer-engine 2.18.0, transformer-engine-cu13 2.17.0 (not one version)" in said
    assert te_import_problem(ImportError("No module named 'energon'", name="energon"), {}) is None

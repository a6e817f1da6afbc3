"""One way to launch: every process a test starts gets its environment from helpers.launch.worker_env and its
trainer/torchrun command from helpers.launch (the checkout first on PYTHONPATH, one thread, no dynamo)."""

from __future__ import annotations

import re
import subprocess
import sys

from helpers import REPO, TESTS
from helpers.launch import torchrun, trainer, worker_env

# a command line or an environment assembled by hand (what helpers.launch owns)
HAND_MADE = re.compile(
    r'"-m",\s*"torch\.distributed\.run"|"-m",\s*"mimo_jobs\.trainer"|OMP_NUM_THREADS="1"|TORCHDYNAMO_DISABLE="1"'
)
OWNER = TESTS / "helpers" / "launch.py"
ALLOWED = {
    TESTS / "study" / "test_render.py",  # the argv the rendered launch.sh hands torchrun, not a launch
    TESTS / "house" / "test_toolkit_on_python310.py",  # another Python on purpose, without the trainer
    TESTS / "house" / "test_one_launch.py",  # this check's own pattern and examples
}


def test_a_started_process_imports_this_checkout():
    code = "import mimo_jobs, os; print(os.path.realpath(mimo_jobs.__file__))"
    out = subprocess.run(
        [sys.executable, "-c", code], env=worker_env(), cwd="/", capture_output=True, text=True
    )
    assert out.stdout.strip().startswith(str(REPO.resolve()) + "/"), out.stdout + out.stderr
    env = worker_env({"X": 1})
    assert env["PYTHONPATH"].split(":")[:2] == [str(REPO), str(TESTS)] and env["X"] == "1"
    assert (env["OMP_NUM_THREADS"], env["TORCHDYNAMO_DISABLE"]) == ("1", "1") and "WORLD_SIZE" not in env


def test_commands_come_from_the_launch_helper():
    assert trainer(REPO / "r.yaml", "--reference") == [
        sys.executable,
        "-m",
        "mimo_jobs.trainer",
        str(REPO / "r.yaml"),
        "--reference",
    ]
    cmd = trainer(REPO / "r.yaml", nproc=3)
    assert cmd[:5] == [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "3"]
    assert cmd[-3:] == ["-m", "mimo_jobs.trainer", str(REPO / "r.yaml")] and torchrun(2, "w.py")[-1] == "w.py"


def test_no_test_assembles_its_own_launch():
    found = []
    for path in sorted(TESTS.rglob("*.py")):
        if path == OWNER or path in ALLOWED or path.name.endswith("_worker.py"):
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if HAND_MADE.search(line):
                found.append(f"{path.relative_to(REPO)}:{n}: {line.strip()}")
    assert not found, "use helpers.launch (worker_env, trainer, torchrun) instead:\n" + "\n".join(found)
    assert HAND_MADE.search('cmd = [sys.executable, "-m", "torch.distributed.run"]')  # the check can fail

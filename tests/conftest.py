"""Shared pytest fixtures. Keep this small; per-area fixtures live in their test folders."""

import os

import pytest

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # pytest-xdist's workers start with COLUMNS=80; the commands the tests run print to a pipe as a user's
    # would, where no COLUMNS is set (a test that wants a width sets its own)
    os.environ.pop("COLUMNS", None)


@pytest.fixture(scope="session")
def shared_runs(tmp_path_factory):
    """Trainer runs launched once per pytest run, whichever worker asks first, and read by every test that
    needs them (helpers.runs)."""
    from helpers.runs import SharedRuns, shared_root
    from helpers.trainer import launch_run

    return SharedRuns(shared_root(tmp_path_factory) / "shared-runs", launch_run)


@pytest.fixture(scope="session", autouse=True)
def zygote(tmp_path_factory, request):
    """This pytest worker's preloaded interpreter for trainer processes (helpers/zygote.py), up for the whole
    run when it runs slow tests (where the trainer runs); MIMO_JOBS_TEST_ZYGOTE=0 runs every trainer process
    from scratch instead."""
    import subprocess
    import sys

    from helpers import launch

    slow = any(item.get_closest_marker("slow") for item in request.session.items)
    if os.environ.get("MIMO_JOBS_TEST_ZYGOTE") == "0" or not slow:
        yield None
        return
    sock = tmp_path_factory.mktemp("zygote") / "z.sock"
    proc = subprocess.Popen(
        [sys.executable, "-m", "helpers.zygote", str(sock)],
        env=launch.worker_env(zygote=False),
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    ready = proc.stdout.readline().strip() == "ready"
    launch.ZYGOTE["socket"] = str(sock) if ready else ""  # no zygote: every trainer starts from scratch
    yield proc
    launch.ZYGOTE["socket"] = ""
    proc.kill()
    proc.wait()

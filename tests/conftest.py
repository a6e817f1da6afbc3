"""Shared pytest fixtures. Keep this small; per-area fixtures live in their test folders."""

import os

import pytest

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")


@pytest.fixture(scope="session")
def shared_runs(tmp_path_factory):
    """Trainer runs launched once per pytest run, whichever worker asks first, and read by every test that
    needs them (helpers.runs)."""
    from helpers.runs import SharedRuns, shared_root
    from helpers.trainer import launch_run

    return SharedRuns(shared_root(tmp_path_factory) / "shared-runs", launch_run)

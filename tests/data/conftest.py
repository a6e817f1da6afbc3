"""Real energon datasets made by the tests (synthetic shards, prepared in-process; ~0.2 s each)."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def synth_blend(tmp_path_factory):
    """512 samples, 25% text-only, images 8x8 / 12x12 / 16x8 (4, 9, 8 tokens with patch 4)."""
    from mimo_jobs.data.synth import SynthConfig, synth

    root = tmp_path_factory.mktemp("synth")
    cfg = SynthConfig(
        samples=512,
        text_only_fraction=0.25,
        image_sizes=((8, 8), (12, 12), (16, 8)),
        samples_per_shard=32,
        seed=7,
    )
    with contextlib.redirect_stdout(io.StringIO()):
        res = synth(root, cfg)
    return res, cfg


def pytest_collection_modifyitems(config, items):
    here = str(Path(__file__).parent)
    for item in items:
        if str(item.fspath).startswith(here):
            # energon's loader asks for pinned memory; CPU torch warns that there is no accelerator
            item.add_marker(pytest.mark.filterwarnings("ignore:'pin_memory' argument is set as true"))

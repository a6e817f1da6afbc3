"""The energon loader state a checkpoint holds is read as data: a state whose pickle would call anything
beyond energon's state records, tensors and plain containers is refused before it runs, naming the
checkpoint; the state a provider saved (also with pending multiplexed batches) restores as before."""

from __future__ import annotations

import contextlib
import io
import pickle
from pathlib import Path

import pytest

from mimo_jobs.contract.manifest import CheckpointError
from mimo_jobs.data import loader_state
from mimo_jobs.data.energon_provider import EnergonProvider, LoaderConfig
from mimo_jobs.data.images import ImageGeometry
from mimo_jobs.trainer.checkpoint.reshard import load_provider_state


class _Writes:
    """Unpickling this opens (creates) the marker file: what a crafted state could do instead."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


@pytest.fixture(scope="module")
def blend(tmp_path_factory):
    from mimo_jobs.data.synth import SynthConfig, synth

    root = tmp_path_factory.mktemp("state")
    with contextlib.redirect_stdout(io.StringIO()):
        res = synth(
            root / "ds",
            SynthConfig(
                samples=32, text_only_fraction=0.25, image_sizes=((8, 8),), samples_per_shard=8, seed=3
            ),
        )
    return res.blend


def _provider(blend, lanes: list[int]) -> EnergonProvider:
    cfg = LoaderConfig(
        path=str(blend),
        llm_dp=2,
        mbs=2,
        num_microbatches=1,
        seq_length=64,
        geometry=ImageGeometry(patch_size=4, image_size=16),
        vocab_size=128,
    )
    return EnergonProvider(cfg, lanes, need_images=True)


def _saved(blend, lanes: list[int]) -> dict:
    p = _provider(blend, lanes)
    try:
        for _ in range(3):
            p.next(lanes[0])  # uneven: the multiplexed loader holds pending batches of the other lane
        return p.state_dict()
    finally:
        p.close()


def _replace_bytes(state, evil: bytes):
    """`state` with every pickled blob in it replaced by `evil`."""
    if isinstance(state, bytes):
        return evil
    if isinstance(state, dict):
        return {k: _replace_bytes(v, evil) for k, v in state.items()}
    if isinstance(state, list):
        return [_replace_bytes(v, evil) for v in state]
    return state


@pytest.mark.parametrize("lanes", [[0], [0, 1]], ids=["own-loader", "multiplexed"])
def test_a_crafted_loader_state_is_refused_unrun(blend, lanes, tmp_path):
    saved = _saved(blend, lanes)
    marker = tmp_path / "ran"
    crafted = _replace_bytes(saved, pickle.dumps(_Writes(marker)))
    assert crafted != saved
    p = _provider(blend, lanes)
    try:
        with pytest.raises(CheckpointError, match=r"ckpt/rank-00000\.pt: .*global _io\.open.*could run code"):
            load_provider_state(p, crafted, tmp_path / "ckpt" / "rank-00000.pt")
    finally:
        p.close()
    assert not marker.exists()


def test_a_tensor_storage_cannot_smuggle_a_pickle(tmp_path):
    """torch pickles a storage as `torch.storage._load_from_bytes(bytes)`, which unpickles those bytes with
    any global; here they are read as tensors only."""
    import torch.storage

    marker = tmp_path / "ran"
    inner = pickle.dumps(_Writes(marker))

    class _Storage:
        def __reduce__(self):
            return (torch.storage._load_from_bytes, (inner,))

    with pytest.raises(loader_state.LoaderStateRefused):
        loader_state.loads(pickle.dumps(_Storage()))
    assert not marker.exists()


@pytest.mark.parametrize("lanes", [[0], [0, 1]], ids=["own-loader", "multiplexed"])
def test_the_saved_state_still_resumes(blend, lanes):
    """A state written as a plain pickle (as every checkpoint so far) restores and continues exactly."""
    a = _provider(blend, lanes)
    b = _provider(blend, lanes)
    try:
        for _ in range(3):
            a.next(lanes[0])
        state = a.state_dict()
        want = [a.next(x).sample_keys for x in lanes for _ in range(2)]
        load_provider_state(b, state, Path("unused"))
        got = [b.next(x).sample_keys for x in lanes for _ in range(2)]
        assert got == want
    finally:
        a.close()
        b.close()

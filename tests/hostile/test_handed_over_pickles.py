"""Checkpoint files someone else wrote are read as data: a crafted checkpoint part (`*.pt`) or a crafted tensor
index of a Megatron torch_dist checkpoint (`.metadata`) is refused with one line naming the file, and what it
would have run never runs. Each crafted file is first shown to be live: an unrestricted load runs it."""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from helpers import TESTS  # noqa: E402
from mimo_jobs.trainer.checkpoint import files, reshard  # noqa: E402
from mimo_jobs.trainer.checkpoint.as_data import NotData, load_index, load_part  # noqa: E402

MEGATRON = TESTS / "weights" / "fixtures" / "megatron_core_0.16.1_torch_dist"


class _Payload:
    """Unpickling this touches `mark`: what a crafted file would do, harmlessly."""

    def __init__(self, mark: Path):
        self.mark = mark

    def __reduce__(self):
        return (Path.touch, (self.mark,))


def _crafted_part(path: Path, mark: Path) -> Path:
    torch.save({"weights": {"w": torch.ones(2)}, "extra": _Payload(mark)}, path)
    return path


def test_a_crafted_part_is_live_under_an_unrestricted_load(tmp_path):
    mark = tmp_path / "ran"
    torch.load(_crafted_part(tmp_path / "model-00000.pt", mark), weights_only=False)
    assert mark.exists()  # so the refusals below are of a file that really runs code


def test_a_crafted_part_is_refused_by_resume_export_and_reshard(tmp_path):
    mark = tmp_path / "ran"
    part = _crafted_part(tmp_path / "model-00000.pt", mark)
    with pytest.raises(files.CheckpointError, match=r"model-00000\.pt: holds the global .*refused"):
        files._load_file(tmp_path, part.name, {part.name: part.stat().st_size})
    with pytest.raises(files.CheckpointError, match=r"refused: loading it could run code"):
        reshard._load(part)
    assert not mark.exists()


def test_the_savers_own_state_still_loads(tmp_path):
    # what files.py writes: tensors, numbers, and numpy's RNG state (a uint32 array in a tuple)
    state = {"rng": {"numpy": np.random.get_state(), "torch": torch.get_rng_state()}, "iteration": 3}
    torch.save(state, tmp_path / "rank-00000.pt")
    got = load_part(tmp_path / "rank-00000.pt")
    assert got["iteration"] == 3 and np.array_equal(got["rng"]["numpy"][1], state["rng"]["numpy"][1])
    assert torch.equal(got["rng"]["torch"], state["rng"]["torch"])


def test_a_crafted_megatron_index_is_refused_before_megatron_reads_it(tmp_path):
    pytest.importorskip("megatron.core")
    from mimo_jobs.trainer.weights.megatron_load import MegatronInitError, check_source

    good = check_source(MEGATRON)  # the real index of a real checkpoint reads
    assert good.shapes
    src = shutil.copytree(MEGATRON, tmp_path / "ckpt")
    (index,) = src.glob("iter_*/.metadata")
    mark = tmp_path / "ran"
    index.write_bytes(pickle.dumps(_Payload(mark)))
    with open(index, "rb") as f, pytest.raises(NotData):
        load_index(f)
    with pytest.raises(MegatronInitError, match=r"\.metadata: holds the global pathlib\..*refused"):
        check_source(src)
    assert not mark.exists()
    with open(index, "rb") as f:
        pickle.load(f)  # live: an unrestricted load runs it
    assert mark.exists()


def test_weights_of_another_model_at_the_same_layout_are_one_line():
    from mimo_jobs.trainer.checkpoint.state import load_model_state

    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    theirs = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.Linear(5, 2)).state_dict()
    before = [p.clone() for p in model.parameters()]
    with pytest.raises(files.CheckpointError) as e:
        load_model_state(model, theirs, "ckpt/encoder/model-00000.pt")
    msg = str(e.value)
    assert "\n" not in msg
    assert msg == (
        "ckpt/encoder/model-00000.pt: 0.weight is [5, 4] in the checkpoint, [3, 4] in this run's model "
        "(and 2 more): a checkpoint of another model"
    )
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # nothing half-loaded


def test_a_damaged_part_is_called_damaged_not_crafted(tmp_path):
    part = tmp_path / "model-00000.pt"
    torch.save({"w": torch.ones(64)}, part)
    data = part.read_bytes()
    for name, content in (("cut", data[: len(data) // 2]), ("garbage", b"not a checkpoint at all")):
        bad = tmp_path / f"{name}.pt"
        bad.write_bytes(content)
        with pytest.raises(files.CheckpointError) as e:
            files._load_file(tmp_path, bad.name, {bad.name: bad.stat().st_size})
        assert f"{bad}: damaged (" in str(e.value) and "refused" not in str(e.value), str(e.value)

"""A checkpoint manifest.json that is valid JSON but not the shape mimo-jobs writes (another tool's file, a
hand edit): reading it is one CheckpointError naming the file and what is wrong, never a traceback; the
toolkit's view of a run's checkpoints (status, resubmission) skips it instead of failing for every run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mimo_jobs.contract.manifest import (
    LATEST,
    MANIFEST,
    CheckpointError,
    Provenance,
    latest_checkpoint,
    list_checkpoints,
    manifest_doc,
    read_manifest,
)
from mimo_jobs.submit.checkpoints import saved_iteration


def _good(iteration: int) -> dict:
    prov = Provenance(run_id="r1", study="s", run_name="n", layout={"gbs": 4}, world=2)
    return manifest_doc(
        iteration=iteration,
        consumed_samples=4 * iteration,
        provenance=prov,
        files={"rank/rank-00000.pt": 10},
        rank_modules={"0": ["encoder"]},
        save_s=0.1,
    )


def _write(root: Path, iteration: int, doc) -> Path:
    d = root / f"iter_{iteration:07d}"
    d.mkdir(parents=True)
    (d / MANIFEST).write_text(json.dumps(doc))
    return d


def _edit(path: list, value):
    def apply(doc: dict) -> dict:
        target = doc
        for k in path[:-1]:
            target = target[k]
        if value is KeyError:
            del target[path[-1]]
        else:
            target[path[-1]] = value
        return doc

    return apply


SHAPES = {
    "a list": (lambda doc: [doc], "a JSON list, not a checkpoint manifest"),
    "a string": (lambda doc: "iter 4", "a JSON str"),
    "no provenance": (_edit(["provenance"], KeyError), "no field 'provenance'"),
    "provenance a list": (_edit(["provenance"], ["r1"]), "provenance is a list, not a dict"),
    "iteration not a number": (_edit(["iteration"], "four"), "invalid literal"),
    "iteration null": (_edit(["iteration"], None), "not 'NoneType'"),
    "files a list": (_edit(["files"], ["rank-00000.pt"]), "files is a list"),
    "a size not a number": (_edit(["files", "rank/rank-00000.pt"], "10"), "files must map"),
    "layout a string": (_edit(["provenance", "layout"], "tp2"), "layout is a str"),
    "no world": (_edit(["provenance", "world"], KeyError), "no field 'world'"),
}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_a_manifest_of_another_shape_is_one_error_naming_the_file(tmp_path, shape):
    change, says = SHAPES[shape]
    d = _write(tmp_path, 4, change(_good(4)))
    with pytest.raises(CheckpointError) as e:
        read_manifest(d)
    assert str(e.value).startswith(f"{d}/{MANIFEST}: ") and says in str(e.value), str(e.value)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_the_toolkit_skips_it_and_still_sees_the_good_checkpoints(tmp_path, shape):
    change, _ = SHAPES[shape]
    _write(tmp_path, 2, _good(2))
    _write(tmp_path, 4, change(_good(4)))
    (tmp_path / LATEST).write_text("iter_0000004")  # the marker names the bad one
    assert [i.iteration for i in list_checkpoints(tmp_path)] == [2]
    assert saved_iteration(tmp_path) == 2
    with pytest.raises(CheckpointError):  # the trainer's own resume refuses it rather than go back silently
        latest_checkpoint(tmp_path)


def test_the_writers_own_manifest_reads(tmp_path):
    info = read_manifest(_write(tmp_path, 4, _good(4)))
    assert (info.iteration, info.world, info.files) == (4, 2, {"rank/rank-00000.pt": 10})

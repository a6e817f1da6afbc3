"""A dataset is data: a `.nv-meta/sample_loader.py` other than the one this package writes, a loader file
named otherwise, or a sample type from another module would run as Python whenever energon reads the
dataset; `data stats` and the trainer's data build refuse it, naming the file and the opt-in, and read it
only with `--trust-dataset-code` / `trainer.data.trust_dataset_code: true`. This package's own datasets
pass untouched."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from mimo_jobs.data.energon_provider import EnergonProvider, LoaderConfig
from mimo_jobs.data.errors import DataError
from mimo_jobs.data.images import ImageGeometry
from mimo_jobs.data.scan import scan
from mimo_jobs.data.synth_multi import write_multi_image

GEOM = ImageGeometry(patch_size=4, image_size=16)
OWN = "from mimo_jobs.data.samples import conversation_images as sample_loader, part_filter  # noqa: F401\n"


def _dataset(root: Path, marker: Path | None) -> Path:
    """A multi-image dataset; with `marker`, its sample_loader.py also creates that file when imported."""
    write_multi_image(root, 8, [(8, 8)], seed=2, per_shard=8)
    loader = root / ".nv-meta" / "sample_loader.py"
    assert loader.read_text() == OWN
    if marker is not None:
        loader.write_text(f"open({str(marker)!r}, 'w').close()\n" + OWN)
    return root


def _cfg(path: Path, **kw) -> LoaderConfig:
    return LoaderConfig(
        path=str(path),
        llm_dp=1,
        mbs=1,
        num_microbatches=1,
        seq_length=256,
        geometry=GEOM,
        vocab_size=128,
        **kw,
    )


def test_a_foreign_sample_loader_is_refused_by_stats_and_the_trainer(tmp_path, hf_tokenizer):
    marker = tmp_path / "ran"
    ds = _dataset(tmp_path / "ds", marker)
    base = [
        sys.executable,
        "-m",
        "mimo_jobs.cli",
        "data",
        "stats",
        str(ds),
        "--seq-length",
        "256",
        "--tokenizer",
        str(hf_tokenizer),
    ]
    r = subprocess.run(
        base + ["--out", str(tmp_path / "s.json")], capture_output=True, text=True, check=False
    )
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"{ds}/.nv-meta/sample_loader.py is not one of this package's sample loaders" in r.stderr
    assert "--trust-dataset-code" in r.stderr and "trust_dataset_code: true" in r.stderr
    with pytest.raises(DataError, match=r"sample_loader\.py is not one of this package's sample loaders"):
        EnergonProvider(_cfg(ds, tokenizer=str(hf_tokenizer)), [0], need_images=False)
    assert not marker.exists()

    # the opt-in: the user says the dataset is code, and energon runs it
    r = subprocess.run(
        base + ["--out", str(tmp_path / "s.json"), "--trust-dataset-code"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    assert marker.exists()
    marker.unlink()
    p = EnergonProvider(
        _cfg(ds, tokenizer=str(hf_tokenizer), trust_dataset_code=True), [0], need_images=False
    )
    try:
        p.next(0)
    finally:
        p.close()
    assert marker.exists()


def test_loader_files_and_sample_types_from_elsewhere_are_refused(tmp_path, hf_tokenizer):
    ds = _dataset(tmp_path / "ds", None)
    assert scan(str(ds), GEOM, None, str(hf_tokenizer))[0]  # this package's own loader: read
    meta = ds / ".nv-meta" / "dataset.yaml"
    doc = yaml.safe_load(meta.read_text())
    for change, msg in [
        ({"sample_loader": "other.py:sample_loader"}, "names sample_loader: 'other.py:sample_loader'"),
        ({"part_filter": "other.py:keep"}, "names part_filter: 'other.py:keep'"),
        (
            {"sample_type": {"__module__": "evil.samples", "__class__": "S"}},
            "takes its sample type from module 'evil.samples'",
        ),
    ]:
        meta.write_text(yaml.safe_dump({**doc, **change}))
        with pytest.raises(DataError, match=msg):
            scan(str(ds), GEOM, None, None)
    meta.write_text(yaml.safe_dump(doc))


def test_a_blend_checks_every_dataset(tmp_path):
    marker = tmp_path / "ran"
    _dataset(tmp_path / "ds", marker)
    blend = tmp_path / "blend.yaml"
    blend.write_text(
        yaml.safe_dump(
            {
                "__module__": "megatron.energon",
                "__class__": "MetadatasetV2",
                "splits": {"train": {"path": "ds"}},
            }
        )
    )
    with pytest.raises(DataError, match=r"splits.train path 'ds'.*sample_loader\.py is not one"):
        scan(str(blend), GEOM, None, None)
    assert not marker.exists()

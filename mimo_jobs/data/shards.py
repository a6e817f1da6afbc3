"""Writing the project's energon datasets: webdataset shards and the `.nv-meta` energon reads (the one writer
`data synth` and `data prepare` share).

  ShardWriter   samples (key, {member extension: bytes}) streamed into PREFIX-NNNNNN.tar files, a new one
                every `per_shard` samples; byte-identical for identical input (mtime 0)
  prepare       energon's index (index.sqlite, .info.json), split.yaml (each split its shards) and
                dataset.yaml; with `loader`, the sample_loader.py that reads numbered image members
                (samples.py's conversation_images or interleaved_images)

A sample key holds no "." (webdataset splits a member's name at its first dot into key and extension) and
is unique across the dataset (energon's prepare exits the process on a duplicate; it is turned into a
DataError here).
"""

from __future__ import annotations

import contextlib
import io
import re
import tarfile
from pathlib import Path

import yaml

from .errors import DataError

SPLITS = ("train", "val", "test")
_NAME = re.compile(r"[A-Za-z0-9_.-]+")
LOADER = "from mimo_jobs.data.samples import {fn} as sample_loader, part_filter  # noqa: F401\n"


class ShardWriter:
    """Streams samples into `root`/PREFIX-NNNNNN.tar; `names` lists the shards written (relative to root)."""

    def __init__(self, root: Path, prefix: str, per_shard: int):
        if per_shard < 1:
            raise DataError(f"samples per shard = {per_shard}: need at least 1")
        self.root, self.prefix, self.per_shard = Path(root), prefix, per_shard
        self.names: list[str] = []
        self.count = 0
        self._tar: tarfile.TarFile | None = None

    def add(self, key: str, files: dict[str, bytes]) -> None:
        if self.count % self.per_shard == 0:
            self._close_tar()
            self.root.mkdir(parents=True, exist_ok=True)
            name = f"{self.prefix}-{len(self.names):06d}.tar"
            self._tar = tarfile.open(self.root / name, "w")
            self.names.append(name)
        for ext, data in files.items():
            info = tarfile.TarInfo(f"{key}.{ext}")
            info.size = len(data)
            info.mtime = 0  # byte-identical shards for identical input
            self._tar.addfile(info, io.BytesIO(data))
        self.count += 1

    def _close_tar(self) -> None:
        if self._tar is not None:
            self._tar.close()
            self._tar = None

    def close(self) -> list[str]:
        self._close_tar()
        return self.names

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def write_shards(
    root: Path, prefix: str, samples: list[tuple[str, dict[str, bytes]]], per_shard: int
) -> list[str]:
    """Write (key, {ext: bytes}) samples into prefix-NNNNNN.tar files; returns shard names relative to root."""
    with ShardWriter(root, prefix, per_shard) as w:
        for key, files in samples:
            w.add(key, files)
    return w.names


def _exactly(names: list[str]) -> str:
    """A pattern energon's split_parts_patterns matches against each shard name: these names and no other
    (a split without shards matches nothing). energon brace-expands the pattern first, which drops every
    backslash, so a dot is escaped as [.] (the names are this module's own: letters, digits, - _ .)."""
    for n in names:
        if not _NAME.fullmatch(n):
            raise DataError(f"shard name {n!r}: letters, digits, '-', '_' and '.' only")
    return "|".join(n.replace(".", "[.]") + "$" for n in names) or "(?!)"


def prepare(
    root: Path,
    shards: list[str],
    dataset_yaml: dict,
    splits: dict[str, list[str]] | None = None,
    loader: str | None = None,
) -> None:
    """Index the shards for energon and write .nv-meta/split.yaml and dataset.yaml. `splits` maps train,
    val and test to their shards (default: every shard is train). `loader` names the samples.py sample
    loader of a dataset whose samples hold numbered image members."""
    from megatron.energon.flavors.webdataset.base_webdataset import BaseWebdatasetFactory

    splits = splits if splits is not None else {"train": list(shards)}
    try:
        # energon prints its progress on stdout; the commands show their own
        with contextlib.redirect_stdout(io.StringIO()):
            BaseWebdatasetFactory.prepare_dataset(
                root,
                shards,
                split_parts_patterns=[(s, _exactly(splits.get(s, []))) for s in SPLITS],
                workers=1,
                progress_fn=lambda x, y=None: x,
            )
    except SystemExit as e:  # energon exits the process on duplicate keys; turn it into an error
        raise DataError(
            f"{root}: energon prepare failed (exit {e.code}); sample keys must be unique"
        ) from None
    doc = dict(dataset_yaml)
    if loader is not None:
        doc |= {
            "sample_loader": "sample_loader.py:sample_loader",
            "part_filter": "sample_loader.py:part_filter",
        }
        (root / ".nv-meta" / "sample_loader.py").write_text(LOADER.format(fn=loader))
    (root / ".nv-meta" / "dataset.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))

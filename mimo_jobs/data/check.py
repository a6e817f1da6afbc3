"""Cheap checks of an energon data setting before any process group or loader exists (no energon import).
`check_data_path` is the rule of a dataset path: `validate` applies it to each run's dataset
(cli/study.py) and the trainer's energon provider before it opens one (energon_provider.py), so a wrong
path fails once, clearly, instead of on every rank.

A dataset is data, not code, unless its user says otherwise: energon imports the `.nv-meta/dataset.yaml`
`sample_type` module and runs a `sample_loader:`/`part_filter:` Python file from `.nv-meta` whenever the
dataset is read. A dataset whose loader file is not one this package writes (shards.LOADER naming one of
samples.py's loaders), or whose sample type lives outside energon and this package, is refused before
energon opens it, unless `trainer.data.trust_dataset_code: true` (`data stats --trust-dataset-code`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from .errors import DataError
from .shards import LOADER

# samples.py's sample loaders, the only ones shards.prepare names in a sample_loader.py
OWN_LOADERS = ("conversation_images", "media_members", "interleaved_images")
OWN_SAMPLE_MODULES = ("megatron.energon", "mimo_jobs.data")
TRUST_HINT = (
    "energon runs it as Python whenever the dataset is read; refused. If this dataset's code is yours to "
    "run, set trainer.data.trust_dataset_code: true (data stats: --trust-dataset-code)"
)


def _dataset_dir(p: Path, where: str, trust_code: bool = False) -> None:
    if not p.exists():
        raise DataError(f"{where}: {p} does not exist (make one: mimo-jobs data synth DIR)")
    if p.is_dir() and not (p / ".nv-meta" / "dataset.yaml").is_file():
        hint = f" (it holds blend.yaml: use {p / 'blend.yaml'})" if (p / "blend.yaml").is_file() else ""
        raise DataError(f"{where}: {p} is not a prepared energon dataset (no .nv-meta/dataset.yaml){hint}")
    if p.is_dir() and not trust_code:
        check_dataset_code(p, where)


def _own_module(module: Any) -> bool:
    return isinstance(module, str) and any(
        module == m or module.startswith(m + ".") for m in OWN_SAMPLE_MODULES
    )


def check_dataset_code(p: Path, where: str) -> None:
    """Refuse (DataError) a dataset that would make energon run code other than energon's and this
    package's: a foreign sample_loader.py, a loader file under another name, a sample type from elsewhere."""
    meta = p / ".nv-meta"
    try:
        doc = yaml.safe_load((meta / "dataset.yaml").read_text())
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise DataError(f"{where}: {meta / 'dataset.yaml'}: not readable YAML ({e})") from None
    if not isinstance(doc, dict):
        return  # energon's own reader reports a malformed document
    for key, fn in (("sample_loader", "sample_loader"), ("part_filter", "part_filter")):
        if key in doc and doc[key] != f"sample_loader.py:{fn}":
            raise DataError(f"{where}: {meta / 'dataset.yaml'} names {key}: {doc[key]!r}: {TRUST_HINT}")
    for node in (doc, doc.get("sample_type")):
        if isinstance(node, dict) and "__module__" in node and not _own_module(node["__module__"]):
            raise DataError(
                f"{where}: {meta / 'dataset.yaml'} takes its sample type from module {node['__module__']!r}, "
                f"not energon or mimo_jobs.data: {TRUST_HINT}"
            )
    loader = meta / "sample_loader.py"
    if ("sample_loader" in doc or "part_filter" in doc) and loader.exists():
        try:
            text = loader.read_text()
        except (OSError, UnicodeDecodeError):
            text = None
        if text not in {LOADER.format(fn=f) for f in OWN_LOADERS}:
            raise DataError(f"{where}: {loader} is not one of this package's sample loaders: {TRUST_HINT}")


def _blend_paths(node: Any) -> list[str]:
    """Every `path:` a MetadatasetV2 document points at (blends may nest)."""
    out: list[str] = []
    if isinstance(node, dict):
        if isinstance(node.get("path"), str):
            out.append(node["path"])
        for v in node.values():
            out += _blend_paths(v)
    elif isinstance(node, list):
        for v in node:
            out += _blend_paths(v)
    return out


def check_data_path(path: str, trust_code: bool = False) -> None:
    """`path` is an energon dataset folder or a blend YAML whose datasets exist and hold no code beyond
    this package's (unless `trust_code`)."""
    p = Path(path)
    if p.is_file():
        try:
            doc = yaml.safe_load(p.read_text())
        except yaml.YAMLError as e:
            raise DataError(f"trainer.data.path={path!r}: invalid YAML: {e}") from None
        if not isinstance(doc, dict) or "splits" not in doc:
            raise DataError(
                f"trainer.data.path={path!r}: a blend file is a MetadatasetV2 document with `splits:`"
            )
        train = doc["splits"].get("train") if isinstance(doc["splits"], dict) else None
        if not train:
            raise DataError(f"trainer.data.path={path!r}: no `splits.train` entry")
        for sub in _blend_paths(train):
            q = Path(sub)
            if not q.is_absolute():
                q = p.parent / q  # energon resolves blend paths against the YAML's folder
            if q.suffix in (".yaml", ".yml"):
                check_data_path(str(q), trust_code)
            else:
                _dataset_dir(q, f"{path}: splits.train path {sub!r}", trust_code)
    else:
        _dataset_dir(p, f"trainer.data.path={path!r}", trust_code)


def prepared_videos(path: str, _depth: int = 0) -> int:
    """The answer study.runtime_rules.runtime_problems asks for as `videos`: the videos `data prepare`
    recorded (prepare.json's `videos_written`) in a dataset folder, or in every dataset a blend YAML names (relative paths from its
    folder, as energon resolves them). A dataset without that record (written by another tool) counts none
    here; the task encoder refuses its first video with the same reason."""
    p = Path(path)
    if p.is_dir():
        try:
            doc = json.loads((p / "prepare.json").read_text())
        except (OSError, ValueError):
            return 0
        n = doc.get("videos_written", 0) if isinstance(doc, dict) else 0
        return n if isinstance(n, int) else 0
    if not p.is_file() or _depth > 8:  # blends nest a few levels, never in a cycle
        return 0
    try:
        doc = yaml.safe_load(p.read_text())
    except (OSError, ValueError, yaml.YAMLError):
        return 0
    subs = [Path(s) if Path(s).is_absolute() else p.parent / s for s in _blend_paths(doc)]
    return sum(prepared_videos(str(s), _depth + 1) for s in subs)

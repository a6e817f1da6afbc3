"""Cheap checks of an energon data setting before any process group or loader exists (no energon import):
the trainer's preflight and `validate` can call `check_energon_data(run_spec)` so a wrong path or a
seq_length too short for the largest image fails once, clearly, instead of on every rank."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from .errors import DataError
from .images import geometry_of_preset
from .tokenizer import PRINTABLE


def _dataset_dir(p: Path, where: str) -> None:
    if not p.exists():
        raise DataError(f"{where}: {p} does not exist (make one: mimo-jobs data synth DIR)")
    if p.is_dir() and not (p / ".nv-meta" / "dataset.yaml").is_file():
        hint = f" (it holds blend.yaml: use {p / 'blend.yaml'})" if (p / "blend.yaml").is_file() else ""
        raise DataError(f"{where}: {p} is not a prepared energon dataset (no .nv-meta/dataset.yaml){hint}")


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


def check_data_path(path: str) -> None:
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
                check_data_path(str(q))
            else:
                _dataset_dir(q, f"{path}: splits.train path {sub!r}")
    else:
        _dataset_dir(p, f"trainer.data.path={path!r}")


def check_energon_data(run_spec: Any) -> None:
    from mimo_jobs.model.resolve import arch_of

    t = run_spec.trainer
    d = t.data
    if d.provider != "energon":
        return
    check_data_path(str(d.path))
    geom = geometry_of_preset(t.model)
    need = (geom.max_tokens if geom is not None else 0) + 2  # BOS + the largest image + at least EOS
    if geom is not None and need > t.seq_length:
        raise DataError(
            f"trainer.seq_length={t.seq_length} cannot hold the largest image of preset {t.model!r} "
            f"({geom.image_size}x{geom.image_size} px = {geom.max_tokens} tokens) plus BOS/EOS; "
            f"use seq_length >= {need}"
        )
    vocab = arch_of(t.model).llm.vocab_size
    if not d.tokenizer and vocab < len(PRINTABLE) + 5:
        raise DataError(
            f"the built-in tokenizer needs vocab_size >= {len(PRINTABLE) + 5}; preset {t.model!r} has "
            f"{vocab}: give trainer.data.tokenizer"
        )

"""trainer.model -> ModelArch, the one resolver every consumer calls.

trainer.model is a full preset's name (str), or {name?, description?, encoder?: SIDE, llm: SIDE} where SIDE
is a packaged module's name, inline fields, {preset: NAME, ...overrides} or {hf_config: PATH, ...overrides}.
Without an encoder the model is text-only (a GPT alone): another program's runs are priced as it, without
images; the packaged trainer refuses it (model/splits.py holds that rule).
`resolved_field` turns a description into the self-contained form expansion records in run.yaml (inline
fields only, no paths); a preset name stays a name.
"""

from __future__ import annotations

import json
from pathlib import Path

from mimo_jobs.model import hf
from mimo_jobs.model.arch import ArchError, EncoderArch, LLMArch, ModelArch
from mimo_jobs.model.presets import encoder_preset, get_preset, llm_preset

_MODEL_KEYS = ("name", "description", "encoder", "llm")


def arch_of(model, base_dir: str | Path | None = None) -> ModelArch:
    """The architecture a trainer.model value describes; hf_config paths are relative to base_dir (the study
    file's directory). Errors are ArchError with the field's path under trainer.model."""
    if isinstance(model, ModelArch):
        return model
    if isinstance(model, str):
        return get_preset(model)
    if not isinstance(model, dict):
        raise ArchError("", f"must be a preset name or a mapping, got {type(model).__name__}")
    unknown = sorted(set(model) - set(_MODEL_KEYS))
    if unknown:
        raise ArchError(unknown[0], f"unknown key; a model has {', '.join(_MODEL_KEYS)}")
    if model.get("llm") is None:
        raise ArchError(
            "llm", "missing (a model names its LLM, and its image encoder unless it is text-only)"
        )
    enc = None
    if model.get("encoder") is not None:
        enc = _side(model["encoder"], "encoder", EncoderArch, encoder_preset, hf.encoder_fields, base_dir)
    llm = _side(model["llm"], "llm", LLMArch, llm_preset, hf.llm_fields, base_dir)
    name = model.get("name") or "+".join(n for n in (enc and enc.name, llm.name) if n)
    return ModelArch(name=name, encoder=enc, llm=llm, description=model.get("description", ""))


def resolved_field(model, base_dir: str | Path | None = None):
    """What run.yaml records for trainer.model: a preset name as is, anything else fully inline (a text-only
    model without an encoder key, so every description with one keeps its run ids)."""
    if isinstance(model, str):
        get_preset(model)  # an unknown name fails here, not in the trainer
        return model
    a = arch_of(model, base_dir)
    out = {"name": a.name, "description": a.description}
    if a.encoder is not None:
        out["encoder"] = a.encoder.to_dict()
    return out | {"llm": a.llm.to_dict()}


def _side(value, where: str, cls, preset, from_hf, base_dir):
    try:
        if isinstance(value, str):
            return preset(value)
        if not isinstance(value, dict):
            raise ArchError("", f"must be a preset name or a mapping, got {type(value).__name__}")
        fields = dict(value)
        if "preset" in fields and "hf_config" in fields:
            raise ArchError("hf_config", "give either preset or hf_config, not both")
        if "preset" in fields:
            name = fields.pop("preset")
            base = preset(name).to_dict()
            return _overridden(cls, base, fields, name)
        if "hf_config" in fields:
            path = fields.pop("hf_config")
            base = _read_hf(path, base_dir, from_hf)
            return _overridden(cls, base, fields, _config_name(str(path)))
        return cls.from_dict(fields)
    except ArchError as e:
        raise e.under(where) from None


def _config_name(path: str) -> str:
    """models/qwen3-30b-a3b/config.json -> qwen3-30b-a3b; models/vit.json -> vit."""
    p = Path(path)
    return (p.parent.name if p.name == "config.json" else p.stem) or path


def _overridden(cls, base: dict, overrides: dict, name: str):
    """The base fields with the overrides on top; the name records what was changed."""
    changed = {k: v for k, v in overrides.items() if k not in ("name", "source")}
    default_name = name + "".join(f"[{k}={v}]" for k, v in sorted(changed.items()))
    merged = base | overrides
    if "name" not in overrides:
        merged["name"] = default_name
    return cls.from_dict(merged)


def _read_hf(path, base_dir, from_hf) -> dict:
    try:
        p = Path(str(path)).expanduser()
    except RuntimeError as e:  # ~user with no home directory
        raise ArchError("hf_config", f"{path}: {str(e).rstrip('.')}") from None
    if not p.is_absolute() and base_dir is not None:
        p = Path(base_dir) / p
    if not p.is_file():
        rel = (
            f" (relative to {base_dir})" if base_dir is not None and not Path(str(path)).is_absolute() else ""
        )
        raise ArchError("hf_config", f"no such file: {path}{rel}")
    try:
        cfg = json.loads(p.read_text())
    except (OSError, ValueError) as e:
        raise ArchError("hf_config", f"{path} is not a readable JSON file: {e}") from None
    try:
        fields = from_hf(cfg)
    except ArchError as e:
        raise ArchError("hf_config", f"{path}: {e.describe()}") from None
    return fields | {"source": str(path)}

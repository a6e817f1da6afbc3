"""trainer.model -> ModelArch, the one resolver every consumer calls.

trainer.model is a full preset's name (str), or {name?, description?, encoder?: SIDE, encoders?: {NAME: SIDE},
llm: SIDE} where SIDE is a packaged module's name, inline fields, {preset: NAME, ...overrides} or
{hf_config: PATH, ...overrides}. `encoder:` is the one module named `vision`; `encoders:` names each module
(in rank order, after `vision` when both are given). Without an encoder the model is text-only (a GPT alone): another program's runs are priced as it, without
images; the packaged trainer refuses it (model/splits.py holds that rule).
`resolved_field` turns a description into the self-contained form expansion records in run.yaml (inline
fields only, no paths); a preset name stays a name. `image_model` reads a command-line model argument
(`data stats --model`): anything trainer.model accepts, or an image encoder alone (anything
trainer.model.encoder accepts), since the encoder alone decides a dataset's image tokens.
"""

from __future__ import annotations

import os
from pathlib import Path

from mimo_jobs import strictread
from mimo_jobs.model import families, hf
from mimo_jobs.model.arch import (
    ArchError,
    EncoderArch,
    LLMArch,
    ModelArch,
    encoder_arch_from_dict,
    module_name_problem,
)
from mimo_jobs.model.presets import ENCODERS, LLMS, PRESETS, encoder_preset, get_preset, llm_preset

_MODEL_KEYS = ("name", "description", "encoder", "encoders", "llm")


def _encoder_fields(cfg: dict) -> dict:
    """An encoder's fields from its HF config: an audio family's (model/families) when the config names
    one, else an image encoder's (hf.encoder_fields refuses what it cannot read)."""
    audio = families.audio_of(cfg)
    return audio.fields(cfg) if audio is not None else hf.encoder_fields(cfg)


class _AnyEncoder:
    """The encoder side's class: fields read back as the architecture their `kind` names."""

    from_dict = staticmethod(encoder_arch_from_dict)


def _encoder_side(value, where: str, base_dir):
    return _side(value, where, _AnyEncoder, encoder_preset, _encoder_fields, base_dir)


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
        enc = _encoder_side(model["encoder"], "encoder", base_dir)
    encs = _named_encoders(model.get("encoders"), base_dir)
    llm = _side(model["llm"], "llm", LLMArch, llm_preset, hf.llm_fields, base_dir)
    mods = ([enc] if enc is not None else []) + list(encs.values())
    name = model.get("name") or "+".join(n for n in (*(m.name for m in mods), llm.name) if n)
    return ModelArch(name=name, encoder=enc, llm=llm, description=model.get("description", ""), encoders=encs)


def _named_encoders(value, base_dir) -> dict:
    """trainer.model.encoders: module name -> encoder architecture, in the order written."""
    if value is None:
        return {}
    if not isinstance(value, dict) or not value:
        raise ArchError(
            "encoders", "must map module names to encoders, e.g. {vision: siglip-so400m-14-384, audio: ...}"
        )
    out = {}
    for n, side in value.items():
        bad = module_name_problem(n)
        if bad:
            raise ArchError(f"encoders.{n}", bad)
        if side is None:
            raise ArchError(
                f"encoders.{n}", "missing (an encoder preset, inline fields or {hf_config: PATH})"
            )
        out[n] = _encoder_side(side, f"encoders.{n}", base_dir)
    return out


def resolved_field(model, base_dir: str | Path | None = None):
    """What run.yaml records for trainer.model: a preset name as is, anything else fully inline (a text-only
    model without an encoder key, so every description with one keeps its run ids)."""
    if isinstance(model, str):
        get_preset(model)  # an unknown name fails here, not in the trainer
        return model
    a = arch_of(model, base_dir)
    out = {"name": a.name, "description": a.description}
    if a.single_vision:
        # one module named vision, however written, is `encoder:`: the run ids it always had
        if a.encoder is not None:
            out["encoder"] = a.encoder.recorded()
    else:
        out["encoders"] = {n: _recorded(e) for n, e in a.named_encoders}
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
        raise ArchError("hf_config", f"no such file: {path}{_relative_to(path, base_dir)}")
    cfg = read_hf_config(p, str(path))
    try:
        fields = from_hf(cfg)
    except ArchError as e:
        raise ArchError("hf_config", f"{path}: {e.describe()}") from None
    return fields | {"source": str(path)}


def _relative_to(path, base_dir) -> str:
    """How a relative path was read, for the message of a missing one: the folder it was taken from, in
    full (a study in the working directory has the base "."), as the study's other path errors name it."""
    if base_dir is None or Path(str(path)).expanduser().is_absolute():
        return ""
    return f" (relative to {os.path.abspath(base_dir)})"


# A HuggingFace config.json is a few KB; a much larger file is no model config (and is not read whole).
MAX_CONFIG_BYTES = 16 << 20


def read_hf_config(p: Path, shown: str | None = None) -> dict:
    """A HuggingFace config.json as a JSON object, read strictly (mimo_jobs/strictread.py: no key twice,
    bounded nesting); ArchError on field hf_config naming the file (as `shown`) and what is wrong."""
    shown = shown or str(p)
    try:
        size = p.stat().st_size
        if size > MAX_CONFIG_BYTES:
            raise ArchError(
                "hf_config", f"{shown}: {size:,} bytes; a config.json is at most {MAX_CONFIG_BYTES:,}"
            )
        cfg = strictread.json_text(p.read_bytes())
    except OSError as e:
        raise ArchError("hf_config", f"{shown} is not a readable JSON file: {e.strerror or e}") from None
    except strictread.DocumentError as e:
        raise ArchError("hf_config", f"{shown}: {e.describe()}") from None
    if not isinstance(cfg, dict):
        raise ArchError("hf_config", f"{shown}: a JSON {type(cfg).__name__}, not a model config (an object)")
    return cfg


MAX_ARGUMENT = 16_384  # characters of a command-line model argument
# What a command-line model argument may be, with an example of each that works as written.
MODEL_ARGUMENT_FORMS = (
    "a model preset (e.g. tiny), an encoder preset (e.g. siglip-so400m-14-384), the path of a HuggingFace "
    "config.json of a CLIP or SigLIP vision model, or a trainer.model description in YAML, e.g. "
    "'{encoder: {preset: siglip-so400m-14-384, image_size: 448}, llm: qwen2.5-7b}'"
)


def image_model(text: str, base_dir: str | Path | None = None) -> tuple[EncoderArch, LLMArch | None]:
    """The image encoder a command-line model argument names, and its LLM when it names one (None: an encoder
    alone). The argument is read as data (YAML or JSON, never run); the descriptions go through arch_of and
    the encoder side of a description, the one parser of trainer.model. ArchError names what would fit."""
    text = text.strip()
    if len(text) > MAX_ARGUMENT:
        raise ArchError("", f"{len(text):,} characters; a model argument holds at most {MAX_ARGUMENT:,}")
    if text.startswith("{"):
        value = _mapping(text, MODEL_ARGUMENT_FORMS)
        if set(value) & set(_MODEL_KEYS) and not set(value) & {"preset", "hf_config"}:
            return _with_encoder(arch_of(value, base_dir))
        return _side(value, "encoder", EncoderArch, encoder_preset, hf.encoder_fields, base_dir), None
    if text in PRESETS:
        return _with_encoder(get_preset(text))
    if text in ENCODERS:
        return ENCODERS[text], None
    if text in LLMS:
        raise ArchError(
            "", f"{_shown(text)} is an LLM preset, which sees no images; give {MODEL_ARGUMENT_FORMS}"
        )
    if text.endswith(".json") or _is_file(text):
        return _side(
            {"hf_config": text}, "encoder", EncoderArch, encoder_preset, hf.encoder_fields, base_dir
        ), None
    known = f"model presets {', '.join(sorted(PRESETS))}; encoder presets {', '.join(sorted(ENCODERS))}"
    raise ArchError("", f"{_shown(text)} is no model this knows ({known}); give {MODEL_ARGUMENT_FORMS}")


def _mapping(text: str, forms: str) -> dict:
    """A `{...}` command-line argument read as a YAML mapping (data only, strictly: no anchors or aliases,
    no key given twice, bounded nesting)."""
    import yaml

    try:
        # anchors and aliases could expand a short text into a huge one: a description writes its fields
        if any(isinstance(t, (yaml.AnchorToken, yaml.AliasToken)) for t in yaml.scan(text)):
            raise ArchError("", "YAML anchors and aliases (& and *) are not read here; write the fields out")
    except yaml.YAMLError as e:
        raise ArchError(
            "", f"{_shown(text)} is not a YAML mapping ({_first_line(e)}); give {forms}"
        ) from None
    try:
        value = strictread.yaml_text(text)
    except strictread.DocumentError as e:
        raise ArchError("", f"{_shown(text)} is not a YAML mapping ({e.describe()}); give {forms}") from None
    if not isinstance(value, dict):
        raise ArchError("", f"{_shown(text)} is not a mapping; give {forms}")
    return value


PLAN_MODEL_FORMS = (
    "a model preset (tiny, dense-1b, ...), an LLM preset alone (a text-only model, e.g. qwen2.5-7b), an LLM's "
    "HuggingFace config.json, or a trainer.model description as YAML ('{encoder: ..., llm: ...}')"
)


def model_argument(text: str) -> str | dict:
    """A command-line model argument as the trainer.model value it stands for (checked by the study schema,
    the one parser): a model preset's name, an LLM preset or HF config.json as a text-only model, or a
    description. ArchError names the forms it takes."""
    text = text.strip()
    if len(text) > MAX_ARGUMENT:
        raise ArchError("", f"{len(text):,} characters; a model argument holds at most {MAX_ARGUMENT:,}")
    if text.startswith("{"):
        return _mapping(text, PLAN_MODEL_FORMS)
    if text in PRESETS:
        return text
    if text in LLMS:
        return {"llm": {"preset": text}}
    if text.endswith(".json") or _is_file(text):
        return {"llm": {"hf_config": text}}
    known = f"model presets {', '.join(sorted(PRESETS))}; LLM presets {', '.join(sorted(LLMS))}"
    raise ArchError("", f"{_shown(text)} is no model this knows ({known}); give {PLAN_MODEL_FORMS}")


def _shown(text: str) -> str:
    """The argument as an error quotes it: its start, when long."""
    return repr(text if len(text) <= 80 else text[:77] + "...")


def _is_file(text: str) -> bool:
    try:
        return Path(text).is_file()
    except OSError:  # a name too long for the file system names no file
        return False


def data_model(text: str, base_dir: str | Path | None = None) -> tuple[dict, LLMArch | None]:
    """The encoder modules (name -> arch, in the model's order) and LLM a command-line model argument names:
    a description with `encoders:` gives its modules (several, or an audio encoder alone), any other form the
    one image encoder of `image_model` as the module `vision`."""
    stripped = text.strip()
    if stripped.startswith("{") and len(stripped) <= MAX_ARGUMENT:
        value = _mapping(stripped, MODEL_ARGUMENT_FORMS)
        if "encoders" in value:
            a = arch_of(value, base_dir)
            return a.encoders, a.llm
    enc, llm = image_model(text, base_dir)
    return {"vision": enc}, llm


def _with_encoder(a: ModelArch) -> tuple[EncoderArch, LLMArch]:
    if a.encoder is None:
        raise ArchError(
            "encoder", f"model {a.name!r} is text-only (no image encoder); give {MODEL_ARGUMENT_FORMS}"
        )
    return a.encoder, a.llm


def _first_line(e: Exception) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


def _recorded(e) -> dict:
    """What run.yaml records of an encoder: without the later fields at their default where the architecture
    has such fields (EncoderArch.recorded), else all of them."""
    return e.recorded() if hasattr(e, "recorded") else e.to_dict()

"""`ingest --layout/--model` resolved into what the store records for logs without a run.yaml: a layout
written out (ingest/layout.py) or a run of a study file (`STUDY.yaml:RUN`, its run name or id), and a model
as trainer.model takes it (a preset's name, a file holding a model description or a HuggingFace config.json,
or a mapping written inline), resolved by the study schema's own rule (model/resolve.py). Reads the study
and model files; the parsing rules live in ingest/layout.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mimo_jobs import strictread

from .discover import IngestError
from .layout import Told, parse_layout, place


def told(
    layout: str | None,
    model: str | None,
    nodes: int | None = None,
    gpus_per_node: int | None = None,
    seq_length: int | None = None,
) -> Told | None:
    """What the options tell, checked; None when neither --layout nor --model is given."""
    if layout is None and model is None:
        return None
    fields: dict = {}
    spec = None
    if layout is not None:
        ref = _study_run_ref(layout)
        if ref is not None:
            fields, spec = _from_study(*ref)
            if nodes is not None and nodes != fields["nodes"]:
                raise IngestError(
                    f"--nodes {nodes}: run {ref[1]!r} of {ref[0]} has {fields['nodes']} node(s)"
                )
        else:
            fields = place(parse_layout(layout), nodes, gpus_per_node)
    resolved = resolve_model(model) if model is not None else None
    if layout is not None and spec is None:
        fields["modules"] = _module_rows(fields, resolved)
    if model is not None:
        fields["model"] = stored_model(resolved)
        if spec is not None:  # the study's run, priced as the model told
            spec = {**spec, "trainer": {**spec["trainer"], "model": resolved}}
    if seq_length is not None:
        fields["seq_length"] = seq_length
    fields.setdefault("accelerator", "gpu")  # logs brought here for MFU come from GPUs
    return Told(fields, spec)


def _study_run_ref(text: str) -> tuple[Path, str] | None:
    """`FILE.yaml:RUN` -> (file, run); None for a written-out layout."""
    if "|" in text or ":" not in text:
        return None
    file, run = text.rsplit(":", 1)
    if not file.endswith((".yaml", ".yml")):
        return None
    if not Path(file).is_file():
        raise IngestError(f"--layout {text!r}: study file {file} not found")
    return Path(file), run


def _from_study(file: Path, run: str) -> tuple[dict, dict]:
    from mimo_jobs.study.expand import runs_of
    from mimo_jobs.study.load import load_study

    runs = runs_of(load_study(file), str(file))
    match = [r for r in runs if run in (r.name, r.run_id)]
    if not match:
        names = ", ".join(r.name for r in runs[:10]) + (", ..." if len(runs) > 10 else "")
        raise IngestError(f"--layout {file}:{run}: no run {run!r} in that study (runs: {names})")
    r = match[0]
    f = r.catalog_fields()
    # enc_*: the runs table's older one-encoder columns (None for several modules: their `modules` rows)
    keep = ("nodes", "gpus_per_node", "world", "enc_tp", "enc_pp", "enc_dp", "llm_tp", "llm_pp", "llm_ep")
    keep += ("llm_etp", "llm_dp", "gbs", "mbs", "seq_length", "model", "accelerator", "colocated")
    keep += ("modules",)
    fields = {k: f[k] for k in keep}
    if not isinstance(fields["model"], str):
        fields["model"] = (fields["model"] or {}).get("name")
    return fields, r.to_dict()


def _module_rows(fields: dict, model) -> tuple[dict, ...]:
    """The run_modules rows of a written-out layout: each encoder's ranks as topology places them."""
    from mimo_jobs.study.runspec import module_rows
    from mimo_jobs.study.topology import Layout

    lay = Layout(
        fields["nodes"],
        fields["gpus_per_node"],
        encoders=fields["encoders"],
        llm_tp=fields["llm_tp"],
        llm_pp=fields["llm_pp"],
        llm_cp=fields["llm_cp"],
        llm_dp=fields["llm_dp"],
        colocated=fields["colocated"],
    )
    return module_rows(lay, model)


def stored_model(resolved: str | dict) -> str:
    """What the runs row keeps as a log run's model: a preset's name, or the resolved description as JSON
    (self-contained: the report prices it without the files it was read from)."""
    return resolved if isinstance(resolved, str) else json.dumps(resolved, sort_keys=True)


def resolve_model(text: str) -> str | dict:
    """--model as trainer.model takes it, resolved: a preset's name stays a name; a description (a file, or a
    mapping written as YAML/JSON) becomes its inline fields. Raises IngestError saying what is wrong."""
    from pydantic import ValidationError

    from mimo_jobs.study.spec import TrainerSpec

    value, base_dir = _model_value(text)
    try:
        t = TrainerSpec.model_validate({"model": value, "train_iters": 1}, context={"base_dir": base_dir})
    except ValidationError as e:
        msg = e.errors()[0]["msg"].removeprefix("Value error, ")
        raise IngestError(f"--model {text!r}: {msg}") from None
    return t.model


def _is(p: Path, test) -> bool:
    """A path test that is False for text no file system takes as a path (an inline description longer than
    a file name may be)."""
    try:
        return test(p)
    except OSError:
        return False


def _model_value(text: str) -> tuple[Any, Path | None]:
    """(trainer.model's value, the directory its hf_config paths start from). A path is read (a directory:
    its config.json; a HuggingFace config alone is a text-only model's LLM); other text is YAML (JSON is
    YAML): a mapping is a description, a word a preset's name."""
    p = Path(text).expanduser()
    if _is(p, Path.is_dir):
        if not (p / "config.json").is_file():
            raise IngestError(f"--model {text!r}: a directory holding a config.json, and this one has none")
        p = p / "config.json"
    if _is(p, Path.is_file):
        try:
            doc = strictread.yaml_text(p.read_text())
        except (OSError, UnicodeDecodeError) as e:
            raise IngestError(f"--model {text!r}: {p} is not a readable JSON or YAML file: {e}") from None
        except strictread.DocumentError as e:
            raise IngestError(f"--model {text!r}: {p}: {e.describe()}") from None
        if isinstance(doc, dict) and ("architectures" in doc or "model_type" in doc):
            return {"llm": {"hf_config": str(p.resolve())}}, None  # HuggingFace: a text-only model
        if not isinstance(doc, dict):
            raise IngestError(
                f"--model {text!r}: {p} holds no model description (a mapping with llm, and encoder "
                "unless the model is text-only)"
            )
        return doc, p.parent
    try:
        doc = strictread.yaml_text(text)
    except strictread.DocumentError as e:
        raise IngestError(
            f"--model {text!r}: neither a preset's name, a file nor a YAML/JSON mapping: {e.describe()}"
        ) from None
    if isinstance(doc, dict):
        return doc, Path.cwd()
    return text, None

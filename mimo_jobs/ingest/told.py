"""`ingest --layout/--model` resolved into what the store records for logs without a run.yaml: a layout
written out (ingest/layout.py) or a run of a study file (`STUDY.yaml:RUN`, its run name or id), and a model
preset. Reads the study file; the parsing rules live in ingest/layout.py."""

from __future__ import annotations

from pathlib import Path

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
    if model is not None:
        fields["model"] = _preset(model)
        if spec is not None:  # the study's run, priced as the model told
            spec = {**spec, "trainer": {**spec["trainer"], "model": fields["model"]}}
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
    keep = ("nodes", "gpus_per_node", "world", "enc_tp", "enc_pp", "enc_dp", "llm_tp", "llm_pp", "llm_ep")
    keep += ("llm_etp", "llm_dp", "gbs", "mbs", "seq_length", "model", "accelerator", "colocated")
    fields = {k: f[k] for k in keep}
    if not isinstance(fields["model"], str):
        fields["model"] = (fields["model"] or {}).get("name")
    return fields, r.to_dict()


def _preset(name: str) -> str:
    """A model preset's name, checked by the study schema's own rule for trainer.model."""
    from pydantic import ValidationError

    from mimo_jobs.study.spec import TrainerSpec

    try:
        TrainerSpec.model_validate({"model": name, "train_iters": 1})
    except ValidationError as e:
        raise IngestError(f"--model {name!r}: {e.errors()[0]['msg'].removeprefix('Value error, ')}") from None
    return name

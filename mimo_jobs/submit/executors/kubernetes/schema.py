"""A TrainJob manifest checked against the Trainer API's published models (the `kubeflow-trainer-api`
package, generated from the Trainer's OpenAPI spec: v2.3.0 for Trainer v2.3).

The generated models read a dict by picking the keys they know and ignore the rest, and an API server that
prunes unknown fields drops them silently: a field written under a name the API no longer has (v2.1's
`podTemplateOverrides`) would vanish without a word. So every key of the manifest is first walked against
the model at its place (an unknown key is refused with its path), then the whole is validated for types.
"""

from __future__ import annotations

import typing
from typing import Any

from .section import REMOVED_FIELDS, removed_field_message


class ManifestError(ValueError):
    """A manifest the Trainer API would not take as written; the message names the field's path."""


def api_models():
    """The package's TrainJob model, or None when `kubeflow-trainer-api` is not installed (then only the
    removed fields are refused here; the API server checks the rest: submit asks for strict field
    validation)."""
    try:
        from kubeflow_trainer_api.models.trainer_v1alpha1_train_job import TrainerV1alpha1TrainJob
    except ImportError:
        return None
    return TrainerV1alpha1TrainJob


def check(manifest: dict[str, Any], source: str = "TrainJob") -> None:
    """Raise ManifestError naming the first removed or unknown field, or a value of the wrong type."""
    _removed(manifest, "")
    model = api_models()
    if model is None:
        return
    problems: list[str] = []
    _walk(manifest, model, "", problems)
    if problems:
        raise ManifestError(f"{source}: " + "; ".join(problems[:5]))
    try:
        model.from_dict(manifest)
    except Exception as e:  # pydantic's ValidationError (or the oneOf models' ValueError)
        raise ManifestError(f"{source}: not a valid TrainJob: {e}") from None


def _removed(node: Any, path: str) -> None:
    if isinstance(node, dict):
        for k, v in node.items():
            if k in REMOVED_FIELDS:
                raise ManifestError(removed_field_message(k, path + "." if path else ""))
            _removed(v, f"{path}.{k}" if path else k)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            _removed(v, f"{path}[{i}]")


def _model_of(annotation: Any):
    """The generated model a field holds (through Optional/List/Dict), its container kind ('', 'list',
    'dict'); (None, '') for a plain value or a oneOf wrapper (quantities, int-or-string)."""
    from pydantic import BaseModel

    kind = ""
    for _ in range(4):
        origin, args = typing.get_origin(annotation), typing.get_args(annotation)
        if origin is typing.Union or (origin is not None and type(None) in args):
            annotation = next(a for a in args if a is not type(None))
        elif origin in (list, typing.List):  # noqa: UP006
            kind, annotation = "list", args[0]
        elif origin in (dict, typing.Dict):  # noqa: UP006
            kind, annotation = "dict", args[1]
        else:
            break
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        if "actual_instance" in annotation.model_fields:
            return None, ""
        return annotation, kind
    return None, ""


def _walk(node: Any, model, path: str, problems: list[str]) -> None:
    if not isinstance(node, dict):
        return  # a wrong type is the validation's to report
    fields = {(f.alias or name): f for name, f in model.model_fields.items()}
    for key, value in node.items():
        where = f"{path}.{key}" if path else key
        f = fields.get(key)
        if f is None:
            problems.append(f"{where}: unknown field (the API has {', '.join(sorted(fields))})")
            continue
        sub, kind = _model_of(f.annotation)
        if sub is None:
            continue
        if kind == "list" and isinstance(value, list):
            for i, item in enumerate(value):
                _walk(item, sub, f"{where}[{i}]", problems)
        elif kind == "dict" and isinstance(value, dict):
            for k2, item in value.items():
                _walk(item, sub, f"{where}.{k2}", problems)
        elif kind == "":
            _walk(value, sub, where, problems)

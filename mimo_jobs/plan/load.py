"""Reading a study file: YAML, `${VAR}` / `${VAR:-default}` substitution, schema validation with YAML paths."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from .spec import StudyError, StudySpec

_ENV_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-(.*?))?\}")


def fmt_path(loc: tuple | list) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "<root>"


def interpolate(node: Any, path: tuple, env: dict[str, str], problems: list[tuple[str, str]]) -> Any:
    """Replace ${VAR} / ${VAR:-default} in every string; an unset variable is a problem at its YAML path."""
    if isinstance(node, dict):
        return {k: interpolate(v, path + (k,), env, problems) for k, v in node.items()}
    if isinstance(node, list):
        return [interpolate(v, path + (i,), env, problems) for i, v in enumerate(node)]
    if isinstance(node, str) and "${" in node:

        def repl(m: re.Match) -> str:
            var, default = m.group(1), m.group(2)
            if var in env:
                return env[var]
            if default is not None:
                return default
            problems.append(
                (
                    fmt_path(path),
                    f"environment variable ${{{var}}} is not set "
                    f"(export {var}=... or write ${{{var}:-default}})",
                )
            )
            return ""

        return _ENV_RE.sub(repl, node)
    return node


def pydantic_problems(err: ValidationError, prefix: tuple = ()) -> list[tuple[str, str]]:
    out = []
    for e in err.errors():
        loc = prefix + tuple(x for x in e["loc"] if not (isinstance(x, str) and x.startswith("function-")))
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown key"
        elif msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        out.append((fmt_path(loc), msg))
    return out


def parse_study(data: Any, source: str = "<study>", env: dict[str, str] | None = None) -> StudySpec:
    if not isinstance(data, dict):
        raise StudyError(source, [("<root>", f"a study is a mapping, got {type(data).__name__}")])
    problems: list[tuple[str, str]] = []
    data = interpolate(data, (), dict(os.environ) if env is None else env, problems)
    if problems:
        raise StudyError(source, problems)
    try:
        return StudySpec.model_validate(data)
    except ValidationError as e:
        raise StudyError(source, pydantic_problems(e)) from None


def read_yaml(path: str | Path) -> Any:
    """The YAML document of a file; an unreadable file or a syntax error is a StudyError at its place."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise StudyError(str(path), [("<file>", f"cannot read: {e.strerror}")]) from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "<yaml>"
        raise StudyError(str(path), [(where, f"invalid YAML: {getattr(e, 'problem', e)}")]) from None


def load_study(path: str | Path, env: dict[str, str] | None = None) -> StudySpec:
    return parse_study(read_yaml(path), str(path), env)

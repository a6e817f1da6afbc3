"""Reading a study file: YAML, `${VAR}` / `${VAR:-default}` substitution, schema validation with YAML paths."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from mimo_jobs import strictread
from mimo_jobs.study.spec import StudyError, StudySpec, validation_context
from mimo_jobs.submit.executors.registry import written_path

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


def pydantic_problems(err: ValidationError, prefix: tuple = (), data: Any = None) -> list[tuple[str, str]]:
    """Each error as (YAML path, message); with the study's `data`, at the path the study wrote (a SLURM key
    written flat under `cluster:` is reported there, not at `cluster.slurm`)."""
    out = []
    for e in err.errors():
        loc = prefix + tuple(x for x in e["loc"] if not (isinstance(x, str) and x.startswith("function-")))
        if data is not None:
            loc = written_path(loc, data)
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
        return StudySpec.model_validate(data, context=validation_context(source))
    except ValidationError as e:
        raise StudyError(source, pydantic_problems(e, data=data)) from None


# What a study file may hold: at most this many bytes; its nodes and nesting are bounded by the strict reader
# (mimo_jobs/strictread.py), which refuses a key given twice too.
MAX_FILE_BYTES = 1 << 20


def read_yaml(path: str | Path) -> Any:
    """The YAML document of a study file. Anything that is not a small UTF-8 YAML file of plain mappings
    is a StudyError at its place: not a regular file, not UTF-8, a syntax error, a key given twice in one
    mapping, or more nodes / nesting than any study needs once aliases are expanded."""
    path = Path(path)
    text = _read_text(path)
    try:
        return strictread.yaml_text(text)
    except strictread.DocumentError as e:
        raise StudyError(str(path), [(e.where or "<yaml>", str(e))]) from None


def _read_text(path: Path) -> str:
    import stat

    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):  # a FIFO would block the read forever
            what = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
            raise StudyError(str(path), [("<file>", f"not a study file ({what})")])
        if st.st_size > MAX_FILE_BYTES:
            raise StudyError(
                str(path),
                [("<file>", f"{st.st_size:,} bytes: a study file is at most {MAX_FILE_BYTES:,} bytes")],
            )
        data = path.read_bytes()
    except OSError as e:
        raise StudyError(str(path), [("<file>", f"cannot read: {e.strerror}")]) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise StudyError(
            str(path), [(f"line {line}", f"not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start})")]
        ) from None


def load_study(path: str | Path, env: dict[str, str] | None = None) -> StudySpec:
    return parse_study(read_yaml(path), str(path), env)

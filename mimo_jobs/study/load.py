"""Reading a study file: YAML, `${VAR}` / `${VAR:-default}` substitution, schema validation with YAML paths."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

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


# What a study file may hold. A real study is a few KB and a few hundred YAML nodes; anchors and aliases
# repeat their content wherever they are used, so a 3 KB file can stand for billions of nodes (an "alias
# bomb"): the expanded size is counted before anything is built from it.
MAX_FILE_BYTES = 1 << 20
MAX_NODES = 100_000
MAX_DEPTH = 32


def read_yaml(path: str | Path) -> Any:
    """The YAML document of a study file. Anything that is not a small UTF-8 YAML file of plain mappings
    is a StudyError at its place: not a regular file, not UTF-8, a syntax error, a key given twice in one
    mapping, or more nodes / nesting than any study needs once aliases are expanded."""
    path = Path(path)
    text = _read_text(path)
    loader = _StudyLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_size(node, str(path))
        return loader.construct_document(node)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "<yaml>"
        raise StudyError(str(path), [(where, f"invalid YAML: {getattr(e, 'problem', None) or e}")]) from None
    except RecursionError:  # PyYAML composes recursively: thousands of nested brackets exhaust the stack
        raise StudyError(str(path), [("<yaml>", f"nested more than {MAX_DEPTH} levels deep")]) from None
    finally:
        loader.dispose()


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


class _StudyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key that appears twice in one mapping (PyYAML keeps the last)."""

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.setdefault(key, key_node)
            except TypeError:  # an unhashable key: PyYAML's own error says so
                break
            if first is not key_node:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"key {key!r} appears twice in the same mapping (first on line "
                    f"{first.start_mark.line + 1}); keep one",
                    key_node.start_mark,
                )
        return super().construct_mapping(node, deep=deep)


def _check_size(root, source: str) -> None:
    """Refuse a document whose nodes, counted with every alias expanded, exceed MAX_NODES or nest deeper than
    MAX_DEPTH; a node that contains itself (a recursive alias) is refused too. Shared nodes are counted once
    per use but visited once (memoized), so the check itself stays linear in the file."""
    sizes: dict[int, tuple[int, int]] = {}
    active: set[int] = set()

    def visit(node, level: int) -> tuple[int, int]:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if level > MAX_DEPTH:
            raise StudyError(source, [(_line(node), f"nested more than {MAX_DEPTH} levels deep")])
        if key in active:
            raise StudyError(source, [(_line(node), "a recursive alias (a node that contains itself)")])
        children = _children(node)
        active.add(key)
        total, depth = 1, 1
        for child in children:
            n, d = visit(child, level + 1)
            total, depth = total + n, max(depth, d + 1)
            if total > MAX_NODES or depth > MAX_DEPTH:
                break
        active.discard(key)
        if total > MAX_NODES:
            raise StudyError(
                source,
                [
                    (
                        _line(node),
                        f"the document expands to more than {MAX_NODES:,} YAML nodes (anchors and aliases "
                        "repeat their content wherever they are used); a study needs far fewer",
                    )
                ],
            )
        if depth > MAX_DEPTH:
            raise StudyError(source, [(_line(node), f"nested more than {MAX_DEPTH} levels deep")])
        sizes[key] = (total, depth)
        return sizes[key]

    visit(root, 1)


def _children(node) -> list:
    if isinstance(node, yaml.MappingNode):
        return [x for pair in node.value for x in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _line(node) -> str:
    return f"line {node.start_mark.line + 1}"


def load_study(path: str | Path, env: dict[str, str] | None = None) -> StudySpec:
    return parse_study(read_yaml(path), str(path), env)

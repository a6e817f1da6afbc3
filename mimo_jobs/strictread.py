"""YAML and JSON that someone hands over, read as plain data and strictly: a study file, a `--model`
argument, a HuggingFace config.json or safetensors index, a safetensors header.

What the standard readers let through, refused here as a DocumentError naming the place and the rule:
- a key given twice in one mapping (PyYAML and `json` keep the last one silently);
- nesting deeper than MAX_DEPTH (both readers recurse: thousands of nested brackets end in a RecursionError
  traceback, and the code that walks the value afterwards would recurse as deep);
- a YAML document whose nodes, with every anchor and alias expanded, exceed MAX_NODES (an "alias bomb": 3 KB
  standing for billions of nodes), or a node that contains itself;
- YAML beyond the safe loader's plain data (no Python objects), JSON numbers Python will not convert.
Callers name the file (or the argument) and wrap the error in their own. Standard library and PyYAML only.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any

from mimo_jobs.errors import MimoJobsError

# What any document read here may hold. A real study is a few hundred YAML nodes nested a few levels; a
# HuggingFace config.json nests 3 or 4 levels, a safetensors header 3; anchors and aliases repeat their
# content wherever they are used, so the expanded size is counted before anything is built from it.
MAX_NODES = 100_000
MAX_DEPTH = 32


class DocumentError(MimoJobsError, ValueError):
    """A document refused: `where` is its place ("line 3, column 5"; None when the reader gives none),
    the message the rule it breaks."""


def yaml_text(text: str) -> Any:
    """The YAML document of `text` (None when it holds none), read with PyYAML's safe loader, refusing a key
    given twice in one mapping, and more nodes (aliases expanded) or nesting than MAX_NODES / MAX_DEPTH."""
    import yaml

    loader = _loader_class()(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_size(node)
        return loader.construct_document(node)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "<yaml>"
        raise DocumentError(f"invalid YAML: {getattr(e, 'problem', None) or e}", where) from None
    except RecursionError:  # PyYAML composes recursively: thousands of nested brackets exhaust the stack
        raise DocumentError(_too_deep()) from None
    finally:
        loader.dispose()


def json_text(text: str | bytes) -> Any:
    """The JSON value of `text` (bytes: UTF-8), refusing a key given twice in one object and nesting deeper
    than MAX_DEPTH."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as e:
            raise DocumentError(f"not UTF-8 text (byte 0x{text[e.start]:02x} at offset {e.start})") from None
    if not _json_within_depth(text):
        raise DocumentError(_too_deep())
    try:
        value = json.loads(text, object_pairs_hook=_object)
    except json.JSONDecodeError as e:
        raise DocumentError(f"invalid JSON: {e.msg}", f"line {e.lineno}, column {e.colno}") from None
    except RecursionError:  # the decoder recurses once per level (held off by the check above)
        raise DocumentError(_too_deep()) from None
    except DocumentError:  # a key given twice (_object)
        raise
    except ValueError as e:  # a number of more digits than Python converts
        raise DocumentError(f"invalid JSON: {e}") from None
    return value


def _too_deep() -> str:
    return f"nested more than {MAX_DEPTH} levels deep"


def _object(pairs: list[tuple[str, Any]]) -> dict:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for k, _ in pairs:
            if k in seen:
                raise DocumentError(f"key {k!r} appears twice in the same object; keep one")
            seen.add(k)
    return out


_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_INNERMOST = re.compile(r"\[\]|\{\}")


def _json_within_depth(text: str) -> bool:
    """Whether no array or object of a JSON text lies more than MAX_DEPTH levels deep, from its brackets
    alone (strings taken out), before the decoder recurses into it: each pass takes out the innermost pairs,
    one level. Unbalanced brackets pass: the decoder names that syntax error."""
    s = _NOT_BRACKET.sub("", _JSON_STRING.sub("", text))
    for _ in range(MAX_DEPTH):
        t = _INNERMOST.sub("", s)
        if not t or len(t) == len(s):
            return True
        s = t
    return False


@functools.cache
def _loader_class():
    """The loader's class, built on first use (PyYAML is imported only when YAML is read)."""
    import yaml

    class StrictLoader(yaml.SafeLoader):
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

    return StrictLoader


def _check_size(root) -> None:
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
            raise DocumentError(_too_deep(), _line(node))
        if key in active:
            raise DocumentError("a recursive alias (a node that contains itself)", _line(node))
        active.add(key)
        total, depth = 1, 1
        for child in _children(node):
            n, d = visit(child, level + 1)
            total, depth = total + n, max(depth, d + 1)
            if total > MAX_NODES or depth > MAX_DEPTH:
                break
        active.discard(key)
        if total > MAX_NODES:
            raise DocumentError(
                f"the document expands to more than {MAX_NODES:,} YAML nodes (anchors and aliases repeat "
                "their content wherever they are used); a study or a model description needs far fewer",
                _line(node),
            )
        if depth > MAX_DEPTH:
            raise DocumentError(_too_deep(), _line(node))
        sizes[key] = (total, depth)
        return sizes[key]

    visit(root, 1)


def _children(node) -> list:
    import yaml

    if isinstance(node, yaml.MappingNode):
        return [x for pair in node.value for x in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _line(node) -> str:
    return f"line {node.start_mark.line + 1}"

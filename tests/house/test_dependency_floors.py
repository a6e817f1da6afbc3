"""Dependencies whose older releases are unsafe for what mimo-jobs hands them are pinned above those
releases: Jinja2 renders templates that come from study files and template directories other people write,
and its sandbox is escapable before 3.1.6 (CVE-2024-56326: format-method escape, fixed in 3.1.5;
CVE-2025-27516: |attr filter escape, fixed in 3.1.6 — the Jinja2 changelog)."""

from __future__ import annotations

from importlib.metadata import version

import pytest
import tomllib
from packaging.requirements import Requirement

from helpers import REPO

UNSAFE = {"jinja2": ["3.1.0", "3.1.4", "3.1.5"]}


def _requirements() -> dict[str, Requirement]:
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    return {(r := Requirement(d)).name.lower(): r for d in deps}


@pytest.mark.parametrize("name", list(UNSAFE))
def test_unsafe_releases_are_excluded_and_the_installed_one_is_allowed(name):
    req = _requirements()[name]
    assert not [v for v in UNSAFE[name] if req.specifier.contains(v)], f"{req} admits an unsafe release"
    assert req.specifier.contains(version(name)), f"installed {name} {version(name)} is outside {req}"

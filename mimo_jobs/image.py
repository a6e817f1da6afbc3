"""The container image's two jobs for the package: which requirements to install, and the image's provenance.

Used by the Dockerfile at build time (`python3 -m mimo_jobs.image requirements|provenance`) and by the
toolkit/trainer at run time (`image_provenance()`). Standard library only: it runs in the image before any
dependency is installed, and on login nodes where only the light CLI dependencies exist.

One list of dependencies: pyproject.toml. The build installs the package wheel with --no-deps, then asks the
installed metadata for its base + `train` requirements, so nothing here repeats a version. The one twist:
`train` pins torch to the CPU wheel CI uses, while an NGC base image already carries its own CUDA build of
torch (plus Transformer Engine compiled against it). Requirements named in `keep` that are already installed
are replaced by `name==<installed version>`, so pip keeps the base image's build instead of replacing it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
from importlib import metadata
from pathlib import Path

DIST = "mimo-jobs"
# Where the Dockerfile writes the image's provenance; MIMO_JOBS_PROVENANCE overrides (tests, other images).
PROVENANCE_PATH = Path("/opt/mimo-jobs/PROVENANCE.json")
# Distributions whose versions are worth recording with a run (read from metadata; nothing is imported).
RECORDED = (
    "mimo-jobs",
    "torch",
    "megatron-core",
    "megatron-energon",
    "transformer-engine",
    "einops",
    "numpy",
)

_NAME_RE = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
_EXTRA_RE = re.compile(r"""^\s*extra\s*==\s*["']([^"']+)["']\s*$""")


def canonical(name: str) -> str:
    """PEP 503 normalized name (Transformer_Engine == transformer-engine)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def select_requirements(
    requires: list[str], extras: list[str], installed: dict[str, str], keep: list[str]
) -> list[str]:
    """Requirement lines for the base dependencies plus `extras`, from Requires-Dist strings.

    `installed` maps canonical names to versions already present; a requirement on a name in `keep` that is
    installed becomes `name==<that version>` (the base image's build is kept). Markers other than a plain
    `extra == "x"` are kept for pip to evaluate; `extra` combined with other markers is refused rather than
    guessed at (pyproject does not use it)."""
    wanted = {canonical(e) for e in extras}
    keep_c = {canonical(k) for k in keep}
    out: list[str] = []
    for req in requires:
        spec, _, marker = req.partition(";")
        marker = marker.strip()
        if "extra" in marker:
            m = _EXTRA_RE.match(marker)
            if not m:
                raise ValueError(
                    f"requirement {req!r}: an extra combined with other markers is not supported"
                )
            if canonical(m.group(1)) not in wanted:
                continue
            marker = ""
        m = _NAME_RE.match(spec)
        if not m:
            raise ValueError(f"requirement {req!r}: no distribution name")
        name = canonical(m.group(1))
        if name in keep_c and name in installed:
            spec = f"{m.group(1)}=={installed[name]}"
        line = spec.strip() + (f"; {marker}" if marker else "")
        if line not in out:
            out.append(line)
    return out


def installed_versions(names: list[str]) -> dict[str, str]:
    out = {}
    for n in names:
        try:
            out[canonical(n)] = metadata.version(n)
        except metadata.PackageNotFoundError:
            pass
    return out


def build_provenance(git_sha: str | None, base_image: str | None, image: str | None = None) -> dict:
    """The record the Dockerfile writes to PROVENANCE.json: package + stack versions, git commit, base."""
    return {
        "package": DIST,
        "version": _version_or_none(DIST),
        "git_sha": git_sha or None,
        "image": image or None,
        "base_image": base_image or None,
        "python": platform.python_version(),
        "versions": installed_versions(list(RECORDED)),
    }


def _version_or_none(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def image_provenance(env: dict[str, str] | None = None) -> dict | None:
    """The image's own provenance when running inside the mimo-jobs image, else None.

    Reads $MIMO_JOBS_PROVENANCE or /opt/mimo-jobs/PROVENANCE.json. Callers that derive provenance from a git
    checkout (there is none in the image) should fall back to this: its "version" and "git_sha" keys match
    what catalog.record_run reads."""
    env = os.environ if env is None else env
    path = Path(env.get("MIMO_JOBS_PROVENANCE") or PROVENANCE_PATH)
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise RuntimeError(f"image provenance {path} is unreadable: {e}") from None
    if not isinstance(doc, dict):
        raise TypeError(f"image provenance {path}: expected a JSON object, got {type(doc).__name__}")
    return doc


def image_sha(env: dict[str, str] | None = None) -> tuple[str | None, bool | None]:
    """(git sha, dirty) the image was built from, for provenance() callers that found no git checkout;
    (None, None) outside the image or when the build was not given a commit. Never raises: a damaged
    provenance file must not stop a render."""
    try:
        doc = image_provenance(env) or {}
    except (RuntimeError, TypeError):
        return None, None
    sha = doc.get("git_sha")
    if not isinstance(sha, str) or sha in ("", "unknown"):
        return None, None
    return sha.removesuffix("-dirty"), sha.endswith("-dirty")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mimo_jobs.image", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("requirements", help="print the installed package's requirements for the given extras")
    r.add_argument("--extra", action="append", default=[], help="extra to include (repeatable), e.g. train")
    r.add_argument(
        "--keep-installed",
        action="append",
        default=[],
        metavar="DIST",
        help="if DIST is already installed, require exactly that version (repeatable), e.g. torch",
    )
    p = sub.add_parser("provenance", help="write the image's provenance JSON")
    p.add_argument("--git-sha", default=None)
    p.add_argument("--base-image", default=None)
    p.add_argument("--image", default=None)
    p.add_argument("--out", type=Path, default=PROVENANCE_PATH)
    a = ap.parse_args(argv)
    if a.cmd == "requirements":
        try:
            requires = metadata.requires(DIST) or []
        except metadata.PackageNotFoundError:
            print(f"{DIST} is not installed: install its wheel with --no-deps first", file=sys.stderr)
            return 2
        # Only names we were asked to keep are looked up: every other requirement goes to pip as written.
        lines = select_requirements(requires, a.extra, installed_versions(a.keep_installed), a.keep_installed)
        print("\n".join(lines))
        return 0
    doc = build_provenance(a.git_sha, a.base_image, a.image)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = a.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    tmp.replace(a.out)
    print(json.dumps(doc, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())

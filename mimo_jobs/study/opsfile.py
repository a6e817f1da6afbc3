"""Read a measured operator table (`cluster.hardware.ops`) as data: at most MAX_BYTES of UTF-8, strict YAML
(mimo_jobs.strictread: no tags, no key twice, bounded nodes), every field checked by contract/opstable.py."""

from __future__ import annotations

from pathlib import Path

from mimo_jobs import strictread
from mimo_jobs.contract.opstable import OpsFileError, OpsTable, parse_ops

MAX_BYTES = 1 << 20  # a table of thousands of shapes is a few hundred KB


def read_ops(path: str | Path) -> OpsTable:
    """The table in `path`; OpsFileError naming the file, the entry, the field and what would fit."""
    p = Path(path)
    try:
        if p.stat().st_size > MAX_BYTES:
            raise OpsFileError(
                f"{p}: {p.stat().st_size} bytes, over the {MAX_BYTES}-byte limit of an ops table"
            )
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise OpsFileError(
            f"{p}: no such ops table (write one with `python3 benchmarks/gpu/ops.py --out {p}`)"
        ) from None
    except IsADirectoryError:
        raise OpsFileError(f"{p}: a directory, not an ops table file") from None
    except OSError as e:
        raise OpsFileError(f"{p}: cannot read it ({e.strerror})") from None
    except UnicodeDecodeError:
        raise OpsFileError(f"{p}: not UTF-8 text (an ops table is YAML)") from None
    try:
        doc = strictread.yaml_text(text)
    except strictread.DocumentError as e:
        where = f" at {e.args[1]}" if len(e.args) > 1 and e.args[1] else ""
        raise OpsFileError(f"{p}: {e.args[0]}{where}") from None
    return parse_ops(doc, str(p))

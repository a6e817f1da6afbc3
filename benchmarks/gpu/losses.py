"""Losses per iteration of several runs side by side, from their metrics.jsonl files (the smoke run's
checkpoint checks: a continuation's losses against its source's).

Usage: python3 benchmarks/gpu/losses.py RUN_DIR [RUN_DIR ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def losses(run_dir: str) -> dict[int, float]:
    out = {}
    for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec.get("kind") == "iteration":
            out[rec["iteration"]] = rec["loss"]
    return out


def main(dirs: list[str]) -> None:
    table = {d: losses(d) for d in dirs}
    base = table[dirs[0]]
    print("iteration  " + "  ".join(Path(d).name[:28].ljust(28) for d in dirs))
    for it in sorted(set().union(*table.values())):
        cells = []
        for d in dirs:
            v = table[d].get(it)
            rel = (
                ""
                if v is None or it not in base or d == dirs[0]
                else f" ({abs(v - base[it]) / abs(base[it]):.1e})"
            )
            cells.append(("-" if v is None else f"{v:.6f}{rel}").ljust(28))
        print(f"{it:9d}  " + "  ".join(cells))


if __name__ == "__main__":
    main(sys.argv[1:])

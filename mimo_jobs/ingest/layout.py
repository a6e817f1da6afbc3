"""What `ingest --layout/--model` tells about logs produced elsewhere: the parallel layout (written as the
report writes it, "enc tp1 dp8 | llm tp2 ep8 dp128", or taken from a run of a study file) and the model, so
their runs get MFU, memory predictions and pairing like rendered runs. Pure: parsing and checking only."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from .discover import IngestError

_SIDES = {"enc": "enc", "encoder": "enc", "llm": "llm"}
_AXES = {"enc": ("tp", "pp", "dp"), "llm": ("tp", "pp", "ep", "etp", "cp", "dp")}
_TOKEN_RE = re.compile(r"^([a-z]+?)(\d+)$")
MAX_AXIS = 10_000_000


@dataclass(frozen=True)
class Told:
    """The runs-row fields the user told (layout columns, nodes, GPUs per node, gbs, model) and, when the
    model is known, the run's whole spec (what run.yaml would hold) for the report's model arithmetic."""

    fields: dict[str, Any] = field(default_factory=dict)
    spec: dict | None = None


def parse_layout(text: str) -> dict[str, Any]:
    """ "enc tp1 dp8 | llm tp2 ep8 dp128" -> layout columns. Without an `enc` part the run is colocated
    (every rank runs the whole model: a GPT, or the colocated baseline). `gbs768`/`mbs2` may follow either
    part. Raises IngestError naming the bad word."""
    out: dict[str, Any] = {}
    seen: set[str] = set()
    for part in (p.strip() for p in text.split("|")):
        words = part.split()
        if not words or words[0].lower() not in _SIDES:
            raise IngestError(f"--layout {text!r}: each part starts with 'enc' or 'llm' (got {part!r})")
        side = _SIDES[words[0].lower()]
        if side in seen:
            raise IngestError(f"--layout {text!r}: {side} is given twice")
        seen.add(side)
        for w in words[1:]:
            m = _TOKEN_RE.match(w.lower())
            axis = m.group(1) if m else None
            if m and axis in ("gbs", "g", "mbs"):
                out["mbs" if axis == "mbs" else "gbs"] = _size(text, w, int(m.group(2)))
            elif m and axis in _AXES[side]:
                out[f"{side}_{axis}"] = _size(text, w, int(m.group(2)))
            else:
                raise IngestError(
                    f"--layout {text!r}: {w!r} is not a size of {side} "
                    f"({', '.join(a + 'N' for a in _AXES[side])}, gbsN, mbsN)"
                )
    if "llm" not in seen:
        raise IngestError(f"--layout {text!r}: the 'llm' part is missing (e.g. 'llm tp2 dp8')")
    llm = {a: out.pop(f"llm_{a}", 1) for a in _AXES["llm"]}
    colocated = "enc" not in seen
    enc = (
        {"tp": llm["tp"], "pp": 1, "dp": llm["dp"]}
        if colocated
        else {a: out.pop(f"enc_{a}", 1) for a in _AXES["enc"]}
    )
    world = llm["tp"] * llm["pp"] * llm["cp"] * llm["dp"] + (
        0 if colocated else enc["tp"] * enc["pp"] * enc["dp"]
    )
    if llm["ep"] * llm["etp"] > llm["tp"] * llm["cp"] * llm["dp"] or (llm["tp"] * llm["cp"] * llm["dp"]) % (
        llm["ep"] * llm["etp"]
    ):
        raise IngestError(
            f"--layout {text!r}: llm ep*etp={llm['ep'] * llm['etp']} must divide tp*cp*dp="
            f"{llm['tp'] * llm['cp'] * llm['dp']} (the expert grid tiles the LLM's ranks)"
        )
    return {
        **{f"enc_{a}": v for a, v in enc.items()},
        **{f"llm_{a}": v for a, v in llm.items()},
        "colocated": colocated,
        "world": world,
        **out,
    }


def _size(text: str, word: str, n: int) -> int:
    if not 1 <= n <= MAX_AXIS:
        raise IngestError(f"--layout {text!r}: {word!r} is out of range (1 to {MAX_AXIS:,})")
    return n


def place(lay: dict[str, Any], nodes: int | None, gpus_per_node: int | None) -> dict[str, Any]:
    """Nodes and GPUs per node for a layout: what is given, the rest derived from its world size; refused
    when they do not multiply to it."""
    world = lay["world"]
    if nodes and gpus_per_node:
        if nodes * gpus_per_node != world:
            raise IngestError(
                f"--layout has {world} ranks but --nodes {nodes} x --gpus-per-node {gpus_per_node} = "
                f"{nodes * gpus_per_node}"
            )
    elif nodes:
        if world % nodes:
            raise IngestError(f"--layout has {world} ranks, which {nodes} node(s) cannot share evenly")
        gpus_per_node = world // nodes
    else:
        gpus_per_node = gpus_per_node or min(world, 8)
        if world % gpus_per_node:
            raise IngestError(
                f"--layout has {world} ranks, not a multiple of {gpus_per_node} GPUs per node; "
                "give --nodes or --gpus-per-node"
            )
        nodes = world // gpus_per_node
    return {**lay, "nodes": nodes, "gpus_per_node": gpus_per_node}

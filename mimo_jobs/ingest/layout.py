"""What `ingest --layout/--model` tells about logs produced elsewhere: the parallel layout (written as the
report writes it, "enc tp1 dp8 | llm tp2 ep8 dp128" or, with several encoders, each by its module name,
"vision tp1 dp4 | audio tp2 dp2 | llm tp2 dp12"; or taken from a run of a study file) and the model, so
their runs get MFU, memory predictions and pairing like rendered runs. Pure: parsing and checking only."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from mimo_jobs.study.topology import VISION, module_name_problem

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
    """ "enc tp1 dp8 | llm tp2 ep8 dp128" -> layout columns; "vision tp1 dp4 | audio tp2 dp2 | llm tp2 dp12"
    names each encoder module (`enc` is the module vision), in rank order: `encoders` lists them. Without an
    encoder part the run is colocated (every rank runs the whole model: a GPT, or the colocated baseline).
    `gbs768`/`mbs2` may follow any part. Raises IngestError naming the bad word."""
    out: dict[str, Any] = {}
    seen: set[str] = set()
    mods: dict[str, dict[str, int]] = {}
    for part in (p.strip() for p in text.split("|")):
        words = part.split()
        first = words[0].lower() if words else ""
        side = _SIDES.get(first) or ("enc" if words and module_name_problem(words[0]) is None else None)
        if side is None:
            raise IngestError(
                f"--layout {text!r}: each part starts with 'enc', an encoder module's name (letters, digits "
                f"and _, e.g. vision, audio) or 'llm' (got {part!r})"
            )
        name = "llm" if side == "llm" else (VISION if first in _SIDES else words[0])
        if name in seen:
            raise IngestError(f"--layout {text!r}: {name} is given twice")
        seen.add(name)
        sizes = mods.setdefault(name, {}) if side == "enc" else None
        for w in words[1:]:
            m = _TOKEN_RE.match(w.lower())
            axis = m.group(1) if m else None
            if m and axis in ("gbs", "g", "mbs"):
                out["mbs" if axis == "mbs" else "gbs"] = _size(text, w, int(m.group(2)))
            elif m and axis in _AXES[side]:
                if sizes is None:
                    out[f"llm_{axis}"] = _size(text, w, int(m.group(2)))
                else:
                    sizes[axis] = _size(text, w, int(m.group(2)))
            else:
                raise IngestError(
                    f"--layout {text!r}: {w!r} is not a size of {name} "
                    f"({', '.join(a + 'N' for a in _AXES[side])}, gbsN, mbsN)"
                )
    if "llm" not in seen:
        raise IngestError(f"--layout {text!r}: the 'llm' part is missing (e.g. 'llm tp2 dp8')")
    llm = {a: out.pop(f"llm_{a}", 1) for a in _AXES["llm"]}
    colocated = not mods
    encoders = [{"name": n, **{a: v.get(a, 1) for a in _AXES["enc"]}} for n, v in mods.items()]
    if colocated:
        encoders = [{"name": VISION, "tp": llm["tp"], "pp": 1, "dp": llm["dp"]}]
    world = llm["tp"] * llm["pp"] * llm["cp"] * llm["dp"] + (
        0 if colocated else sum(e["tp"] * e["pp"] * e["dp"] for e in encoders)
    )
    if llm["ep"] * llm["etp"] > llm["tp"] * llm["cp"] * llm["dp"] or (llm["tp"] * llm["cp"] * llm["dp"]) % (
        llm["ep"] * llm["etp"]
    ):
        raise IngestError(
            f"--layout {text!r}: llm ep*etp={llm['ep'] * llm['etp']} must divide tp*cp*dp="
            f"{llm['tp'] * llm['cp'] * llm['dp']} (the expert grid tiles the LLM's ranks)"
        )
    one = encoders[0] if len(encoders) == 1 and encoders[0]["name"] == VISION else None
    return {
        # the one encoder in the runs columns (None for several); every module in `encoders`
        **{f"enc_{a}": one and one[a] for a in _AXES["enc"]},
        **{f"llm_{a}": v for a, v in llm.items()},
        "colocated": colocated,
        "world": world,
        "encoders": encoders,
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

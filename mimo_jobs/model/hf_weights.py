"""HuggingFace safetensors tensors <-> the trainer's megatron-core parameters: the engine the families'
name tables build their mappings with (pure: no torch, no I/O; trainer/weights/hf_load.py reads with it,
hf_export.py writes with it). Which tensor is which is each family's (model/families/).

Every trainer parameter is a `Target`: its canonical name (the name `models.param_shards` gives it: global
layer index, global expert index), its full shape, and the HF tensors it is made of as `Piece`s stacked
along its first dimension.

`split`, `parts` and `expert` restate how megatron-core shards each parameter over tensor/expert
parallelism (the `tensor_model_parallel`, `partition_dim` and `partition_stride` attributes it sets);
the loader takes them from the built module, export from here, and the tests check the two agree. How a
split is cut is model/cuts.py's one rule.
"""

from __future__ import annotations

from dataclasses import dataclass

from mimo_jobs.model.cuts import strided_blocks

# TE's fused layer norm + linear (GPU runs) holds the norm inside the next linear: the same tensor
TE_ALIASES = (
    ("self_attention.linear_qkv.layer_norm_", "input_layernorm."),
    ("mlp.linear_fc1.layer_norm_", "pre_mlp_layernorm."),
)


@dataclass(frozen=True)
class Piece:
    """Rows of a target that come from one HF tensor (rows [start, start + rows) of its first dimension),
    or zeros (hf None: the vocabulary padding). `whole`: the HF tensor is read whole and viewed as rows of
    the target's width before rows [start, start + rows) are taken (CLIP's class embedding [h] is the class
    token [1, h]; InternViT's position table [1, n, h] is n rows)."""

    hf: str | None
    rows: int
    start: int = 0
    whole: bool = False


@dataclass(frozen=True)
class Target:
    """One trainer parameter in full: `pieces` stack along the first dimension of `view` (the parameter's
    shape unless given: the ViT position table [1, n, h] stacks as [n, h])."""

    name: str
    shape: tuple[int, ...]
    pieces: tuple[Piece, ...]
    split: int | None = None  # the dimension tensor parallelism splits (None: whole on every rank)
    parts: int = (
        1  # megatron's partition_stride: `parts` equal blocks along `split`, a rank holds a slice of each
    )
    expert: bool = False  # split over expert tensor parallelism, one expert per parameter
    view: tuple[int, ...] | None = None

    @property
    def rows_shape(self) -> tuple[int, ...]:
        return self.view or self.shape


@dataclass(frozen=True)
class HFLayout:
    """A module's targets by canonical name, and the HF tensors they read with their shapes."""

    targets: dict[str, Target]
    hf_shapes: dict[str, tuple[int, ...]]
    family: str


def canonical_alias(cname: str) -> str:
    """The canonical name of a parameter under the local-layer naming (TE's fused norm -> the norm)."""
    for te, local in TE_ALIASES:
        if te in cname:
            return cname.replace(te, local)
    return cname


class Builder:
    """A family's layout as it is built: `tensor` records an HF tensor's name and shape, `add` a target made
    of pieces, `same` a target that is one HF tensor as it is."""

    def __init__(self, family: str):
        self.targets: dict[str, Target] = {}
        self.hf: dict[str, tuple[int, ...]] = {}
        self.family = family

    def tensor(self, name: str, shape: tuple[int, ...]) -> str:
        self.hf[name] = tuple(shape)
        return name

    def add(self, name: str, shape, pieces, split=None, parts=1, expert=False, view=None) -> None:
        t = Target(name, tuple(shape), tuple(pieces), split, parts, expert, tuple(view) if view else None)
        assert sum(p.rows for p in t.pieces) == t.rows_shape[0], name
        self.targets[name] = t

    def same(self, name: str, hf: str, shape, split=None, expert=False) -> None:
        """A parameter that is one HF tensor as it is."""
        self.add(name, shape, [Piece(self.tensor(hf, shape), shape[0])], split, 1, expert)

    def layout(self) -> HFLayout:
        return HFLayout(self.targets, self.hf, self.family)


def projector_layout(e, llm_hidden: int, module: str = "") -> HFLayout:
    """The MLP projector (encoder -> LLM width) of an encoder of any modality (its `out_width`), which no HF
    model has: exported under its own megatron-core names so a later run can keep it, after `module.` (the
    trainer's name of the encoder module it belongs to), so two modules' projectors never share a name."""
    b = Builder("projector")
    n = "projector.encoder."
    h = f"{module}.{n}" if module else n
    b.same(n + "linear_fc1.weight", h + "linear_fc1.weight", (llm_hidden, e.out_width), split=0)
    b.same(n + "linear_fc1.bias", h + "linear_fc1.bias", (llm_hidden,), split=0)
    b.same(n + "linear_fc2.weight", h + "linear_fc2.weight", (llm_hidden, llm_hidden), split=1)
    b.same(n + "linear_fc2.bias", h + "linear_fc2.bias", (llm_hidden,))
    return b.layout()


# ------------------------------------------------------------------------------------ rows of a shard


def shard_rows(t: Target, dim: int | None, rank: int, size: int, parts: int):
    """(row ranges of the rows view, column range or None) that TP rank `rank` of `size` holds."""
    rows = t.rows_shape[0]
    if dim is None or size == 1:
        return [(0, rows)], None
    if dim == 0:
        return [(s, s + n) for s, n in strided_blocks(rows, parts, rank, size)], None
    if dim == 1 and parts == 1:
        ((s, n),) = strided_blocks(t.rows_shape[1], 1, rank, size)
        return [(0, rows)], (s, s + n)
    raise ValueError(f"{t.name}: a split along dimension {dim} is not laid out here")


def piece_reads(t: Target, lo: int, hi: int):
    """The reads that give rows [lo, hi) of the target: (piece, first row in the piece, last row + 1)."""
    out, at = [], 0
    for pc in t.pieces:
        a, b = max(lo, at), min(hi, at + pc.rows)
        if a < b:
            out.append((pc, a - at, b - at))
        at += pc.rows
    return out

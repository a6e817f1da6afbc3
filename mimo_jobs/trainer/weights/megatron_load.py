"""trainer.init.llm: {megatron: DIR}: the LLM's weights from a Megatron-LM distributed (torch_dist) checkpoint,
read by megatron-core's own `dist_checkpointing.load` with the LLM's `sharded_state_dict()`.

The keys are megatron-core's (the local layer spec maps its norms to Transformer Engine's names), so a
checkpoint Megatron-LM or Megatron-Bridge wrote for the same architecture loads at any TP/PP/EP layout: each
rank reads only the slices its own sharded_state_dict asks for.

`check_source` runs on every rank in the trainer's preflight (no collective): DIR is an iter_N directory or
its parent holding `latest_checkpointed_iteration.txt` (Megatron-LM's layout), its `metadata.json` names the
torch_dist backend and its tensor index (`.metadata`) is readable. `load_llm` then compares every tensor key
and global shape the whole LLM needs with the checkpoint's index (gathered over the LLM's ranks only, so each
of them refuses the same first mismatch) and loads. Weights only: the checkpoint's iteration, optimizer and
RNG state are not read.
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from mimo_jobs.errors import MimoJobsError
from mimo_jobs.trainer.checkpoint.as_data import NotData, dcp_index_as_data

WHERE = "trainer.init.llm.megatron"
LATEST = "latest_checkpointed_iteration.txt"  # Megatron-LM's tracker file next to its iter_N directories
CONFIG = "metadata.json"  # dist_checkpointing's backend record in every checkpoint directory
INDEX = ".metadata"  # torch.distributed.checkpoint's tensor index
# Megatron-LM writes one key per layer (decoder.layers.<i>.) or, in its older default, layers stacked on a
# leading axis (decoder.layers.<name>); the model must ask in the same form.
_PER_LAYER = re.compile(r"^decoder\.layers\.\d+\.")
# The model's own key families: a checkpoint key under one of them that the model lacks is another model
_MODEL_ROOTS = ("embedding.", "decoder.", "output_layer.", "mtp.")


class MegatronInitError(MimoJobsError, ValueError):
    """A Megatron-LM checkpoint named by trainer.init.llm that cannot be loaded into this run's LLM."""

    # whether this rank prints it: every LLM rank raises the same line, the LLM's first rank says it
    report = True


@dataclass(frozen=True)
class Source:
    """A checked torch_dist checkpoint: its iter_N directory and each tensor's global shape."""

    path: Path
    shapes: dict[str, tuple[int, ...]]

    @property
    def per_layer(self) -> bool:
        return any(_PER_LAYER.match(k) for k in self.shapes)


def iteration_dir(path: str | Path) -> Path:
    """The iter_N directory DIR names: itself, or the one its latest_checkpointed_iteration.txt names."""
    d = Path(path)
    if not d.is_dir():
        raise MegatronInitError(f"{d}: no such directory", WHERE)
    latest = d / LATEST
    if not (d / CONFIG).is_file() and latest.is_file():
        text = latest.read_text().strip()
        if text == "release":
            return d / "release"
        try:
            return d / f"iter_{int(text):07d}"
        except ValueError:
            raise MegatronInitError(
                f"{latest}: {text!r} is not an iteration number (Megatron-LM writes e.g. 10 or release)",
                WHERE,
            ) from None
    return d


def check_source(path: str | Path) -> Source:
    """The checkpoint's directory, backend and tensor index, read from files alone (MegatronInitError
    naming the file otherwise)."""
    from megatron.core.dist_checkpointing import load_tensors_metadata
    from megatron.core.dist_checkpointing.core import maybe_load_config

    d = iteration_dir(path)
    if not d.is_dir():
        raise MegatronInitError(f"{d}: no such directory (named by {Path(path) / LATEST})", WHERE)
    problem = _config_problem(d)
    if problem:
        raise MegatronInitError(f"{d / CONFIG}: not the metadata.json Megatron writes ({problem})", WHERE)
    cfg = maybe_load_config(str(d))
    backend = None if cfg is None else cfg.sharded_backend
    if cfg is None:
        raise MegatronInitError(
            f"{d}: not a Megatron distributed checkpoint (no {CONFIG}, and no {LATEST} naming an iter_N "
            "directory)",
            WHERE,
        )
    if backend != "torch_dist":
        raise MegatronInitError(
            f"{d / CONFIG}: sharded_backend is {backend!r}; only 'torch_dist' checkpoints load "
            "(Megatron-LM's --ckpt-format torch_dist, its default)",
            WHERE,
        )
    if not (d / INDEX).is_file():
        raise MegatronInitError(f"{d}: no {INDEX} (the tensor index of a torch_dist checkpoint)", WHERE)
    try:
        with dcp_index_as_data():
            meta = load_tensors_metadata(str(d))
    except NotData as e:
        raise MegatronInitError(str(e), WHERE) from None
    except Exception as e:  # noqa: BLE001 - any unreadable index is the same bad input
        raise MegatronInitError(f"{d / INDEX}: unreadable ({type(e).__name__}: {e})", WHERE) from None
    return Source(d, {k: tuple(v.global_shape) for k, v in meta.items()})


def _config_problem(d: Path) -> str | None:
    """What is wrong with the directory's metadata.json as data (None: absent, or the shape Megatron writes:
    an object whose sharded_backend is a name and whose versions are integers)."""
    import json

    if not (d / CONFIG).is_file():
        return None
    try:
        raw = json.loads((d / CONFIG).read_text())
    except (OSError, ValueError) as e:
        return f"{type(e).__name__}: {e}".splitlines()[0]
    if not isinstance(raw, dict):
        return f"a JSON {type(raw).__name__}, not an object"
    if not isinstance(raw.get("sharded_backend"), str):
        return f"sharded_backend is {raw.get('sharded_backend')!r}, not a name"
    for k in ("sharded_backend_version", "common_backend_version"):
        if k in raw and (isinstance(raw[k], bool) or not isinstance(raw[k], int)):
            return f"{k} is {raw[k]!r}, not an integer"
    return None


# ---------------------------------------------------------------------------------------------- check


def sharded_metadata(src: Source, pgc) -> dict:
    """The `metadata` argument of sharded_state_dict that asks for keys in the checkpoint's own form. The
    dp_cp group decides which replica is the main one; megatron-core reads it off parallel_state, which the
    trainer (two independent grids) never sets up, unless it is given here."""
    return {"non_homogeneous_layers": src.per_layer, "dp_cp_group": pgc.dp_cp}


def _weights(sd: dict) -> dict:
    """The sharded state dict without its ShardedObjects (the linear layers' `_extra_state`): weights
    only, so a checkpoint of another backend (or without them) loads the same."""
    from megatron.core.dist_checkpointing.mapping import ShardedObject

    return {k: v for k, v in sd.items() if not isinstance(v, ShardedObject)}


def wanted(gpt, src: Source, pgc) -> dict[str, tuple[tuple[int, ...], bool]]:
    """Every checkpoint key this rank's LLM stage reads: (global shape, whether the rows may differ, as
    megatron-core allows for the padded vocabulary)."""
    from megatron.core.dist_checkpointing.dict_utils import nested_values
    from megatron.core.dist_checkpointing.mapping import ShardedTensor, apply_factories

    sd = _weights(gpt.sharded_state_dict(metadata=sharded_metadata(src, pgc)))
    apply_factories(sd)
    out = {}
    for t in nested_values(sd):
        if isinstance(t, ShardedTensor):
            out[t.key] = (tuple(t.global_shape), bool(t.allow_shape_mismatch))
    return out


def first_problem(
    src: Source, want: dict[str, tuple[tuple[int, ...], bool]], vocab_size: int = 0
) -> str | None:
    """The first key (in sorted order) the checkpoint lacks, holds in another shape, or holds and the model
    does not: one line naming the key and both shapes. `want` is the whole LLM's (every stage's) keys.

    The vocabulary tables' rows may differ: Megatron-LM pads the vocabulary to a multiple of 128 x its TP
    size, the trainer to its own multiple, and megatron-core reads the rows both hold (zeros beyond the
    checkpoint's). They must still hold every one of the model's `vocab_size` real tokens: fewer rows would
    leave real tokens at zero."""
    for key in sorted(want):
        shape, rows_may_differ = want[key]
        have = src.shapes.get(key)
        if have is None:
            return f"{src.path}: no tensor {key} (this model needs shape {list(shape)})"
        same = have[1:] == shape[1:] and len(have) == len(shape) if rows_may_differ else have == shape
        if not same:
            return f"{src.path}: tensor {key} has shape {list(have)}, this model needs {list(shape)}"
        if rows_may_differ and have[0] < vocab_size:
            return (
                f"{src.path}: tensor {key} has shape {list(have)}: {have[0]} rows, fewer than this model's "
                f"vocabulary of {vocab_size} tokens (this model needs {list(shape)})"
            )
    for key in sorted(src.shapes):
        if key.startswith(_MODEL_ROOTS) and key not in want:
            return (
                f"{src.path}: tensor {key} (shape {list(src.shapes[key])}) is not part of this model "
                "(another architecture: more layers, experts or an untied output layer?)"
            )
    return None


def _gathered(want: dict, group) -> dict:
    """The union of `want` over the LLM's ranks (a collective of the LLM's ranks alone)."""
    import torch.distributed as dist

    if group is None or dist.get_world_size(group) == 1:
        return want
    parts = [None] * dist.get_world_size(group)
    dist.all_gather_object(parts, want, group=group)
    return {k: v for p in parts for k, v in p.items()}


# ---------------------------------------------------------------------------------------------- load


@contextmanager
def _weights_only():
    """dist_checkpointing.load (megatron-core 0.19) first reads the checkpoint's common state: Megatron-LM's
    arguments, iteration and RNG, in a legacy common.pt or a "common_state" object. A weights-only load needs
    none of it, and a legacy common.pt is a pickle of arbitrary objects: it is not read. (The tensors are read
    rank-locally, `no_dist=True` in the torch_dist strategy: the encoder's ranks never join this load.)"""
    from megatron.core.dist_checkpointing import serialization

    saved = serialization.load_common_state_dict
    serialization.load_common_state_dict = lambda checkpoint_dir: {}
    try:
        yield
    finally:
        serialization.load_common_state_dict = saved


def load_llm(init, gpt, pgc, vocab_size: int = 0) -> int:
    """trainer.init.llm's Megatron checkpoint into this rank's LLM stage (after canonical_init_); 0 when the
    LLM does not start from one. `pgc` is the LLM's ProcessGroupCollection: its intra_dist_opt group spans
    every LLM rank (the mismatch check's gather); `vocab_size` the description's real (unpadded)
    vocabulary. Returns the number of tensors loaded."""
    if init is None or init.llm is None or isinstance(init.llm, str):
        return 0
    import torch
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.strategies.torch import TorchDistLoadShardedStrategy

    src = check_source(init.llm.megatron)
    problem = first_problem(src, _gathered(wanted(gpt, src, pgc), pgc.intra_dist_opt), vocab_size)
    if problem:
        err = MegatronInitError(problem, WHERE)
        err.report = pgc.intra_dist_opt.rank() == 0
        raise err
    sd = _weights(gpt.sharded_state_dict(metadata=sharded_metadata(src, pgc)))
    with _weights_only(), dcp_index_as_data():
        loaded = dist_checkpointing.load(
            sd,
            str(src.path),
            sharded_strategy=TorchDistLoadShardedStrategy(),
            validate_access_integrity=False,  # a world all_gather; the check above covers the keys
        )
    with torch.no_grad():
        missing, unexpected = gpt.load_state_dict(loaded, strict=False)
    # the key check above refuses what the checkpoint lacks; this guards the hand-over to the module
    left = sorted(k for k in missing if not k.endswith("_extra_state")) + sorted(unexpected)
    if left:
        raise MegatronInitError(f"{src.path}: the model's {left[0]} was not loaded", WHERE)
    return len(loaded)

"""Pickled files someone hands over, read as data: never a pickle that may name any callable.

A checkpoint part (`*.pt`, written by files.py) and the tensor index of a Megatron torch_dist checkpoint
(`.metadata`) are pickles; a plain `pickle.load` or `torch.load(weights_only=False)` of a crafted one runs
code. Both are read here with an allow-list:
- a part by `torch.load(weights_only=True)`: tensors, containers and numbers, plus the numpy types of the
  RNG state the saver itself writes (numpy.random.get_state holds a uint32 array);
- a `.metadata` by an unpickler that admits only torch.distributed.checkpoint's own records (its
  dataclasses and enums), torch.Size, dtypes and layouts, and plain containers.
Anything else is refused with `NotData`, naming the file and what it holds.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import pickle
import types
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# torch.distributed.checkpoint's metadata classes live in these modules (torch 2.x)
DCP_MODULES = (
    "torch.distributed.checkpoint.metadata",
    "torch.distributed.checkpoint.planner",
    "torch.distributed.checkpoint.filesystem",
)
PLAIN = {
    ("collections", "OrderedDict"),
    ("builtins", "set"),
    ("builtins", "frozenset"),
    ("builtins", "slice"),
}


class NotData(ValueError):
    """A handed-over pickle that holds something other than the data its format allows, or that is damaged."""


def _numpy_globals() -> list:
    import numpy as np

    core = getattr(np, "_core", None) or np.core  # numpy 2 renamed numpy.core
    kinds = [type(np.dtype(t)) for t in (np.uint32, np.int64, np.float64, np.float32, np.uint8, np.bool_)]
    return [core.multiarray._reconstruct, np.ndarray, np.dtype, *kinds]


def load_part(path: Path, mmap: bool = False) -> Any:
    """torch.load of a checkpoint part as data only (NotData otherwise)."""
    import torch

    try:
        with torch.serialization.safe_globals(_numpy_globals()):
            return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as e:
        if "Unsupported global" in str(e):
            raise NotData(f"{path}: {_why(e)} (refused: loading it could run code)") from None
        raise NotData(f"{path}: damaged ({str(e).splitlines()[0][:200]})") from None
    except (RuntimeError, EOFError, OSError) as e:  # a cut or overwritten file: torch cannot read its archive
        raise NotData(f"{path}: damaged ({type(e).__name__}: {str(e).splitlines()[0][:200]})") from None


def _why(e: Exception) -> str:
    for line in str(e).splitlines():
        if "Unsupported global: GLOBAL " in line:
            return "holds the global " + line.split("GLOBAL ", 1)[1].split()[0].rstrip(".,")
    return "is not a pickle of tensors and plain data"


class _Forbidden(pickle.UnpicklingError):
    """A global the index may not name (other unpickling errors are a damaged file, not a crafted one)."""


class _IndexUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        import torch

        if module in DCP_MODULES:
            # their records only: dataclasses and enums (never a reader, writer or function)
            obj = getattr(importlib.import_module(module), name, None)
            if isinstance(obj, type) and (dataclasses.is_dataclass(obj) or issubclass(obj, enum.Enum)):
                return obj
        elif module == "torch" and (name == "Size" or isinstance(getattr(torch, name, None), torch.dtype)):
            return getattr(torch, name)
        elif (module, name) == ("torch.serialization", "_get_layout"):
            return torch.serialization._get_layout  # a layout from its name: torch.strided, ...
        elif (module, name) in PLAIN:
            return super().find_class(module, name)
        raise _Forbidden(f"the global {module}.{name}")


def load_index(stream) -> Any:
    """A torch.distributed.checkpoint `.metadata` from an open binary stream, as data only."""
    try:
        return _IndexUnpickler(stream).load()
    except _Forbidden as e:
        name = getattr(stream, "name", ".metadata")
        raise NotData(
            f"{name}: holds {e}, not only torch.distributed.checkpoint's metadata (refused: unpickling it "
            "could run code)"
        ) from None


@contextmanager
def dcp_index_as_data():
    """While active, torch.distributed.checkpoint's FileSystemReader reads `.metadata` with load_index (its
    own read_metadata is a plain pickle.load); every other use of pickle in that module is unchanged."""
    from torch.distributed.checkpoint import filesystem

    saved = filesystem.pickle
    filesystem.pickle = types.SimpleNamespace(**{**vars(pickle), "load": load_index})
    try:
        yield
    finally:
        filesystem.pickle = saved

"""The energon loader state a checkpoint holds, written as a pickle and read back as data only.

energon's `save_state_rank()` returns its own state dataclasses (SavableDataLoaderState, SliceState,
SystemRngState, ...), a FlexState (a dict), numpy arrays (the RNG state) and, in a multiplexed loader's
pending batches, this project's encoded batches with their tensors. There is no other encoding energon
restores from, so the state stays a pickle; it is read back by an unpickler that admits only:
- dataclasses defined in energon's or this package's data modules (records: never a function or reader),
  energon's FlexState and EPath (the shard a pending batch came from);
- tensors, storages, dtypes, sizes and numpy arrays, rebuilt the way torch and numpy pickle them; a storage's
  nested bytes are read with `torch.load(weights_only=True)` (torch's own `_load_from_bytes` would unpickle
  them with any global; megatron-core's `safe_load_from_bytes`, which it installs, is the same reading);
- plain containers.
Anything else (e.g. `os.system`, `builtins.eval`) is refused with `LoaderStateRefused`, before it is called:
a crafted checkpoint cannot run code on the ranks that resume from it. Checkpoints written before this
module hold the same plain pickle and resume unchanged.
"""

from __future__ import annotations

import dataclasses
import importlib
import io
import pickle
from typing import Any

from .errors import DataError

DATA_MODULES = ("megatron.energon.", "mimo_jobs.data.")
PLAIN = {
    ("collections", "OrderedDict"),
    ("collections", "deque"),
    ("builtins", "set"),
    ("builtins", "frozenset"),
    ("builtins", "slice"),
    ("builtins", "complex"),
    ("megatron.energon.state", "FlexState"),
    ("megatron.energon.epathlib.epath", "EPath"),  # a batch's source shard: a path and a storage profile
    ("pathlib", "PurePosixPath"),
}


class LoaderStateRefused(DataError):
    """Checkpointed loader state that names something other than the data it may hold, or is damaged."""


def dumps(state: Any) -> bytes:
    return pickle.dumps(state)


def loads(data: bytes) -> Any:
    """The loader state pickled by `dumps`, as data only (LoaderStateRefused otherwise)."""
    if not isinstance(data, (bytes, bytearray)):
        raise LoaderStateRefused(f"the data-loader state is {type(data).__name__}, not pickled bytes")
    try:
        return _StateUnpickler(io.BytesIO(data)).load()
    except _Forbidden as e:
        raise LoaderStateRefused(
            f"the data-loader state holds {e}, not only energon's loader state (refused: unpickling it "
            "could run code)"
        ) from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, RuntimeError) as e:
        raise LoaderStateRefused(f"the data-loader state is damaged ({type(e).__name__}: {e})") from None


class _Forbidden(pickle.UnpicklingError):
    pass


def _storage_from_bytes(b: bytes) -> Any:
    import torch

    return torch.load(io.BytesIO(b), map_location="cpu", weights_only=True)


def _tensor_globals() -> dict[tuple[str, str], Any]:
    import numpy as np
    import torch

    core = getattr(np, "_core", None) or np.core  # numpy 2 renamed numpy.core
    out: dict[tuple[str, str], Any] = {
        ("torch._utils", "_rebuild_tensor_v2"): torch._utils._rebuild_tensor_v2,
        ("torch._utils", "_rebuild_tensor"): torch._utils._rebuild_tensor,
        ("torch.storage", "_load_from_bytes"): _storage_from_bytes,
        # megatron-core replaces torch's storage reduction with this weights_only twin once imported
        ("megatron.core.safe_globals", "safe_load_from_bytes"): _storage_from_bytes,
        ("torch", "Size"): torch.Size,
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
        ("numpy.core.multiarray", "_reconstruct"): core.multiarray._reconstruct,
        ("numpy._core.multiarray", "_reconstruct"): core.multiarray._reconstruct,
        ("numpy.core.multiarray", "scalar"): core.multiarray.scalar,
        ("numpy._core.multiarray", "scalar"): core.multiarray.scalar,
    }
    for t in (np.uint8, np.uint32, np.uint64, np.int32, np.int64, np.float32, np.float64, np.bool_):
        k = type(np.dtype(t))
        out[(k.__module__, k.__name__)] = k
    return out


class _StateUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        import torch

        known = _tensor_globals().get((module, name))
        if known is not None:
            return known
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        if (module, name) in PLAIN:
            return getattr(importlib.import_module(module), name)
        if module.startswith(DATA_MODULES) and "." not in name:
            try:
                obj = getattr(importlib.import_module(module), name, None)
            except ImportError:
                obj = None
            if isinstance(obj, type) and dataclasses.is_dataclass(obj):
                return obj
        raise _Forbidden(f"the global {module}.{name}")

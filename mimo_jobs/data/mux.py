"""One energon loader for the several LLM lanes an encoder replica serves (fan-out), instead of one per lane.

Why: a replica serving k lanes with one loader per lane runs k x num_workers worker processes, and each
worker opens its own shards; the count grows with the fan-out. Here one loader with num_workers workers
reads every lane: worker w holds, for each lane j, exactly the dataset that worker w of lane j's own loader
would iterate (same WorkerConfig(rank=j), same seeds, same shard slices) and yields one item per step that
carries the next batch of every lane. A lane's own loader takes its n-th batch from worker n mod
num_workers; so does this one, with all lanes advancing together. Each lane therefore receives exactly the
samples, in exactly the order, of its own loader, and the pipeline behind it (task encoder, skip counting,
alignment checks) is unchanged.

Resume: the loader's own save/restore state covers every lane at once (energon checkpoints the whole dataset
tree of each worker); batches already fetched for a lane but not yet consumed are saved with it, so a state
taken when lanes were drawn unevenly restores exactly too.
"""

from __future__ import annotations

import contextlib
from collections import deque
from dataclasses import dataclass
from typing import Any

from megatron.energon import SavableDataset, WorkerConfig, get_savable_loader
from megatron.energon.flavors.base_dataset import PinMemoryMixin
from megatron.energon.wrappers.base import BaseWrapperDataset

from . import loader_state
from .errors import DataError


def stop_loader(it, loader) -> None:
    """End a loader's workers now: closing the iterator, and shutting down the persistent worker iterator
    torch keeps on the loader (left to garbage collection, each worker costs a 5 s join timeout)."""
    if it is not None:
        it.close()
    tit = getattr(loader, "_iterator", None)
    if tit is not None and hasattr(tit, "_shutdown_workers"):
        tit._shutdown_workers()
        loader._iterator = None


@dataclass
class LaneGroup(PinMemoryMixin):
    """One step of the multiplexed loader: the next batch of each lane, in the loader's lane order."""

    batches: list


@contextlib.contextmanager
def _acting_as(cfg: WorkerConfig):
    """Make `cfg` the active worker config while a lane's dataset runs: energon's task-encoder hooks read
    the active config (e.g. per-sample seeds of stateless random ops), which must be that lane's own."""
    prev = WorkerConfig.active_worker_config
    WorkerConfig.active_worker_config = cfg
    try:
        yield
    finally:
        WorkerConfig.active_worker_config = prev


class LaneZipDataset(BaseWrapperDataset):
    """The per-lane datasets of one worker, stepped together: item n = (batch n of lane 0, ..., lane k-1).

    The lanes keep their own WorkerConfig (rank = the lane); `worker_config` (the loader's) only fixes the
    worker count, which every lane shares. Saving and restoring delegate to the lanes' datasets
    (BaseWrapperDataset), so the loader's checkpoint holds every lane's position."""

    def __init__(self, datasets: list[SavableDataset], lanes: list[int], *, worker_config: WorkerConfig):
        # BaseWrapperDataset insists that children share the wrapper's config; the lanes differ in rank on
        # purpose, so only the worker count is checked here.
        SavableDataset.__init__(self, worker_config=worker_config)
        bad = [
            lane
            for lane, d in zip(lanes, datasets)
            if d.worker_config.num_workers != worker_config.num_workers
        ]
        if bad or len(lanes) != len(datasets):
            raise ValueError(f"lanes {bad}: every lane's dataset must use the loader's worker count")
        self.datasets = tuple(datasets)
        self.lanes = list(lanes)

    def reset_state_own(self) -> None:
        return

    def len_worker(self, worker_idx: int | None = None) -> int:
        return min(d.len_worker(worker_idx) for d in self.datasets)

    def worker_has_samples(self) -> bool:
        return all(d.worker_has_samples() for d in self.datasets)

    def can_restore_sample(self) -> bool:
        return False  # items are lane groups, not samples; resume goes through save_state/restore_state

    def __iter__(self):
        its = [iter(d) for d in self.datasets]
        try:
            while True:
                group = []
                for lane, d, it in zip(self.lanes, self.datasets, its):
                    with _acting_as(d.worker_config):
                        try:
                            group.append(next(it))
                        except StopIteration:
                            # a lane's own loader would go on with its other workers; stepping lanes
                            # together cannot, so say why instead of silently changing the order
                            raise DataError(
                                f"lane {lane}: a loader worker ran out of samples while the multiplexed "
                                f"loader still reads lanes {self.lanes}; the dataset is too small for "
                                f"{d.worker_config.world_size} lanes x {max(1, d.worker_config.num_workers)} "
                                "workers"
                            ) from None
                yield LaneGroup(group)
        finally:
            for it in its:
                if hasattr(it, "close"):
                    it.close()

    def config(self) -> dict[str, Any]:
        return {
            "type": type(self).__qualname__,
            "lanes": self.lanes,
            "datasets": [d.config() for d in self.datasets],
        }

    def __str__(self) -> str:
        return f"LaneZipDataset(lanes={self.lanes})"


class MuxReader:
    """Main-process side: one savable loader over a LaneZipDataset; `next(lane)` hands out that lane's next
    batch, fetching a new lane group when the lane has none waiting."""

    def __init__(self, datasets: list[SavableDataset], lanes: list[int], worker_config: WorkerConfig):
        self.lanes = list(lanes)
        self.worker_config = worker_config
        self.loader = get_savable_loader(LaneZipDataset(datasets, lanes, worker_config=worker_config))
        self.it = None
        self.pending: dict[int, deque] = {lane: deque() for lane in lanes}

    def next(self, lane: int) -> Any:
        q = self.pending[lane]
        if not q:
            if self.it is None:
                self.it = iter(self.loader)
            group = next(self.it)
            for x, b in zip(self.lanes, group.batches):
                self.pending[x].append(b)
        return q.popleft()

    def save(self) -> dict:
        """Plain types only (bytes, ints, lists), so any checkpoint format holds it."""
        # Safe with workers: the iterator (if any) has yielded at least once; without one energon returns
        # None = the initial state.
        return {
            "lanes": list(self.lanes),
            "loader": loader_state.dumps(self.loader.save_state_rank()),
            "pending": {x: loader_state.dumps(list(q)) for x, q in self.pending.items()},
        }

    def restore(self, state: dict) -> None:
        """Only before iterating (energon restores a loader that has not started its workers)."""
        if list(state["lanes"]) != self.lanes:
            raise DataError(
                f"checkpointed data state is one multiplexed loader for lanes {list(state['lanes'])}; this "
                f"rank reads lanes {self.lanes}: resume with the same layout"
            )
        self.loader.restore_state_rank(loader_state.loads(state["loader"]))
        self.pending = {x: deque(loader_state.loads(state["pending"][x])) for x in self.lanes}

    @property
    def started(self) -> bool:
        return self.it is not None

    def close(self) -> None:
        stop_loader(self.it, self.loader)
        self.it = None

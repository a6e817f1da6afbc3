"""The one rule of how tensor parallelism cuts a tensor along its split dimension (pure: no torch).

megatron-core marks each TP-split parameter with `partition_dim` and `partition_stride`
(megatron/core/tensor_parallel/layers.py): the full tensor is `stride` equal blocks along that dimension
and a rank holds its 1/size of each block, in block order. A gated MLP's fc1 is [gate; up] (stride 2), so a
rank's shard is [its gate rows; its up rows]; every other split has stride 1 (one contiguous slice). The
canonical init, the HuggingFace loader, the resharder and the export all cut and assemble through this
function.
"""

from __future__ import annotations


def strided_blocks(length: int, parts: int, rank: int, size: int) -> list[tuple[int, int]]:
    """(start, length) along the split dimension of each piece TP rank `rank` of `size` holds, in the order
    the rank holds them: `length` is `parts` equal blocks and the rank holds its 1/size of each."""
    if parts < 1 or size < 1 or not 0 <= rank < size:
        raise ValueError(f"rank {rank} of {size} with {parts} blocks: not a tensor-parallel cut")
    if length % (parts * size):
        raise ValueError(f"{length} rows do not split into {parts} blocks of {size} equal shards")
    block = length // parts
    n = block // size
    return [(b * block + rank * n, n) for b in range(parts)]

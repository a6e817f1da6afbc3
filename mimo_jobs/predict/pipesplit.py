"""Which LLM layers each pipeline stage and model chunk holds, as megatron-core 0.19.2 assigns them.

megatron/core/transformer/transformer_block.py `get_num_layers_to_build` and transformer_layer.py
`get_transformer_layer_offset` (no pipeline_model_parallel_layout, no num_layers_in_first/last_pipeline_stage):
with `account_for_embedding_in_pipeline_split` (`embedding`) and `account_for_loss_in_pipeline_split` (`loss`)
the embedding and the loss each count as one layer, L' = L + embedding + loss; every stage gets L' / pp of
them and every model chunk (virtual stage) L' / (pp x vp); the first chunk of stage 0 builds one transformer
layer less (it holds the embedding) and the last chunk of the last stage one less (it holds the loss). Chunk
(stage r, virtual stage v) starts at layer v x L' / vp + r x L' / (pp x vp), one earlier with `embedding`
except on the very first chunk. transformer_config.py refuses an L' that pp (x vp) does not divide.
Without either flag this is the even split, L / (pp x vp) per chunk.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass


@dataclass(frozen=True)
class PipelineSplit:
    """megatron-core's TransformerConfig flags that count the embedding and the loss as layers."""

    embedding: bool = False  # account_for_embedding_in_pipeline_split
    loss: bool = False  # account_for_loss_in_pipeline_split

    @property
    def extra(self) -> int:
        return int(self.embedding) + int(self.loss)

    def words(self) -> str:
        named = [w for w, on in (("embedding", self.embedding), ("loss", self.loss)) if on]
        return " and ".join(named) + " counted as layers in the pipeline split" if named else "even split"


EVEN = PipelineSplit()


def splits(num_layers: int, pp: int, vp: int, split: PipelineSplit = EVEN) -> bool:
    """Whether megatron-core builds this split: L' whole layers per model chunk, none left negative."""
    vp = max(1, vp)
    total = num_layers + split.extra
    return pp >= 1 and total % (pp * vp) == 0 and total // (pp * vp) >= 1


@functools.lru_cache(maxsize=1024)
def chunk_layers(num_layers: int, pp: int, vp: int, split: PipelineSplit = EVEN) -> tuple:
    """Per stage, per model chunk, the range of global layer indices it builds; None where megatron-core
    refuses the split (pp x vp does not divide L')."""
    vp = max(1, vp)
    if not splits(num_layers, pp, vp, split):
        return None
    total = num_layers + split.extra
    per_chunk = total // (pp * vp)
    out = []
    for r in range(pp):
        row = []
        for v in range(vp):
            first_chunk = r == 0 and v == 0
            last_chunk = r == pp - 1 and v == vp - 1
            n = per_chunk - (split.embedding and first_chunk) - (split.loss and last_chunk)
            if pp == 1:
                start = v * per_chunk
            else:
                start = v * (total // vp) + r * per_chunk
            start -= split.embedding and not first_chunk
            row.append(range(start, start + n))
        out.append(tuple(row))
    return tuple(out)


def stage_layers(num_layers: int, pp: int, vp: int, split: PipelineSplit, stage: int) -> list[int]:
    """The global layer indices stage `stage` holds: its chunks' where megatron-core builds the split, else
    the even share num_layers // pp in one block (what the planner priced before it knew the split)."""
    chunks = chunk_layers(num_layers, pp, vp, split)
    if chunks is None:
        n = num_layers // pp
        return list(range(stage * n, (stage + 1) * n))
    return [i for c in chunks[stage] for i in c]


def most_stage_layers(num_layers: int, pp: int, vp: int, split: PipelineSplit) -> int:
    """Layers on the fullest stage (the slowest, all else equal)."""
    return max(len(stage_layers(num_layers, pp, vp, split, s)) for s in range(pp))


def slowest_stage_layers(num_layers: int, pp: int, vp: int, split: PipelineSplit) -> float:
    """The layers the slowest stage runs: the fullest stage's where megatron-core builds the split, else
    the mean num_layers / pp."""
    if splits(num_layers, pp, vp, split):
        return float(most_stage_layers(num_layers, pp, vp, split))
    return num_layers / pp

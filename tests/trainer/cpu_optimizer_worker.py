"""One process (gloo world of 1): megatron-core's optimizer as a CPU run gets it on a machine where Transformer
Engine is installed. TE cannot be installed here, so megatron-core's module flags are set as its import sets them
when TE imports (megatron/core/optimizer/__init__.py, distrib_optimizer.py), with a stand-in for TE's FusedAdam
whose constructor fails as TE's does without a driver (transformer_engine/pytorch/optimizers/fused_adam.py
allocates on "cuda"). Then the trainer's CPU shims, a real GPTModel under megatron DDP, get_megatron_optimizer
and one step. Prints one JSON line."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
sys.path.insert(0, str(Path(__file__).parent))


class StandInFusedAdam:
    """Stand-in for transformer_engine.pytorch.optimizers.FusedAdam on a machine without an NVIDIA driver."""

    def __init__(self, *a, **k):
        raise RuntimeError("Found no NVIDIA driver on your system (stand-in for TE's FusedAdam)")


def main() -> dict:
    import megatron.core.optimizer as mopt
    import megatron.core.optimizer.distrib_optimizer as mdist
    import torch.distributed as dist
    from ckpt_lib_worker import CountingProvider, build, step

    from mimo_jobs.trainer.cuda_shims import install
    from mimo_jobs.trainer.model.optimizer import leaf_optimizers

    # as megatron-core's import leaves them when transformer_engine.pytorch.optimizers imports
    mopt.Adam = mopt.SGD = mdist.Adam = StandInFusedAdam
    mopt.USING_PYTORCH_OPTIMIZER, mdist.HAVE_APEX_OR_TE, mdist.USING_TE_OPTIMIZER = False, True, True
    install()
    os.environ.update(WORLD_SIZE="1", RANK="0")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    from megatron.core import parallel_state

    parallel_state._set_global_memory_buffer()
    try:
        m = build(seed=1)
    except RuntimeError as e:
        return {"error": str(e)}
    loss = step(m, CountingProvider(seed=5))
    return {
        "optimizers": sorted({type(o.optimizer).__name__ for o in leaf_optimizers(m["opt"])}),
        "loss": loss,
    }


if __name__ == "__main__":
    print(json.dumps(main()))

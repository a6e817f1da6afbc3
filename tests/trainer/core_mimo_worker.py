"""megatron-core's own MIMO pieces run on the inputs our trainer handles, in one gloo world of 3 ranks.

Run by test_core_mimo.py under torchrun (`--nproc-per-node 3 core_mimo_worker.py OUT_DIR`); each rank writes
OUT_DIR/rank<r>.json with what it measured, and the test compares it with the exact answer:

  roles      core's `RankRole.build` over our grids (encoder rank 0, LLM ranks 1-2 as two pipeline stages)
             against our `role_of`
  fan_in     core's `BridgeCommunicator` (2D tensors) from two encoder replicas (ranks 0, 1) to one LLM
             replica (rank 2) with per-sample image-token counts that differ between the replicas: the
             embeddings that arrive and the gradient rows each replica gets back
  fan_out    the same from one encoder replica (rank 0) to two LLM replicas (ranks 1, 2), the per-sample
             split given to core the way its MimoModel gives it (`_mimo_bridge_split_sizes`)
  optimizer  core's `MimoOptimizer` against ours over the same per-module optimizers on every rank: the
             global grad norm, and a NaN gradient with bf16-style optimizers (no loss scaler)

The CPU shims (mimo_jobs.trainer.cuda_shims) are installed first, as the trainer does for a CPU run: core's
pieces create their buffers on `torch.cuda.current_device()` / device "cuda" and ask for NCCL groups.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
os.environ["CUDA_VISIBLE_DEVICES"] = ""

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from mimo_jobs.trainer import cuda_shims  # noqa: E402

H = 4  # hidden size of the exchanged embeddings


def grid(shape: list[int], offset: int):
    from megatron.core.hyper_comm_grid import HyperCommGrid

    g = HyperCommGrid(shape, ["tp", "cp", "pp", "dp"], rank_offset=offset, backend="gloo")
    for dims in (["tp"], ["pp"], ["dp"]):
        g.create_pg(dims)
    return g


def rows(counts: list[int], seed: int) -> torch.Tensor:
    """A replica's flat embeddings: one row per image token, values that name their sample and token."""
    out = [torch.full((1, H), float(seed * 100 + i * 10 + t)) for i, c in enumerate(counts) for t in range(c)]
    return torch.cat(out) if out else torch.empty(0, H)


def roles(rank: int) -> dict:
    from megatron.core.models.mimo.config.role import RankRole

    from mimo_jobs.trainer.parallel.grids import ENCODER, LANGUAGE, ModuleShape, build_grids, role_of

    enc, llm = ModuleShape(ENCODER, 0, 1, 1, 1), ModuleShape(LANGUAGE, 1, 1, 2, 1)
    g = build_grids({"vision": enc}, llm, "gloo", None)
    core = RankRole.build([ENCODER], {ENCODER: g.encoders["vision"].grid, LANGUAGE: g.language.grid})
    ours = role_of(rank, enc, llm)
    own = ours.modules[-1]
    return {
        "core": {
            "modules": sorted(core.modules),
            "first": core.is_first_stage(own),
            "last": core.is_last_stage(own),
            "mode": core.mode.name,
        },
        "ours": {
            "modules": sorted(ours.modules),
            "first": ours.is_first_stage,
            "last": ours.is_last_stage,
        },
    }


def fan_in(rank: int) -> dict:
    """Replica 0 holds samples with 3 and 1 image tokens, replica 1 samples with 0 and 2: the LLM replica
    receives 6 rows and its gradient must go back as 4 rows to replica 0 and 2 rows to replica 1."""
    from megatron.core.pipeline_parallel.bridge_communicator import BridgeCommunicator

    counts = {0: [3, 1], 1: [0, 2]}
    bridge = BridgeCommunicator(grid([1, 1, 1, 2], 0), grid([1, 1, 1, 1], 2), tensor_ndim=2)
    weight = torch.arange(6 * H, dtype=torch.float32).reshape(6, H)  # d(loss)/d(row) on the LLM side
    if rank in counts:
        x = rows(counts[rank], rank)
        x._mimo_bridge_split_sizes = counts[rank]
        bridge.send_forward(x)
        g = bridge.recv_backward()
        first = sum(sum(counts[r]) for r in range(rank))
        want = weight[first : first + x.shape[0]]
        return {
            "sent_rows": x.shape[0],
            "grad_rows": g.shape[0],
            "grad_exact": g.shape == want.shape and bool(torch.equal(g, want)),
        }
    y = bridge.recv_forward()
    want = torch.cat([rows(counts[0], 0), rows(counts[1], 1)])
    bridge.send_backward(weight)
    return {"received_rows": y.shape[0], "received_exact": bool(torch.equal(y.detach(), want))}


def fan_out(rank: int) -> dict:
    """Replica 0 holds samples with 3 and 1 image tokens; LLM replica 1 owns the first, replica 2 the
    second: they must receive 3 and 1 rows and the gradient must come back as the 4 rows in order."""
    from megatron.core.pipeline_parallel.bridge_communicator import BridgeCommunicator

    counts = [3, 1]
    bridge = BridgeCommunicator(grid([1, 1, 1, 1], 0), grid([1, 1, 1, 2], 1), tensor_ndim=2)
    if rank == 0:
        x = rows(counts, 0)
        x._mimo_bridge_split_sizes = counts
        bridge.send_forward(x)
        g = bridge.recv_backward()
        want = torch.cat([torch.full((3, H), 1.0), torch.full((1, H), 2.0)])
        return {"grad_rows": g.shape[0], "grad_exact": g.shape == want.shape and bool(torch.equal(g, want))}
    y = bridge.recv_forward()
    lane = rank - 1
    want = rows(counts, 0)[[0, 1, 2]] if lane == 0 else rows(counts, 0)[[3]]
    bridge.send_backward(torch.full(y.shape, float(rank)))
    return {"received_rows": y.shape[0], "received_exact": bool(torch.equal(y.detach(), want))}


class ModuleOpt:
    """A module's optimizer as both MIMO optimizers drive it (the MegatronOptimizer methods they call):
    plain SGD over this rank's parameters of the module, no loss scaler (bf16/fp32 training)."""

    def __init__(self, params: list[torch.Tensor], clip_grad: float):
        from megatron.core.optimizer import OptimizerConfig

        self.params = params
        self.sgd = torch.optim.SGD(params, lr=0.1)
        self.param_groups = self.sgd.param_groups
        self.config = OptimizerConfig(clip_grad=clip_grad)

    def prepare_grads(self) -> bool:
        return False  # found_inf comes from a loss scaler only, and bf16/fp32 training has none

    def get_grad_norm(self) -> float:
        return float(torch.sqrt(sum((p.grad.double() ** 2).sum() for p in self.params)))

    def get_parameters(self):
        return self.params

    def step_with_ready_grads(self) -> bool:
        self.sgd.step()
        return True

    def zero_grad(self, set_to_none: bool = True):
        self.sgd.zero_grad(set_to_none)


def module_opts(rank: int, nan: bool) -> dict:
    """Rank 0 runs the encoder, ranks 1 and 2 the LLM (its two TP halves hold the same norm here, as the
    optimizers' own grad-norm groups make them); the encoder's gradient is NaN when `nan`."""
    torch.manual_seed(1234 + (0 if rank == 0 else 1))
    p = torch.nn.Parameter(torch.ones(8))
    p.grad = torch.full((8,), 3.0 if rank == 0 else 0.5)
    if nan and rank == 0:
        p.grad[0] = float("nan")
    return {"encoder" if rank == 0 else "language": ModuleOpt([p], clip_grad=1.0)}


def optimizer(rank: int) -> dict:
    from megatron.core.models.mimo.optimizer import MimoOptimizer as CoreMimoOptimizer
    from megatron.core.models.mimo.optimizer import ModuleOptimizerInfo
    from megatron.core.optimizer import OptimizerConfig

    from mimo_jobs.trainer.model.optimizer import MimoOptimizer

    out = {}
    for nan in (False, True):
        opts = module_opts(rank, nan)
        infos = {
            name: ModuleOptimizerInfo(opts.get(name), None, None, name in opts)
            for name in ("encoder", "language")
        }
        core = CoreMimoOptimizer(infos, OptimizerConfig(clip_grad=1.0))
        ok, norm, _ = core.step()
        param = next(iter(opts.values())).params[0]
        core_res = {"ok": ok, "norm": norm, "params_finite": bool(torch.isfinite(param).all())}

        opts = module_opts(rank, nan)
        ours = MimoOptimizer(["encoder", "language"], opts, weight_decay=0.0, device="cpu")
        res = ours.step(clip_grad=1.0)
        param = next(iter(opts.values())).params[0]
        ours_res = {"ok": res.ok, "norm": res.grad_norm, "params_finite": bool(torch.isfinite(param).all())}
        key = "nan" if nan else "finite"
        out[key] = {"core": core_res, "ours": ours_res}
    exact = math.sqrt(8 * 3.0**2 + 8 * 0.5**2)  # the two modules' norms squared, summed once each
    out["exact_norm"] = exact
    return out


def main() -> None:
    out = Path(sys.argv[1])
    dist.init_process_group("gloo")
    cuda_shims.install()
    rank = dist.get_rank()
    found = {
        "roles": roles(rank),
        "fan_in": fan_in(rank),
        "fan_out": fan_out(rank),
        "optimizer": optimizer(rank),
    }
    (out / f"rank{rank}.json").write_text(json.dumps(found, default=str))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

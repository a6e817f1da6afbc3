"""One run's prediction: memory per rank class, iteration time, throughput and MFU (the figures `predict`
prints and `plan` ranks by).

MFU = (encoder + LLM training FLOPs of the global batch) / (iteration time x ALL GPUs of the job x peak):
the encoder's GPUs count, as in the report's tokens/s/GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from .hardware import GPU
from .memory import MemoryPlan, memory_plan
from .run import RunShape, shape_of
from .steptime import Efficiency, StepTime, efficiency_for, step_time


@dataclass(frozen=True)
class Prediction:
    name: str
    run_id: str
    shape: RunShape
    gpu: GPU
    memory: MemoryPlan
    time: StepTime

    @property
    def world(self) -> int:
        return self.shape.layout.world

    @property
    def flops_per_iteration(self) -> dict[str, float]:
        gbs = self.shape.layout.gbs
        return {"encoder": self.time.flops.encoder * gbs, "llm": self.time.flops.llm * gbs}

    @property
    def tokens_per_s_per_gpu(self) -> float:
        lay = self.shape.layout
        return lay.gbs * self.shape.seq_length / self.time.iteration_s / self.world

    @property
    def mfu(self) -> float:
        f = self.flops_per_iteration
        return (f["encoder"] + f["llm"]) / (self.time.iteration_s * self.world * self.gpu.peak_flops)


def predict_shape(rs: RunShape, gpu: GPU, eff: Efficiency, name: str = "", run_id: str = "") -> Prediction:
    mem = memory_plan(rs, gpu)
    return Prediction(name, run_id, rs, gpu, mem, step_time(rs, mem, gpu, eff))


def predict_run(run, gpu: GPU, eff: Efficiency | None = None) -> Prediction:
    """A plan.runspec.RunSpec, priced with `eff` or the GPU's fitted efficiencies."""
    return predict_shape(
        shape_of(run.layout, run.trainer), gpu, eff or efficiency_for(gpu), run.name, run.run_id
    )


def to_json(p: Prediction) -> dict:
    """The stable per-run JSON of `predict --json` (docs/predict.md)."""
    ranks = [
        {
            "module": m.module,
            "stage": m.stage,
            "ranks": list(m.ranks),
            "params": m.params,
            "weight_bytes": m.weight_bytes,
            "grad_bytes": m.grad_bytes,
            "optimizer_bytes": m.optimizer_bytes,
            "activation_bytes": m.activation_bytes + m.bridge_bytes,
            "total_bytes": m.total_bytes,
        }
        for c in p.memory.classes
        for m in c.modules
        if not (p.shape.layout.colocated and m.module == "encoder" and c is not p.memory.classes[0])
    ]
    return {
        "name": p.name,
        "run_id": p.run_id,
        "nodes": p.shape.layout.nodes,
        "fits": p.memory.fits,
        "memory": p.memory.verdict(),
        "iteration_s": p.time.iteration_s,
        "tokens_per_s_per_gpu": p.tokens_per_s_per_gpu,
        "mfu": p.mfu,
        "bottleneck": p.time.bottleneck,
        "image_tokens": {
            "mean": p.shape.image_tokens_mean,
            "max": p.shape.image_tokens_max,
            "source": p.shape.data_source,
        },
        "idle_fraction": p.time.idle_fraction,
        "dominant": p.time.dominant,
        "parts_s": dict(p.time.parts),
        "ranks": ranks,
        "flops_per_iteration": p.flops_per_iteration,
    }

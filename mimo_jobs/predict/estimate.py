"""One run's prediction: memory per rank class, iteration time, throughput and MFU (the figures `predict`
prints and `plan` ranks by).

MFU = (encoder + LLM training FLOPs of the global batch) / (iteration time x ALL GPUs of the job x peak):
the encoder's GPUs count, as in the report's tokens/s/GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import optime
from .cost import Cost, cost_of, iterations_of, to_budget
from .hardware import GPU
from .memory import MemoryPlan, memory_plan
from .modmix import module_flops
from .run import RunShape, shape_of
from .steptime import LLM, Efficiency, StepTime, efficiency_for, step_time


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
    def carried_tokens_per_s(self) -> float:
        """Tokens the global batch carries (not padding) per second: what a token budget is counted in."""
        return self.shape.layout.gbs * self.shape.carried_tokens_per_sample / self.time.iteration_s

    @property
    def iterations(self) -> int:
        """The iterations of the study's run at this layout's global batch."""
        rs = self.shape
        return iterations_of(rs.train_iters, rs.train_samples, rs.layout.gbs)

    def run_cost(self) -> Cost:
        """GPU-hours and node-hours of the study's length (train_iters or train_samples) at this layout."""
        return cost_of(self.iterations * self.time.iteration_s, self.world, self.shape.layout.nodes)

    def budget_cost(self, tokens: float) -> Cost | None:
        """GPU-hours and node-hours to train on `tokens` carried tokens at this layout."""
        return to_budget(tokens, self.carried_tokens_per_s, self.world, self.shape.layout.nodes)

    @property
    def mfu(self) -> float:
        f = self.flops_per_iteration
        return (f["encoder"] + f["llm"]) / (self.time.iteration_s * self.world * self.gpu.peak_flops)


def predict_shape(rs: RunShape, gpu: GPU, eff: Efficiency, name: str = "", run_id: str = "") -> Prediction:
    """`rs` priced module by module: memory per rank class, then the step's time."""
    mem = memory_plan(rs, gpu)
    return Prediction(name, run_id, rs, gpu, mem, _step_time(rs, mem, gpu, eff))


def _step_time(rs: RunShape, mem: MemoryPlan, gpu: GPU, eff: Efficiency) -> StepTime:
    """The operator model where the study chose it (gpu.time_model), it prices the run (optime.supports)
    and `eff` is the GPU's own (a `--db` calibration or a fit's probe scales the FLOPs model's terms, so
    keeps that model); else the FLOPs model."""
    if gpu.time_model == "operators" and optime.supports(rs, gpu) and eff == efficiency_for(gpu):
        return optime.step_time(rs, mem, gpu)
    return step_time(rs, mem, gpu, eff)


def predict_run(run, gpu: GPU, eff: Efficiency | None = None) -> Prediction:
    """A plan.runspec.RunSpec, priced with `eff` or the GPU's fitted efficiencies."""
    return predict_shape(
        shape_of(run.layout, run.trainer, run.point.command),
        gpu,
        eff or efficiency_for(gpu),
        run.name,
        run.run_id,
    )


def cost_json(p: Prediction, tokens: float | None) -> dict:
    """`cost` of a run in JSON: the study's length, and to a token budget when one is given."""
    budget = p.budget_cost(tokens) if tokens else None
    return {
        "iterations": p.iterations,
        "run": p.run_cost().to_json(),
        "carried_tokens_per_s": p.carried_tokens_per_s,
        "carried_tokens": p.shape.carried_source,
        "tokens": tokens,
        "to_tokens": budget.to_json() if budget else None,
    }


def to_json(p: Prediction, tokens: float | None = None) -> dict:
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
        # colocated, every LLM stage's class holds every encoder module: each module once
        if not (p.shape.layout.colocated and m.module != LLM and c is not p.memory.classes[0])
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
            "assumed": p.shape.image_assumed,  # the stated prior, not the data (docs/predict.md)
            "range": list(p.shape.image_range) if p.shape.image_range else None,
        },
        "idle_fraction": p.time.idle_fraction,
        "dominant": p.time.dominant,
        "parts_s": dict(p.time.parts),
        "ops_file": p.time.ops_file,  # the measured operator table it was priced from (cluster.hardware.ops)
        "ops_clamped": [list(c) for c in p.time.ops_clamped],  # its shapes outside that table's range
        "settings": p.shape.settings_json(p.time.model),
        "ranks": ranks,
        "flops_per_iteration": p.flops_per_iteration,
        "cost": cost_json(p, tokens),
        "modules": modules_json(p),
    }


def modules_json(p: Prediction) -> list[dict]:
    """Each encoder module under its name in the study: its tokens per sample (and where they come from),
    FLOPs per iteration and one microbatch's seconds on its ranks; then the LLM's (one stage)."""
    gbs, t = p.shape.layout.gbs, p.time
    out = [
        {
            "module": m.name,
            "modality": m.modality,
            "tokens": {"mean": m.tokens_mean, "max": m.tokens_max, "source": m.source, "assumed": m.assumed},
            "flops_per_iteration": gbs * module_flops(a, m, p.shape.preset.llm.hidden_size),
            "microbatch_s": t.modules.get(m.name),
        }
        for m, (_, a) in zip(p.shape.modules, p.shape.preset.named_encoders)
    ]
    llm = {"module": LLM, "flops_per_iteration": gbs * t.flops.llm, "microbatch_s": t.modules.get(LLM)}
    return out + [llm]

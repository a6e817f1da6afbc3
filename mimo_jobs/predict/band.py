"""The band a predicted time carries: how far the time model that priced it held on public runs it was not
fitted on (leave-one-source-out over benchmarks/published/runs.yaml: hardware.HELD_OUT for the FLOPs model,
opdata.HELD_OUT for the operator model), for the GPU generation a study is priced on. A time is printed with it ("1.68 s/iter, ±30% held out over 51 hopper runs
of 6 sources (FLOPs model)"); `predict --db` narrows it with a study's own runs (its calibration check says by how much).
Where no figure exists (the CPU, megatron-core's local layers, a generation without published runs) the
output says the time is unchecked instead."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .hardware import GPU, HELD_OUT, generation
from .opdata import HELD_OUT as OP_HELD_OUT
from .steptime import StepTime

# each time model's held-out figures per generation (StepTime.model names the model)
HELD_OUT_BY_MODEL = {"flops": HELD_OUT, "operators": OP_HELD_OUT}
MODEL_WORDS = {"flops": "FLOPs model", "operators": "operator model"}


@dataclass(frozen=True)
class Band:
    generation: str
    median: float  # median |relative error| of the generation's runs, each priced without its source
    worst: float
    runs: int
    sources: int
    model: str = "flops"  # the time model whose held-out error this is

    def text(self) -> str:
        runs = f"{self.runs} {self.generation} run{'s' * (self.runs != 1)}"
        srcs = f"{self.sources} source{'s' * (self.sources != 1)}"
        return f"±{self.median:.0%} held out over {runs} of {srcs} ({MODEL_WORDS[self.model]})"

    def contains(self, a: float, b: float) -> bool:
        """Whether two predicted times differ by less than the band: the model cannot tell them apart."""
        return abs(a - b) <= self.median * max(a, b)


def time_model(times: Iterable[StepTime]) -> str:
    """The model whose band a set of predicted times carries: the FLOPs model's where it priced any of them
    (a study whose runs differ in model is told the FLOPs model's band), else the operator model's."""
    models = {t.model for t in times}
    return "operators" if models == {"operators"} else "flops"


def band_for(gpu: GPU, model: str = "flops") -> Band | None:
    """The band of times priced on `gpu` by `model` (None: no published runs check this pricing)."""
    if gpu.layers != "te":
        return None
    g = generation(gpu.name)
    row = HELD_OUT_BY_MODEL[model].get(g)
    return None if row is None else Band(g, *row, model=model)


def band_note(gpu: GPU, model: str = "flops") -> str:
    """One line for a table of predicted times."""
    b = band_for(gpu, model)
    if b is None:
        return (
            f"time on {gpu.name} ({gpu.layers} layers) is not checked against published runs: "
            "calibrate with the study's own runs (predict --db)"
        )
    return (
        f"time: {b.text()} (median |error| of public runs each priced without its source; worst "
        f"{b.worst:.0%}); predict --db narrows it with the study's own runs"
    )


def band_json(gpu: GPU, model: str = "flops") -> dict | None:
    """The band as `predict --json` and `plan --json` give it (None: nothing checks this pricing)."""
    b = band_for(gpu, model)
    if b is None:
        return None
    return {
        "generation": b.generation,
        "median": b.median,
        "worst": b.worst,
        "runs": b.runs,
        "sources": b.sources,
        "model": b.model,
    }

"""The band a predicted time carries: how far the planner's fitted time model held on public runs it was not
fitted on (hardware.HELD_OUT, leave-one-source-out over benchmarks/published/runs.yaml), for the GPU
generation a study is priced on. A time is printed with it ("1.68 s/iter, ±30% held out over 51 hopper runs
of 6 sources"); `predict --db` narrows it with a study's own runs (its calibration check says by how much).
Where no figure exists (the CPU, megatron-core's local layers, a generation without published runs) the
output says the time is unchecked instead."""

from __future__ import annotations

from dataclasses import dataclass

from .hardware import GPU, HELD_OUT, generation


@dataclass(frozen=True)
class Band:
    generation: str
    median: float  # median |relative error| of the generation's runs, each priced without its source
    worst: float
    runs: int
    sources: int

    def text(self) -> str:
        runs = f"{self.runs} {self.generation} run{'s' * (self.runs != 1)}"
        return f"±{self.median:.0%} held out over {runs} of {self.sources} source{'s' * (self.sources != 1)}"

    def contains(self, a: float, b: float) -> bool:
        """Whether two predicted times differ by less than the band: the model cannot tell them apart."""
        return abs(a - b) <= self.median * max(a, b)


def band_for(gpu: GPU) -> Band | None:
    """The band of times priced on `gpu` (None: no published runs check this pricing)."""
    if gpu.layers != "te":
        return None
    g = generation(gpu.name)
    row = HELD_OUT.get(g)
    return None if row is None else Band(g, *row)


def band_note(gpu: GPU) -> str:
    """One line for a table of predicted times."""
    b = band_for(gpu)
    if b is None:
        return (
            f"time on {gpu.name} ({gpu.layers} layers) is not checked against published runs: "
            "calibrate with the study's own runs (predict --db)"
        )
    return (
        f"time: {b.text()} (median |error| of public runs each priced without its source; worst "
        f"{b.worst:.0%}); predict --db narrows it with the study's own runs"
    )


def band_json(gpu: GPU) -> dict | None:
    """The band as `predict --json` and `plan --json` give it (None: nothing checks this pricing)."""
    b = band_for(gpu)
    if b is None:
        return None
    return {
        "generation": b.generation,
        "median": b.median,
        "worst": b.worst,
        "runs": b.runs,
        "sources": b.sources,
    }

"""The report as data: what build() returns and every renderer reads."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime


@dataclass
class RunRow:
    study: str
    run_id: str
    name: str
    nodes: int | None
    gpus: int | None  # ALL GPUs of the job (encoder + LLM)
    gbs: int | None
    seq_length: int | None
    model: str | None
    layout: str  # e.g. "enc tp1 dp8 | llm tp2 ep8 dp128"
    state: str
    state_source: str  # jobs (scheduler) | derived (from iterations/events)
    iterations: int | None  # last iteration reached
    train_iters: int | None
    jobs: int  # scheduler jobs whose iterations make up the stitched curve
    window_from: int | None  # first iteration of the steady-state window
    window_n: int = 0
    t_median_ms: float | None = None
    t_mean_ms: float | None = None
    t_std_ms: float | None = None
    samples_per_s: float | None = None
    tokens_per_s: float | None = None
    samples_per_s_per_gpu: float | None = None
    tokens_per_s_per_gpu: float | None = None
    mfu: float | None = None
    mfu_note: str | None = None
    final_loss: float | None = None
    final_samples: int | None = None
    phase_share: dict[str, float] = field(default_factory=dict)  # phase -> share of the summed phase time
    phase_ms: dict[str, float] = field(default_factory=dict)  # phase -> mean ms over the window
    efficiency: float | None = None  # E(N) = P(N) / P(N0)
    speedup: float | None = None  # t(N0) / t(N)
    loss_parity_rel: float | None = None  # max relative loss difference to the baseline at equal samples
    flags: list[str] = field(default_factory=list)


@dataclass
class TriageRow:
    study: str
    run_id: str
    name: str
    job_id: str | None
    state: str
    rank: int | None
    node: int | None
    kind: str  # failed | silent | scheduler
    reason: str
    time: datetime | None
    evidence: str


@dataclass
class ParityRow:
    study: str
    run_id: str
    name: str
    nodes: int | None
    samples: list[float]
    loss: list[float | None]
    baseline_loss: list[float | None]
    max_abs_diff: float | None
    max_rel_diff: float | None


@dataclass
class StudyInfo:
    name: str
    scaling: str  # strong | weak
    baseline_nodes: int | None
    baseline_runs: list[str]
    metric: str  # what P(N) is: tokens/s/GPU or samples/s/GPU


@dataclass
class Report:
    generated_at: datetime
    studies: list[StudyInfo]
    runs: list[RunRow]
    triage: list[TriageRow]
    parity: list[ParityRow]
    curves: dict[str, list[tuple[float, float]]]  # run_id -> [(consumed samples, loss)], downsampled
    notes: list[str]
    params: dict

    def to_dict(self) -> dict:
        return asdict(self)

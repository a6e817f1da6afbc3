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
    colocated: bool = False  # every GPU ran both modules (the baseline layout)
    # among the runs of the same study and node count: P / P(best layout of that size), and why it trails
    relative_throughput: float | None = None
    layout_note: str | None = None


@dataclass
class PairRow:
    """A heterogeneous run against the colocated run of the same study, node count and global batch."""

    study: str
    nodes: int | None
    gbs: int | None
    hetero_run: str
    colocated_run: str
    hetero_ms: float | None
    colocated_ms: float | None
    time_ratio: float | None  # colocated / heterogeneous iteration time (> 1: heterogeneous is faster)
    tokens_ratio: float | None  # heterogeneous / colocated tokens/s/GPU
    loss_max_rel_diff: float | None  # at equal consumed samples
    hetero_phases: dict[str, float] = field(default_factory=dict)  # phase -> share of the step
    colocated_phases: dict[str, float] = field(default_factory=dict)
    verdict: str = ""


@dataclass
class MemoryRow:
    """The largest figures over the ranks of one module (and pipeline stage) of a run, as measured."""

    study: str
    run_id: str
    name: str
    module: str  # encoder | language
    stage: int | None
    ranks: int
    params: int
    param_bytes: int
    grad_buffer_bytes: int
    optimizer_state_bytes: int
    saved_activation_peak_bytes: int
    inflight_peak: int
    cuda_max_allocated_bytes: int | None = None


@dataclass
class PredictedRow:
    """A run's planner prediction (mimo_jobs/predict, default efficiencies) against its measured figures."""

    study: str
    run_id: str
    name: str
    gpu: str  # the accelerator it was priced on
    predicted_s: float  # seconds per iteration
    measured_s: float | None  # the steady-state median
    error: float | None  # (predicted - measured) / measured
    predicted_tokens_per_s_per_gpu: float
    measured_tokens_per_s_per_gpu: float | None
    tokens_error: float | None
    bottleneck: str
    memory: str  # the planner's verdict on the fullest rank class


@dataclass
class PredictedMemoryRow:
    """One rank class of a run: predicted bytes (weights + gradients + optimizer state + activations) against
    the largest measured total over its ranks (rank_memory: the same four facts)."""

    study: str
    run_id: str
    name: str
    rank_class: str  # encoder | llm stage N | encoder+llm stage N (colocated)
    ranks: str  # first-last global rank (LLM stages are strided)
    predicted_bytes: int
    measured_bytes: int | None
    measured_ranks: int  # ranks of the class with measured facts
    error: float | None


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
    sizes: int = 0  # node counts with data: with one, runs are layouts of one size and E(N) is not given


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
    pairs: list[PairRow] = field(default_factory=list)
    unpaired: list[str] = field(default_factory=list)  # "<study>/<run>: why it has no partner"
    memory: list[MemoryRow] = field(default_factory=list)
    rank_memory: list[dict] = field(default_factory=list)  # every rank's facts (the JSON report's)
    predicted: list[PredictedRow] = field(default_factory=list)
    predicted_memory: list[PredictedMemoryRow] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)

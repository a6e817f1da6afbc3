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
    slots_per_s: float | None = None  # gbs * seq_length slots (padding included) at the median time
    samples_per_s_per_gpu: float | None = None
    slots_per_s_per_gpu: float | None = None  # slots, as slots_per_s
    # over the window's iterations with counted tokens: sum of carried tokens / sum of their times (the
    # headline, named as the text's "tokens/s"), loss-bearing tokens the same way, the share of the gbs *
    # seq_length slots that was padding, image tokens per sample (None where the trainer did not count them)
    tokens_per_s: float | None = None
    tokens_per_s_per_gpu: float | None = None
    loss_tokens_per_s_per_gpu: float | None = None
    padded_share: float | None = None
    image_tokens_per_sample: float | None = None
    carried_tokens_per_sample: float | None = None
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
    # cost, from the elapsed times of the run's jobs that started and ended (retries and requeues included)
    gpu_hours: float | None = None
    node_hours: float | None = None
    jobs_uncosted: int = 0  # jobs still running or never started: not in the hours
    gpu_hours_per_billion_tokens: float | None = None  # over all its carried tokens
    budget_hours: float | None = None  # wall time to the report's token budget at the carried rate
    budget_gpu_hours: float | None = None
    repeat: int | None = None  # the repeat index of a point run several times
    pkg_version: str | None = None  # provenance: the mimo-jobs version and git commit that rendered the run
    git_sha: str | None = None
    # among the runs of the same study and node count: P / P(best layout of that size), and why it trails
    relative_throughput: float | None = None
    layout_note: str | None = None
    # what ran: "packaged trainer", "own command" (trainer.command) or "log" (ingested without a run.yaml)
    program: str = "packaged trainer"
    # what the run's own log says, over the steady-state window (external.py): its TFLOP/s/GPU (median), the
    # MFU that figure gives against the GPU's peak, the MoE load-balancing loss (mean) and the mean of every
    # other number its iteration lines carry
    log_tflops_per_gpu: float | None = None
    log_mfu: float | None = None
    moe_aux_loss: float | None = None
    log_extras: dict[str, float] = field(default_factory=dict)


@dataclass
class PairRow:
    """A heterogeneous run against a colocated run of the same study, node count and global batch."""

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
    best_colocated: bool = False  # the colocated run is the fastest of its study, node count and GBS
    best_hetero: bool = False  # the heterogeneous run is the fastest of its study, node count and GBS


@dataclass
class ProgramPairRow:
    """A run of its own command against a packaged-trainer run of the same study, layout and global batch."""

    study: str
    nodes: int | None
    layout: str
    gbs: int | None
    packaged_run: str
    command_run: str
    packaged_ms: float | None
    command_ms: float | None
    time_ratio: float | None  # command / packaged iteration time (> 1: the packaged trainer is faster)
    metric: str  # what the throughputs are: tokens/s/GPU when both counted them, else slots
    packaged_per_gpu: float | None
    command_per_gpu: float | None
    throughput_ratio: float | None  # command / packaged
    loss_max_rel_diff: float | None  # at equal consumed samples
    verdict: str = ""


@dataclass
class RepeatRow:
    """The runs of one layout that differ only in their repeat index (repeats.py)."""

    study: str
    nodes: int | None
    name: str  # the run name without its -r<repeat> suffix
    runs: int
    t_mean_ms: float  # mean of the runs' steady-state medians
    t_ci95_ms: float | None  # 95% half-width of that mean (Student's t)
    t_spread_ms: float  # max - min
    metric: str
    perf_mean: float | None
    perf_ci95: float | None
    perf_spread: float | None
    flags: list[str] = field(default_factory=list)


@dataclass
class MemoryRow:
    """The largest figures over the ranks of one module (and pipeline stage) of a run, as measured."""

    study: str
    run_id: str
    name: str
    module: str  # its name in the study: vision, audio, ..., llm
    stage: int | None
    ranks: int
    params: int
    param_bytes: int
    grad_buffer_bytes: int
    optimizer_state_bytes: int
    saved_activation_peak_bytes: int
    inflight_peak: int
    cuda_max_allocated_bytes: int | None = None
    # what autograd kept for this module's own forward at its peak (None: facts from before the trainer
    # measured it per module); saved_activation_peak_bytes is its ranks' (every module on a colocated one)
    module_activation_peak_bytes: int | None = None


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
    idle_fraction: float | None = None  # of the module that waits for the bottleneck (predict/steptime.py)
    # with enough measured runs in the study (predicted.CALIBRATION_RUNS), the planner with efficiencies fitted
    # on them all, and with those fitted on the other runs only (held out: predict/measured.py)
    calibrated: bool = False
    calibrated_s: float | None = None
    calibrated_error: float | None = None
    holdout_s: float | None = None
    holdout_error: float | None = None
    layers: str = "te"  # the layers it was priced for: the ones its log says it ran (predict/hardware.LAYERS)


@dataclass
class PredictedMemoryRow:
    """One rank class of a run: predicted bytes (weights + gradients + optimizer state + activations) against
    the largest measured total over its ranks (rank_memory: the same four facts)."""

    study: str
    run_id: str
    name: str
    rank_class: str  # a module's name in the study (vision, audio, llm [stage N]); vision+audio+llm [stage N]
    # for the ranks that run every module (colocated)
    ranks: str  # first-last global rank (LLM stages are strided)
    predicted_bytes: int
    measured_bytes: int | None
    measured_ranks: int  # ranks of the class with measured facts
    error: float | None
    # the activations alone: predicted (every module of the class), and the largest over its ranks of the
    # saved-activation peak each measured (a rank's, every module it runs)
    predicted_activation_bytes: int | None = None
    measured_activation_bytes: int | None = None
    activation_error: float | None = None


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
    gpu_hours: float | None = None  # summed over its runs' jobs
    node_hours: float | None = None


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
    pair_verdicts: list[str] = field(default_factory=list)  # against the fastest of the other kind
    repeats: list[RepeatRow] = field(default_factory=list)  # layouts run more than once, aggregated
    memory: list[MemoryRow] = field(default_factory=list)
    rank_memory: list[dict] = field(default_factory=list)  # every rank's facts (the JSON report's)
    predicted: list[PredictedRow] = field(default_factory=list)
    predicted_memory: list[PredictedMemoryRow] = field(default_factory=list)
    # whether the predicted times are calibrated (per study and GPU), and the runs not priced, with why
    predicted_notes: list[str] = field(default_factory=list)
    program_pairs: list[ProgramPairRow] = field(default_factory=list)  # own command vs packaged trainer
    modules: list = field(default_factory=list)  # modules.ModuleRow: each module's phases, own timers
    bounds: list = field(default_factory=list)  # modules.BoundRow: which side bounds each run's step
    # encphases.EncoderPhaseRow: each module's forward and backward, runs of several encoder modules
    encoder_phases: list = field(default_factory=list)

    def to_dict(self) -> dict:
        d = asdict(self)
        if not d["encoder_phases"]:  # a study of one encoder per run reads as it always did
            del d["encoder_phases"]
        return d

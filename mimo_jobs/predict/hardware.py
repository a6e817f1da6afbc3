"""GPU specs the planner prices a layout with (vendor datasheet figures, dense BF16, per GPU).

Sources (public datasheets): NVIDIA H100 Tensor Core GPU datasheet (SXM5: 80 GB HBM3, 3.35 TB/s, 989 TFLOP/s
dense BF16, NVLink 900 GB/s); NVIDIA GH200 Grace Hopper Superchip datasheet (96 GB HBM3, 4 TB/s, the H100's
989 TFLOP/s); NVIDIA H200 datasheet (141 GB HBM3e, 4.8 TB/s, 989 TFLOP/s, NVLink 900 GB/s);
NVIDIA DGX B200 / HGX B200 datasheet (180 GB HBM3e, 8 TB/s, 2.25 PFLOP/s dense BF16 per GPU, NVLink 5
1.8 TB/s); GB200 (a GPU of a GB200 NVL72 rack) as NVIDIA/dgxc-benchmarking states it (README.md at
6be5ea0e, "GB200 Reference Architecture": a GB200 superchip's 2 Blackwell GPUs have 16 TB/s of HBM and
3.6 TB/s of NVLink 5, so 8 TB/s and 1.8 TB/s a GPU; llama3.1/README.md: GPUs of 186 GB, BF16 peak 2,450
TFLOP/s) and the DGX GB200 user guide (docs.nvidia.com/dgx/dgxgb200-user-guide, "Hardware": racks of
72-GPU NVLink domains, compute trays of 4 GPUs); NVIDIA A100 datasheet (SXM 80 GB, 2.0 TB/s, 312 TFLOP/s,
NVLink 600 GB/s). NVLink figures are bidirectional: one direction is half. InfiniBand: one ConnectX-7 NDR
400 Gb/s port per GPU (DGX H100/H200/B200; DGX GB200 user guide, Hardware: a compute tray of 4 GPUs has 4
ConnectX-7 single-port 400G NICs), HDR 200 Gb/s per GPU on DGX A100. `cpu` is a nominal laptop-class
figure for the CPU (gloo) runs.

Per-call latencies (the time model's alpha terms, calibrated by `--db` like the efficiencies): `op_s` is one
kernel launch on a GPU (a few microseconds: NVIDIA's CUDA C++ Best Practices Guide counts kernel launch
overhead in microseconds) or one eager PyTorch operator on a CPU; `step_s` is one step of a ring
collective (NVIDIA's nccl-tests report small-message all-reduce times of tens of microseconds over a
handful of steps; gloo over a loopback TCP socket pays a system call and a wake-up per step).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import get_args

from mimo_jobs.errors import MimoJobsError
from mimo_jobs.study.spec import HardwareSpec

GIB = 1024**3
GB = 10**9


class UnknownGPU(MimoJobsError, ValueError):
    pass


class UnknownLayers(MimoJobsError, ValueError):
    pass


@dataclass(frozen=True)
class GPU:
    name: str
    memory_bytes: int
    peak_flops: float  # dense BF16 FLOP/s
    hbm_bytes_per_s: float
    nvlink_bytes_per_s: float  # one direction, per GPU
    ib_bytes_per_s: float  # one direction, per GPU
    framework_bytes: int  # CUDA context, NCCL buffers, allocator slack: not in any formula
    op_s: float = 5e-6  # one kernel launch / operator dispatch
    step_s: float = 5e-6  # one step of a ring collective, or one send
    # the layer backend its runs use (LAYERS); a CPU runs megatron-core's local layers. Whether the attention
    # keeps its s x s scores depends on trainer.attention too: model/attention.py keeps_scores
    layers: str = "te"
    # the step-time model a study prices with (cluster.hardware.time_model; estimate.py chooses); "flops" for
    # a GPU no study names (the published and measured benchmarks' current model)
    time_model: str = "flops"
    # a measured operator table (predict/optable.py) the operator model prices GEMMs and attention from;
    # the study's cluster.hardware.ops when it names one for its own GPU
    ops: object | None = None
    # GPUs one NVLink fabric joins across nodes (GB200 NVL72: the rack's 72); 0: the node's own NVLink only
    nvlink_domain: int = 0


def nvlink_reach(gpus_per_node: int, nvlink_domain: int) -> int:
    """How many consecutive GPUs a collective can span and still run over NVLink: the node's, or the whole
    NVLink domain where the GPUs have one beyond the node (GPU.nvlink_domain)."""
    return max(gpus_per_node, nvlink_domain)


GPUS: dict[str, GPU] = {
    "H100": GPU("H100", 80 * GB, 989e12, 3.35e12, 450 * GB, 50 * GB, 3 * GIB),
    "H200": GPU("H200", 141 * GB, 989e12, 4.8e12, 450 * GB, 50 * GB, 3 * GIB),
    "GH200": GPU("GH200", 96 * GB, 989e12, 4.0e12, 450 * GB, 50 * GB, 3 * GIB),
    "B200": GPU("B200", 180 * GB, 2.25e15, 8.0e12, 900 * GB, 50 * GB, 3 * GIB),
    "GB200": GPU("GB200", 186 * GB, 2.45e15, 8.0e12, 900 * GB, 50 * GB, 3 * GIB, nvlink_domain=72),
    "A100": GPU("A100", 80 * GB, 312e12, 2.0e12, 300 * GB, 25 * GB, 3 * GIB),
    "cpu": GPU("cpu", 16 * GIB, 1e11, 2e10, 1e10, 1e9, 0, op_s=2e-5, step_s=5e-5, layers="local"),
}

# The layer backends a GPU run is priced for: Transformer Engine's layers (fused attention, grouped GEMM for
# experts: what the published runs behind FITTED_EFFICIENCY used) or megatron-core's local layers (the
# trainer's choice where Transformer Engine is not installed: trainer/model/kernels.py).
LAYERS: tuple[str, ...] = get_args(HardwareSpec.model_fields["layers"].annotation)  # ("te", "local")
# The step-time model a study without cluster.hardware.time_model prices with (the spec's default)
TIME_MODEL_DEFAULT: str = HardwareSpec.model_fields["time_model"].default
LAYERS_WORDS = {"te": "Transformer Engine layers", "local": "megatron-core's local layers"}


# The GPU generation each GPU's time-model efficiencies are fitted for: the same chip with more or faster
# memory (H200, GH200 beside H100) shares its generation's fraction of peak.
GENERATION = {
    "A100": "ampere",
    "H100": "hopper",
    "H200": "hopper",
    "GH200": "hopper",
    "B200": "blackwell",
    "GB200": "blackwell",
}

# A run on megatron-core's local layers (no Transformer Engine) reaches these shares of its generation's
# fitted figures: LOCAL_COMPUTE_SHARE of the compute fraction (unfused attention that writes and reads every
# s x s score matrix, unfused norms and RoPE), and an MoE model's LLM a further LOCAL_EXPERTS_SHARE (its
# experts run one after another as megatron-core's SequentialMLP, not as one grouped GEMM). Both fitted by
# `python benchmarks/measured.py --fit` to the one-GPU runs in benchmarks/measured/local_layers.yaml (NVIDIA
# H200, torch 2.11.0+cu130, megatron-core 0.19.2, no Transformer Engine): the dense-1b run fixes the compute
# share, the 4-layer moe-8x1b run the experts share. One GPU and one run per model kind: every generation is
# priced with these shares (docs/predict.md, "Transformer Engine or local layers").
LOCAL_COMPUTE_SHARE = 0.184
LOCAL_EXPERTS_SHARE = 0.136

# (compute, network, GEMM half width) per generation: steptime.Efficiency's llm (and encoder) and network
# fractions of the peaks above and its gemm_half_width, fitted from the published bf16/fp16 runs in
# benchmarks/published/ by `python benchmarks/published.py --fit` (least squares on log error;
# docs/predict.md, "Checked against published GPU runs"). A generation missing here (the CPU) keeps
# steptime.Efficiency's defaults.
# How far the fit above holds on runs it was not fitted on, per generation: (median |error|, worst |error|,
# rows, sources) of each generation's fitted published rows priced by a fit made without their source
# (`python benchmarks/published.py --fit` prints it; band.py turns it into the band every predicted time
# carries). A generation with one source has no figure: nothing is left to hold out against.
HELD_OUT: dict[str, tuple[float, float, int, int]] = {
    "ampere": (0.186, 0.375, 44, 6),
    "blackwell": (0.511, 0.607, 6, 2),
    "hopper": (0.299, 0.732, 45, 5),
}

FITTED_EFFICIENCY: dict[str, tuple[float, float, float]] = {
    "ampere": (0.666, 0.600, 448.0),
    "blackwell": (1.000, 0.515, 3008.0),
    "hopper": (0.628, 1.000, 1024.0),
}


def generation(name: str) -> str:
    """The generation a GPU's efficiencies are fitted for (its own name when it has none listed)."""
    return GENERATION.get(name, name)


def get_gpu(name: str) -> GPU:
    for k, g in GPUS.items():
        if k.lower() == name.strip().lower():
            return g
    raise UnknownGPU(f"unknown --gpu {name!r}; known: {', '.join(GPUS)}")


def gpu_named(text: str | None) -> GPU | None:
    """The GPU a device name names ("NVIDIA H100 80GB HBM3", "h200"; GH200 before H200), None if none."""
    t = (text or "").upper()
    for key in sorted((k for k in GPUS if k != "cpu"), key=len, reverse=True):
        if key.upper() in t:
            return GPUS[key]
    return None


def layers_note(gpu: GPU) -> str:
    """What `predict` and `validate` say of the layers they priced."""
    return f"priced for {LAYERS_WORDS[gpu.layers]}"


def with_layers(gpu: GPU, layers: str | None) -> GPU:
    """`gpu` priced for the layer backend `layers` (None: as it is); the CPU stays on local layers."""
    if layers is None:
        return gpu
    key = layers.strip().lower()
    if key not in LAYERS:
        raise UnknownLayers(f"unknown layer backend {layers!r}; known: {', '.join(LAYERS)}")
    return gpu if gpu.name == "cpu" else replace(gpu, layers=key)


def study_gpu(cluster, name: str | None = None, layers: str | None = None) -> GPU:
    """The GPU a study's runs are priced on: `name` (the --gpu option) if given, else the cluster's
    `hardware.gpu` (cpu for an `accelerator: cpu` study, H100 when unset), with the cluster's
    `hardware` overrides applied to either (figures of this cluster, not the datasheet's), priced for
    `layers` (the --layers option) if given, else the cluster's `hardware.layers`; with the measured
    operator table of `hardware.ops` (read again here) unless `name` names the GPU."""
    hw = cluster.hardware
    if name:
        gpu = get_gpu(name)
    elif cluster.accelerator == "cpu":
        gpu = GPUS["cpu"]
    else:
        gpu = GPUS[hw.gpu if hw is not None else "H100"]
    gpu = with_layers(_with_figures(gpu, hw), layers)
    if not name and getattr(hw, "ops", None):  # measured on the study's own GPU, not on one --gpu names
        from mimo_jobs.study.opsfile import read_ops

        gpu = replace(gpu, ops=read_ops(hw.ops))
    return gpu


def measured_gpu(
    cluster, accelerator: str | None, named: str | None, layers: str | None = None
) -> GPU | None:
    """The GPU a run that has measured times ran on, for the report's MFU and predictions: cpu for a CPU
    run; else the GPU `named` names (the report's --gpu, or the run's start events), else its study's
    `cluster.hardware.gpu` when the study sets hardware; None when nothing says. `cluster` (None for a run
    known only from its logs) brings its `hardware` figures, as for `study_gpu`; `layers` (the backend the
    run's log says it ran, one of LAYERS) replaces the study's `hardware.layers`."""
    hw = cluster.hardware if cluster is not None else None
    if accelerator == "cpu":
        gpu = GPUS["cpu"]
    else:
        gpu = gpu_named(named) or (GPUS[hw.gpu] if hw is not None else None)
    if gpu is None:
        return None
    return with_layers(_with_figures(gpu, hw), layers if layers in LAYERS else None)


def _with_figures(gpu: GPU, hw) -> GPU:
    """`gpu` with a study's cluster.hardware figures in place of the datasheet's (a CPU's too), priced for
    its `layers` with its `time_model` (the spec's default without a hardware section)."""
    if hw is None:
        return replace(gpu, time_model=TIME_MODEL_DEFAULT)
    gpu = replace(with_layers(gpu, getattr(hw, "layers", None)), time_model=hw.time_model)
    over = {
        "memory_bytes": int(hw.memory_gib * GIB) if hw.memory_gib else None,
        "peak_flops": hw.peak_tflops * 1e12 if hw.peak_tflops else None,
        "nvlink_bytes_per_s": hw.nvlink_gbps * GB if hw.nvlink_gbps else None,
        "ib_bytes_per_s": hw.ib_gbps * GB if hw.ib_gbps else None,
    }
    return replace(gpu, **{k: v for k, v in over.items() if v is not None})

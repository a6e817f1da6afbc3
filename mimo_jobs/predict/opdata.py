"""The published figures the operator-term time model (operators.py) prices a step from, each with its
source. Per GPU: dense tensor-core peaks (bf16 and fp8; no sparsity), HBM bandwidth, the NVLink bandwidth
one GPU has in one direction, the network bandwidth per GPU across nodes, and its SM count (GEMM waves).

Sources:
  A100   NVIDIA A100 Tensor Core GPU datasheet (nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/
         nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf), SXM 80 GB column: BF16 tensor 312 TFLOP/s dense
         (624 with sparsity), HBM2e 2,039 GB/s, NVLink 600 GB/s (both directions together); no FP8. SMs:
         NVIDIA A100 Tensor Core GPU Architecture whitepaper, 108 SMs. Network: NVIDIA DGX A100 datasheet,
         8 single-port Mellanox ConnectX-6 200 Gb/s HDR InfiniBand for the compute fabric, one per GPU.
  H100   NVIDIA H100 Tensor Core GPU datasheet (resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-
         datasheet), SXM column: BF16 1,979 and FP8 3,958 TFLOP/s with sparsity (the datasheet's footnote:
         dense is one half: 989.5 and 1,979), HBM3 3.35 TB/s, NVLink 900 GB/s. SMs: NVIDIA H100 Tensor Core
         GPU Architecture whitepaper, 132 SMs on H100 SXM5. Network: NVIDIA DGX H100 datasheet, 8 x
         ConnectX-7 400 Gb/s NDR (one per GPU).
  H200   NVIDIA H200 Tensor Core GPU datasheet, SXM: the H100's tensor peaks (same Hopper die, 132 SMs),
         HBM3e 4.8 TB/s, NVLink 900 GB/s; DGX H200 datasheet: 8 x ConnectX-7 400 Gb/s.
  GH200  NVIDIA GH200 Grace Hopper Superchip datasheet: the H100's tensor peaks, HBM3 4 TB/s (96 GB),
         NVLink 900 GB/s; the network per GPU as an H100 node's (one 400 Gb/s NDR port per superchip).
  B200   NVIDIA DGX B200 datasheet / HGX B200 datasheet: 8-GPU totals with sparsity 72 PFLOP/s FP8 and
         36 PFLOP/s BF16 (dense is one half: per GPU 4.5 and 2.25 PFLOP/s), HBM3e 64 TB/s for 8 GPUs
         (8 TB/s each), NVLink 5 1.8 TB/s per GPU; DGX B200: 8 x ConnectX-7 400 Gb/s. SMs: 148 (NVIDIA
         Blackwell architecture technical brief, B200: two dies of 74 SMs enabled).
NVLink figures are both directions together; a collective's bus bandwidth is one direction, half.

The attention efficiency per generation is the fraction of the bf16 peak a fused attention kernel reaches
forward and backward together: FlashAttention-2 (Dao 2023, arXiv:2307.08691, abstract and section 4.1)
reaches 50-73% of the A100's peak, its backward at the lower end; FlashAttention-3 (Shah et al. 2024,
arXiv:2407.08608, abstract) reaches 75% forward on H100 in FP16/BF16, with the backward (2.5x the
forward's FLOPs: five matrix products against two) well below it. Both take the lower end, 0.50; Blackwell
has no figure restated here and takes Hopper's.

The GEMM tile the wave count uses: NVIDIA's "Matrix Multiplication Background User's Guide" (Deep Learning
Performance Documentation, sections "Tile Quantization" and "Wave Quantization") works its examples with
256 x 128 output tiles, one per SM at a time.
"""

from __future__ import annotations

from dataclasses import dataclass

GB = 1e9


@dataclass(frozen=True)
class OpGPU:
    """One GPU's published figures (the module docstring names each source)."""

    name: str
    bf16_flops: float  # dense tensor-core peak, FLOP/s
    fp8_flops: float  # dense FP8 tensor-core peak; the bf16 peak where the GPU has no FP8
    hbm_bytes_per_s: float
    nvlink_bytes_per_s: float  # one direction, per GPU
    net_bytes_per_s: float  # one direction, per GPU, across nodes
    sms: int
    attention_efficiency: float  # of bf16_flops, fused attention forward + backward
    has_fp8: bool = True
    # a measured operator table (optable.OpsTable): GEMMs and attention priced from it (operators.py)
    measured: object | None = None


OP_GPUS: dict[str, OpGPU] = {
    "A100": OpGPU("A100", 312e12, 312e12, 2.039e12, 300 * GB, 25 * GB, 108, 0.50, has_fp8=False),
    "H100": OpGPU("H100", 989.5e12, 1979e12, 3.35e12, 450 * GB, 50 * GB, 132, 0.50),
    "H200": OpGPU("H200", 989.5e12, 1979e12, 4.8e12, 450 * GB, 50 * GB, 132, 0.50),
    "GH200": OpGPU("GH200", 989.5e12, 1979e12, 4.0e12, 450 * GB, 50 * GB, 132, 0.50),
    "B200": OpGPU("B200", 2.25e15, 4.5e15, 8.0e12, 900 * GB, 50 * GB, 148, 0.50),
}

TILE_M, TILE_N = 256, 128  # output tile per SM (the module docstring's user's guide)

# Megatron-core's DDP bucket when the gradient reduce overlaps the backward: max(40M, 1M x DP) parameters
# (Megatron-LM megatron/training/training.py, get_model: ddp_bucket_size defaults to
# max(40000000, 1000000 * data-parallel size) under --overlap-grad-reduce)
BUCKET_PARAMS = 40_000_000
BUCKET_PARAMS_PER_DP = 1_000_000

# Transformer Engine's userbuffers (tensor-parallel communication overlap, megatron-core's tp_comm_overlap),
# the defaults of transformer_engine/pytorch/module/base.py, initialize_ub (NVIDIA/TransformerEngine):
# the all-gathers before QKV and fc1 and of the output gradient before the projection's and fc2's data
# gradient run as a "ring_exchange" on the copy engines (num_sm 1, no SM margin), the GEMM split into TP
# chunks; the reduce-scatters after the projection and fc2 run as a "pipeline" of num_splits 4 chunks whose
# kernels take num_sm 16 SMs, the GEMM launched on the rest (set_sm_margin); the backward all-gather of the
# input (for the weight gradient) and reduce-scatter of the data gradient around QKV and fc1 run "bulk"
# beside the data- and weight-gradient GEMMs on num_sm 16 SMs. NeMo's H100 presets
# (nemo/collections/llm/recipes/tp_overlap_configs/userbuffers.py, NVIDIA/NeMo at d2b21556) keep those
# methods, with 16 to 24 SMs and the margin for the pipelined reduce-scatters and 2 to 24 SMs without a
# margin for the bulk ones; operators.tp_block_overlap takes 16 for both, the pipelined GEMM on the SMs left,
# the bulk kernels' SMs taken from their GEMM only while they run.
UB_PIPELINE_SPLITS = 4
UB_COMM_SMS = 16

# Transformer Engine's FP8 cast: each GEMM input tensor (activation, and the output gradient backward) is
# read once in bf16 and written as FP8 with its transpose (Hopper's FP8 GEMMs take both operands K-major:
# TE's fused cast_transpose writes both; the amax is reduced in the same pass); weights are cast once per
# iteration (TE keeps the FP8 weights across microbatches: is_first_microbatch).
FP8_CAST_BYTES_PER_ELEMENT = 2 + 2 * 1

# The residual constants (operators.Residual: gemm, comm) per GPU generation, fitted on the published
# bf16/fp16 runs by `python benchmarks/operators.py --fit`; a generation missing here keeps the physical
# defaults (1, 1).
FITTED_RESIDUAL: dict[str, tuple[float, float]] = {
    "ampere": (0.750, 2.0),
    "blackwell": (0.325, 1.25),
    "hopper": (0.550, 1.0),
}

# How far the residuals above hold on runs they were not fitted on, per generation: (median |error|, worst
# |error|, rows, sources) of each generation's fitted published rows priced by a fit made without their
# source (`python benchmarks/operators.py --fit` prints it); band.py gives it to the times this model prices.
HELD_OUT: dict[str, tuple[float, float, int, int]] = {
    "ampere": (0.065, 0.238, 44, 6),
    "blackwell": (0.37, 0.37, 1, 1),
    "hopper": (0.236, 0.332, 51, 6),
}

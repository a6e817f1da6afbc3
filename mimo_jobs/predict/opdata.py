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
  GB200  a GPU of a GB200 NVL72 rack, as NVIDIA/dgxc-benchmarking states it at 6be5ea0e (llama3.1/README.md,
         "Peak theoretical throughput": BF16 2,450 and FP8 4,900 TFLOP/s; README.md, "GB200 Reference
         Architecture": 16 TB/s of HBM and 3.6 TB/s of NVLink 5 for a superchip's 2 GPUs, 8 and 1.8 TB/s
         each); DGX GB200 user guide (docs.nvidia.com/dgx/dgxgb200-user-guide, "Hardware"): racks of 72-GPU
         NVLink domains (nvlink_domain), compute trays of 4 GPUs with 4 ConnectX-7 single-port 400G NICs
         (400 Gb/s per GPU). SMs: the B200's 148 (the same Blackwell GPU).
NVLink figures are both directions together; a collective's bus bandwidth is one direction, half.

The core attention is priced by the kernel the run uses (operators.core_attention_s; runs.yaml's `attention`,
a study's by model/attention.py attention_kernel), ATTENTION_KERNELS:
  flash1   FlashAttention (Dao et al. 2022). FlashAttention-2 (Dao 2023, arXiv:2307.08691, abstract): the
           first FlashAttention reaches "only 25-40% of the theoretical maximum FLOPs/s" of the A100; priced
           at the lower end, 0.25 of the bf16 peak forward and backward.
  flash2   FlashAttention-2 (torch's SDPA flash backend too). On Ampere the same abstract: "50-73% of the
           theoretical maximum FLOPs/s on A100", the backward at the lower end; priced at 0.50 forward and
           backward. On Hopper the FlashAttention-3 paper's measurements below.
  cudnn    cuDNN's fused attention, what Transformer Engine runs on Hopper (NeMo, Megatron-Bridge, the
           packaged trainer's TE layers). Hopper: the FlashAttention-3 paper's measurements below; Ampere
           has no cuDNN figure restated here and takes FlashAttention-2's.
  flash3   FlashAttention-3 (Hopper only: its kernels use Hopper's asynchronous tensor-core and TMA
           instructions). The FlashAttention-3 paper's measurements below.
  unfused  the score matrix materialised (Megatron-LM's and Megatron-DeepSpeed's CoreAttention before flash
           attention, megatron-core's local DotProductAttention): two batched GEMMs (Q K^T and the
           probabilities times V, each backward two more) priced as GEMMs (operators.gemm_s), plus the s x s
           scores' element-wise passes at HBM bandwidth (UNFUSED_SCORE_BYTES).
FlashAttention-3 (Shah et al. 2024, arXiv:2407.08608), section 4.1, Figures 5 and 6: BF16 on an H100 80GB
SXM5, head dimension 128, 16k tokens a batch (batch x sequence) and hidden size 2048, sequence lengths 512 to
16k, TFLOP/s counted as the paper counts them (4 b a d s^2 forward, halved under the causal mask; backward
2.5x the forward). Forward: the head-dim-128 panel with the causal mask (the one whose standard attention
runs at 26-35 TFLOP/s; without the mask it runs at 74-139); backward: the head-dim-128 backward panel
without the causal mask (the one restated here). The values, per sequence length 512, 1k, 2k, 4k, 8k, 16k:
  forward   FlashAttention-2 191, 260, 298, 319, 333, 335; cuDNN 315, 410, 484, 518, 529, 539;
            FlashAttention-3 292, 423, 521, 579, 602, 616
  backward  FlashAttention-2 214, 260, 291, 310, 318, 322; cuDNN 305, 408, 465, 499, 518, 516;
            FlashAttention-3 316, 424, 501, 542, 559, 561
Each becomes a share of the H100 SXM's dense BF16 peak (989.5 TFLOP/s), applied to the priced GPU's own
peak, interpolated in log sequence length (the query block each rank's kernel sees) and held at the ends.
Blackwell has no figure restated here and takes Hopper's shares.

The unfused attention's score passes (UNFUSED_SCORE_BYTES, bytes per score element, forward and backward;
the GEMMs' own reads and writes of the scores are the GEMMs' HBM floor): Megatron's fused scale-mask-softmax
kernel (megatron/fused_kernels, 16-bit in and out) reads and writes each score once forward (4) and reads the
output and its gradient and writes the input gradient backward (6); attention dropout reads and writes each
probability and writes a one-byte mask forward (5), reads the gradient and the mask and writes backward (5);
megatron-core's local DotProductAttention with torch's softmax on an fp32 copy (attention_softmax_in_fp32,
fusions/fused_softmax.py forward_torch_softmax) casts to fp32 (2 + 4), masks (4 + 1 + 4), softmaxes (4 + 4)
and casts back (4 + 2) forward, 29, and the same passes backward with the softmax gradient reading two fp32
tensors, 33.
Those passes run at UNFUSED_PASS_HBM_SHARE of the HBM bandwidth, a share derived from a published kernel
measurement, not from the runs the model is checked on: the FlashAttention-3 paper's "standard attention"
(PyTorch: a batched GEMM, softmax, a batched GEMM; 16-bit, no dropout, no mask) at head dim 128 and sequence
8k on the H100 SXM5 (batch 2, 16 heads) runs 139 TFLOP/s forward and 181 backward (Figures 5 and 6, the
panels without the causal mask): 23.1 ms forward and backward together, of which the model's GEMMs at the
peaks above take 7.8 ms, leaving 21.5 GB of score passes 15.3 ms, 0.42 of 3.35 TB/s. A check on another
machine: Azure/AI-benchmarking-guide, Azure_Results/ND_H100_v5_results.md, "Flash Attention 2.0" (its
Benchmarks/FlashAttention.py runs flash-attention's benchmarks/benchmark_flash_attention.py, batch 2,
sequence 8192, head dim 128 as the table says): standard attention (PyTorch) 145.1 TFLOPS, FlashAttention-2
327.9 on an ND H100 v5, 2.26x (tests/predict/test_attention_kernels.py holds the model to it).

MoE token reordering (operators.moe_reorder_bytes): megatron-core's all-to-all token dispatcher
(NVIDIA/Megatron-LM, megatron/core/transformer/moe/token_dispatcher.py, MoEAlltoAllTokenDispatcher, as
megatron-core 0.19.2 ships it; the reorderings in megatron/core/transformer/moe/moe_utils.py) moves each MoE
layer's token rows through HBM four times besides the all-to-alls and the experts' GEMMs: dispatch_preprocess
permutes the rank's tokens into one copy per routed expert (permute: Transformer Engine's fused
moe_permute_with_probs under moe_permute_fusion, an index_select without it); with more than one local expert
dispatch_postprocess sorts the rows the all-to-all brought by local expert (sort_chunks_by_idxs) and
combine_preprocess sorts them back (MOE_SORT_PASSES); combine_postprocess unpermutes, summing each token's
copies weighted by its routing probabilities (unpermute: TE's moe_unpermute with merging_probs, fused). Each
reordering reads its input and writes its output once (the fused kernels; the unfused path's extra passes,
its separate probability multiply and zero-filled scatter-add, are not priced). The router's softmax and
top-k run on tokens x experts fp32 scores, under 1% of those rows' bytes for every model here, and are not
priced.

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
    generation: str  # the architecture the attention kernels' figures are keyed by (ATTENTION_SHARES)
    has_fp8: bool = True
    # GPUs one NVLink fabric joins across nodes (hardware.GPU.nvlink_domain); 0: the node's own NVLink only
    nvlink_domain: int = 0
    # a measured operator table (optable.OpsTable): GEMMs and attention priced from it (operators.py)
    measured: object | None = None


OP_GPUS: dict[str, OpGPU] = {
    "A100": OpGPU("A100", 312e12, 312e12, 2.039e12, 300 * GB, 25 * GB, 108, "ampere", has_fp8=False),
    "H100": OpGPU("H100", 989.5e12, 1979e12, 3.35e12, 450 * GB, 50 * GB, 132, "hopper"),
    "H200": OpGPU("H200", 989.5e12, 1979e12, 4.8e12, 450 * GB, 50 * GB, 132, "hopper"),
    "GH200": OpGPU("GH200", 989.5e12, 1979e12, 4.0e12, 450 * GB, 50 * GB, 132, "hopper"),
    "B200": OpGPU("B200", 2.25e15, 4.5e15, 8.0e12, 900 * GB, 50 * GB, 148, "blackwell"),
    "GB200": OpGPU("GB200", 2.45e15, 4.9e15, 8.0e12, 900 * GB, 50 * GB, 148, "blackwell", nvlink_domain=72),
}

TILE_M, TILE_N = 256, 128  # output tile per SM (the module docstring's user's guide)

# The all-to-all dispatcher's sorts of the received token rows by local expert: one after the dispatch
# all-to-all, one back before the combine (module docstring, "MoE token reordering")
MOE_SORT_PASSES = 2

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
    "ampere": (0.725, 1.0),
    "blackwell": (0.475, 1.0),
    "hopper": (0.600, 1.0),
}

# How far the residuals above hold on runs they were not fitted on, per generation: (median |error|, worst
# |error|, rows, sources) of each generation's fitted published rows priced by a fit made without their
# source (`python benchmarks/operators.py --fit` prints it); band.py gives it to the times this model prices.
HELD_OUT: dict[str, tuple[float, float, int, int]] = {
    "ampere": (0.1, 0.277, 44, 6),
    "blackwell": (0.614, 0.785, 6, 2),
    "hopper": (0.1, 0.278, 45, 5),
}

# The core attention kernels (module docstring) and, for the fused ones, each generation's (forward, backward)
# TFLOP/s by sequence length as measured on the GPU whose peak MEASURED_ON_PEAK gives (or a flat share of
# the peak where the source gives one figure).
ATTENTION_KERNELS: tuple[str, ...] = ("flash1", "flash2", "cudnn", "flash3", "unfused")
UNFUSED = "unfused"
ATTENTION_SEQS = (512, 1024, 2048, 4096, 8192, 16384)
_H100_PEAK = 989.5e12
_FA3_PAPER = {  # FlashAttention-3 paper, H100 SXM5 BF16, head dim 128 (module docstring)
    "flash2": ((191, 260, 298, 319, 333, 335), (214, 260, 291, 310, 318, 322)),
    "cudnn": ((315, 410, 484, 518, 529, 539), (305, 408, 465, 499, 518, 516)),
    "flash3": ((292, 423, 521, 579, 602, 616), (316, 424, 501, 542, 559, 561)),
}


def _shares(fwd_bwd: tuple[tuple, tuple], peak: float) -> tuple[tuple[float, ...], tuple[float, ...]]:
    return tuple(t * 1e12 / peak for t in fwd_bwd[0]), tuple(t * 1e12 / peak for t in fwd_bwd[1])


def _flat(share: float) -> tuple[tuple[float, ...], tuple[float, ...]]:
    return (share,) * len(ATTENTION_SEQS), (share,) * len(ATTENTION_SEQS)


_HOPPER = {k: _shares(v, _H100_PEAK) for k, v in _FA3_PAPER.items()}
# (kernel, generation) -> (forward shares, backward shares) of the bf16 peak at ATTENTION_SEQS
ATTENTION_SHARES: dict[tuple[str, str], tuple[tuple[float, ...], tuple[float, ...]]] = {
    ("flash1", "ampere"): _flat(0.25),
    ("flash2", "ampere"): _flat(0.50),
    ("cudnn", "ampere"): _flat(0.50),  # no cuDNN figure for Ampere here: FlashAttention-2's
    **{(k, "hopper"): v for k, v in _HOPPER.items()},
    **{(k, "blackwell"): v for k, v in _HOPPER.items() if k != "flash3"},  # Hopper's shares
}

# The share of the HBM bandwidth the unfused attention's score passes reach (module docstring: derived from
# the FlashAttention-3 paper's standard attention at head dim 128, sequence 8k, on an H100 SXM5)
UNFUSED_PASS_HBM_SHARE = 0.42

# Bytes per s x s score element the unfused attention's element-wise passes move (forward, backward)
UNFUSED_SCORE_BYTES = {
    "softmax_fused16": (4, 6),  # Megatron's fused scale-mask-softmax kernel, 16-bit scores
    "softmax_fp32": (29, 33),  # torch's softmax on an fp32 copy with the mask (megatron-core local layers)
    "dropout": (5, 5),  # attention dropout: the probabilities and a one-byte mask
}

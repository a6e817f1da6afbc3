"""A RunShape priced by the operator-term model (operators.py) as a steptime.StepTime, what `predict` and
`plan` print: the LLM's stages, and each encoder module's microbatch (encops.py) composed with them by
steptime.compose (the rule the FLOPs model composes by: heterogeneous modules overlapped as a pipeline,
colocated ones in turn), then every rank class's exposed DP transfers and optimizer pass.
`time_model: operators` under a study's cluster.hardware chooses it (docs/predict.md); `supports` says
which runs it prices."""

from __future__ import annotations

from dataclasses import replace

from mimo_jobs.contract.modules import LLM
from mimo_jobs.model.arch import padded_vocab
from mimo_jobs.model.attention import attention_kernel
from mimo_jobs.study.topology import module_ranges

from . import encops
from . import operators as ops
from .flops import flops_per_sample
from .hardware import GPU, GPUS, generation
from .memory import MemoryPlan, ModuleMemory
from .modmix import sample_flops_by_module
from .opdata import FITTED_RESIDUAL, OP_GPUS, UNFUSED, OpGPU
from .pipesplit import slowest_stage_layers
from .run import RunShape
from .steptime import StepTime, compose

TIME_MODELS = ("flops", "operators")  # cluster.hardware.time_model: steptime.py's, or this one


def supports(rs: RunShape, gpu: GPU) -> bool:
    """Whether the operator model prices this run: any model (text-only, or with image and audio encoder
    modules) on Transformer Engine layers of a GPU opdata.py has figures for."""
    return gpu.name in OP_GPUS and gpu.layers == "te"


def residual_for(gpu: GPU) -> ops.Residual:
    """The fitted residual of the GPU's generation (opdata.FITTED_RESIDUAL), else the physical default."""
    fitted = FITTED_RESIDUAL.get(generation(gpu.name))
    return ops.Residual() if fitted is None else ops.Residual(*fitted)


def op_gpu(gpu: GPU) -> OpGPU:
    """opdata's figures for the GPU, with the study's cluster.hardware figures where they differ from the
    datasheet's (hardware.GPUS): its bf16 peak (the FP8 peak scaled with it), NVLink and network rates."""
    base, sheet = OP_GPUS[gpu.name], GPUS[gpu.name]
    over = {}
    if gpu.peak_flops != sheet.peak_flops:
        scale = gpu.peak_flops / base.bf16_flops
        over.update(bf16_flops=gpu.peak_flops, fp8_flops=base.fp8_flops * scale)
    if gpu.hbm_bytes_per_s != sheet.hbm_bytes_per_s:
        over["hbm_bytes_per_s"] = gpu.hbm_bytes_per_s
    if gpu.nvlink_bytes_per_s != sheet.nvlink_bytes_per_s:
        over["nvlink_bytes_per_s"] = gpu.nvlink_bytes_per_s
    if gpu.ib_bytes_per_s != sheet.ib_bytes_per_s:
        over["net_bytes_per_s"] = gpu.ib_bytes_per_s
    if gpu.ops is not None:  # cluster.hardware.ops: GEMMs and attention from the device's own times
        over["measured"] = gpu.ops
    return replace(base, **over)


def _llm_rank_state(mem: MemoryPlan) -> tuple[float, float]:
    """(LLM parameters on the fullest rank, bytes the optimizer step touches there: weights, gradients, and
    the optimizer state read and written)."""
    params, touched = 0.0, 0.0
    for c in mem.classes:
        mods = [m for m in c.modules if m.module == LLM]
        p = sum(m.params for m in mods)
        if p > params:
            params = p
            touched = sum(_stepped_bytes(m) for m in mods)
    return params, touched


def _stepped_bytes(m: ModuleMemory) -> float:
    """Bytes the optimizer step reads and writes for a module on a rank: its weights, gradients and state
    (read and written); none for a frozen module (no gradient buffer: nothing to step)."""
    return m.weight_bytes + m.grad_bytes + 2 * m.optimizer_bytes if m.grad_bytes else 0.0


def attention_for(rs: RunShape, gpu: GPU) -> ops.Attention:
    """The core attention the packaged trainer runs on the GPU's layers (model/attention.py
    attention_kernel): its attention dropout is 0 (trainer/model/models.py), and megatron-core's unfused
    local attention softmaxes an fp32 copy with torch (masked_softmax_fusion off)."""
    kernel = attention_kernel(gpu.layers, rs.attention)
    return ops.Attention(kernel, dropout=False, softmax_fp32=kernel == UNFUSED)


def op_step(
    rs: RunShape, mem: MemoryPlan, gpu: GPU, res: ops.Residual, fp8: bool | None = None,
    attention: ops.Attention | None = None,
) -> ops.OpStep:  # fmt: skip
    """The operator model's iteration for the shape (its LLM; supports() says when that is all of it), its
    GEMMs at the FP8 rate where the study trains in fp8 (`rs.fp8`; `fp8` overrides it), its attention by
    the kernel the packaged trainer runs (attention_for; `attention` overrides it: a published run's own)."""
    lay, p = rs.layout, rs.preset.llm
    params, touched = _llm_rank_state(mem)
    return ops.step(
        p,
        seq=rs.seq_length,
        mbs=lay.mbs,
        microbatches=rs.microbatches,
        tp=lay.llm_tp,
        pp=lay.llm_pp,
        cp=lay.llm_cp,
        ep=lay.llm_ep,
        dp=lay.llm_dp,
        vp=rs.virtual_stages,
        layers_per_stage=slowest_stage_layers(p.num_layers, lay.llm_pp, rs.virtual_stages, rs.pipeline_split),
        sp=rs.sequence_parallel,
        recompute=rs.recompute.llm,
        fp8=rs.fp8 if fp8 is None else fp8,
        gpu=op_gpu(gpu),
        gpus_per_node=lay.gpus_per_node,
        params_per_rank=params,
        grad_reduce_bytes=rs.grad_reduce_bytes,
        distributed_optimizer=rs.distributed_optimizer or rs.fsdp,
        overlap_dp=rs.overlap_dp or rs.fsdp,
        optimizer_bytes_per_rank=touched,
        alpha_s=gpu.step_s,
        res=res,
        vocab=padded_vocab(p.vocab_size, lay.llm_tp),
        # a frozen LLM still passes the gradient down to the trained encoders' embeddings
        grads="data" if rs.frozen_llm else "all",
        tp_comm_overlap=rs.tp_comm_overlap,
        attention=attention_for(rs, gpu) if attention is None else attention,
    )


def step_time(rs: RunShape, mem: MemoryPlan, gpu: GPU, res: ops.Residual | None = None) -> StepTime:
    """op_step as the StepTime `predict` prints (parts: compute, tp (with pipeline sends), cp, ep, dp,
    optimizer; the measured table it priced from and the shapes it clamped); a model with encoder modules
    as modules_step_time composes it."""
    res = residual_for(gpu) if res is None else res
    if rs.preset.named_encoders:
        return modules_step_time(rs, mem, gpu, res)
    s = op_step(rs, mem, gpu, res)
    fl = flops_per_sample(rs.preset, rs.seq_length, 0.0)
    parts = dict(s.parts)
    dominant = max(parts, key=lambda k: parts[k])
    st = StepTime(
        s.iteration_s,
        0.0,
        s.stage_mb_s,
        parts,
        "llm",
        0.0,
        dominant,
        fl,
        0.0,
        parts["compute"],
        model="operators",
    )
    if gpu.ops is None:
        return st
    return replace(st, ops_file=gpu.ops.source, ops_clamped=tuple(sorted(s.stage.clamped, key=str)))


def modules_step_time(rs: RunShape, mem: MemoryPlan, gpu: GPU, res: ops.Residual) -> StepTime:
    """A model with encoder modules: the LLM stage's microbatch (op_step) and each module's (encops.py)
    composed by steptime.compose, then the slowest rank class's exposed DP transfers and optimizer pass
    (each module over its own DP group; a colocated rank holds every module's)."""
    lay, og = rs.layout, op_gpu(gpu)
    s = op_step(rs, mem, gpu, res)
    st = s.stage
    llm = {"compute": st.compute, "tp": st.tp + (s.stage_mb_s - st.total), "cp": st.cp, "ep": st.ep}
    encs, clamped = {}, set(st.clamped)
    for i, (name, _) in enumerate(rs.preset.named_encoders):
        t, bridge = encops.module_mb(rs, og, res, i, gpu.step_s)
        encs[name] = {"compute": t.compute, "tp": t.tp, "bridge": bridge}
        clamped |= t.clamped
    pipe = compose(
        encs,
        llm,
        rs.microbatches,
        (lay.llm_pp - 1) / rs.virtual_stages,
        lay.colocated,
        bool(lay.encoder_ranks),
    )
    dp = _worst_class(
        mem, lambda m: s.parts["dp"] if m.module == LLM else _module_dp_s(rs, og, res, m, encs, gpu.step_s)
    )
    opt = _worst_class(
        mem, lambda m: s.parts["optimizer"] if m.module == LLM else ops.bytes_s(_stepped_bytes(m), og)
    )
    parts = {k: pipe.parts.get(k, 0.0) for k in ("compute", "tp", "cp", "ep", "bridge")}
    parts |= {"dp": dp, "optimizer": opt}
    _, fl = sample_flops_by_module(rs.preset, rs.modules, rs.seq_length)
    out = StepTime(
        pipe.seconds + dp + opt,
        max((t for n, t in pipe.modules.items() if n != LLM), default=0.0),
        pipe.modules[LLM],
        parts,
        pipe.bottleneck,
        pipe.idle_fraction,
        max(parts, key=lambda k: parts[k]),
        fl,
        pipe.encoder_compute_s,
        pipe.llm_compute_s,
        modules=pipe.modules,
        model="operators",
    )
    if gpu.ops is None:
        return out
    return replace(out, ops_file=gpu.ops.source, ops_clamped=tuple(sorted(clamped, key=str)))


def _worst_class(mem: MemoryPlan, cost) -> float:
    """The most seconds any rank class spends on `cost` of the modules it holds (summed: a colocated rank
    runs every module's in turn)."""
    return max((sum(cost(m) for m in c.modules) for c in mem.classes), default=0.0)


def _module_dp_s(
    rs: RunShape, gpu: OpGPU, res: ops.Residual, m: ModuleMemory, encs: dict, alpha_s: float
) -> float:
    """An encoder module's exposed DP transfers on a rank (operators.dp_exposed_s over its own DP group of
    TP x DP consecutive ranks; a module's microbatch compute its cover); none when frozen."""
    if not m.grad_bytes:
        return 0.0
    mr = next(r for r in module_ranges(rs.layout) if r.name == m.module)
    bw = ops.link_bytes_per_s(mr.tp * mr.dp, rs.layout.gpus_per_node, gpu)
    return ops.dp_exposed_s(
        m.params * rs.grad_reduce_bytes, m.params * ops.BF16, m.params, mr.dp, bw, rs.overlap_dp or rs.fsdp,
        rs.distributed_optimizer or rs.fsdp, encs[m.module]["compute"], alpha_s, res,
    )  # fmt: skip


def ops_note(gpu: GPU, times: list[StepTime]) -> str | None:
    """What `predict` says of a measured operator table (None without one): the file and device, how many
    runs it priced, and the shapes it priced outside its range."""
    t = gpu.ops
    if t is None:
        return None
    priced = [s for s in times if s.ops_file]
    line = f"operators measured: GEMMs and attention of {len(priced)} of {len(times)} run(s) priced from {t.source} (device {t.device})"
    if len(priced) < len(times):
        line += "; the others by the FLOPs model (local layers, time_model flops or --db)"
    if "bf16" not in t.gemm_dtypes():
        line += "; the table has no bf16 GEMM rows: bf16 GEMMs at the published figures"
    clamped = sorted({c for s in priced for c in s.ops_clamped}, key=str)
    if clamped:
        shown = ", ".join(_shape_words(c) for c in clamped[:3])
        line += (
            f"; {len(clamped)} shape(s) outside the table's range, priced at the nearest measured ({shown}"
        )
        line += ", ...)" if len(clamped) > 3 else ")"
    return line


def _shape_words(c: tuple) -> str:
    """A clamped shape as operators.py records it: ("gemm", m, n, k) or ("attention", s, d, causal)."""
    if c[0] == "gemm":
        return f"GEMM m {c[1]} n {c[2]} k {c[3]}"
    return f"attention s {c[1]} d {c[2]}{' causal' if c[3] else ''}"

"""The planner's time model against published GPU training runs (benchmarks/published/runs.yaml).

python benchmarks/published.py          per row: predicted against published step time, and the error;
                                        then median and worst |error| with the default efficiencies
                                        (steptime.Efficiency, what the planner used before the fit), with the
                                        fitted ones stored in mimo_jobs/predict/hardware.py, and held out one
                                        source at a time; then the planner's peak memory where a row gives one
python benchmarks/published.py --fit    also the fresh fit per GPU generation, as hardware.py stores it

Each row is priced by the project's own time model: a text-only model description (mimo_jobs.model) on the
row's layout, through predict.estimate.predict_shape, the entry point `predict` and `plan` use. The figure
the row publishes becomes a step time (runs.yaml says how per kind); errors are predicted / published - 1.
The fit (predict/fit.py) is per GPU generation, on the bf16/fp16 rows only.
"""

from __future__ import annotations

import math
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from mimo_jobs.model.arch import LLMArch, ModelArch
from mimo_jobs.predict.estimate import predict_shape
from mimo_jobs.predict.fit import Decomposed, decompose, fit_generations
from mimo_jobs.predict.flops import flops_per_sample
from mimo_jobs.predict.hardware import GPU, GPUS, generation
from mimo_jobs.predict.opdata import ATTENTION_KERNELS, UNFUSED
from mimo_jobs.predict.operators import Attention
from mimo_jobs.predict.pipesplit import PipelineSplit
from mimo_jobs.predict.run import RunShape, on_layout
from mimo_jobs.predict.steptime import Efficiency, efficiency_for, gemm_width
from mimo_jobs.study.spec import RecomputeSpec
from mimo_jobs.study.topology import VISION, Layout, ModuleShape

DATA = Path(__file__).resolve().parent / "published" / "runs.yaml"
FIT_PRECISIONS = ("bf16", "fp16")  # what the time model describes; fp8 rows are shown, not fitted
KINDS = ("step_time_s", "tokens_per_s_per_gpu", "tokens_per_s", "tflops_per_gpu")  # runs.yaml's figure.kind
NETWORK_RATES = ("gbps_per_node", "gbps_per_gpu")  # runs.yaml's network: one of them, in Gb/s one direction


class NetworkError(ValueError):
    """A row whose cluster network is missing or malformed (runs.yaml's header: `network`)."""


@dataclass(frozen=True)
class Network:
    """The inter-node network a row's run had (runs.yaml's `network`): its rate per GPU, one direction, and
    whether its source states it (`stated`, the quote) or the DGX datasheet's default stands in (`assumed`)."""

    gbps_per_gpu: float  # Gb/s across nodes per GPU, one direction
    gpus_per_node: int
    fabric: str
    stated: str | None
    assumed: str | None

    @property
    def bytes_per_s(self) -> float:
        return self.gbps_per_gpu * 1e9 / 8


@dataclass(frozen=True)
class Row:
    id: str
    source: str
    gpu: str
    precision: str
    shape: RunShape
    published_s: float  # the published figure as a step time
    figure: dict
    peak_memory_gib: float | None
    in_fit: bool = True  # runs.yaml's `fit: false` (with not_fitted_because) keeps a row out
    # runs.yaml's `memory_not_described`: why the memory model cannot describe what the run kept (its
    # verdict is printed, not held to "fits")
    memory_not_described: str | None = None
    sweep: str | None = None  # runs.yaml's `sweep`: layouts of one model on one cluster, one source
    known_miss: str | None = None  # runs.yaml's `known_miss`: why the memory model over-prices this run
    network: Network | None = None  # runs.yaml's `network`: the cluster's inter-node rate (row_gpu)
    attention: str = "cudnn"  # runs.yaml's `attention`: the core attention kernel the run used
    # runs.yaml's `peak_not_known`: the source's words that its GPUs' peak is not the datasheet's and unknown
    peak_not_known: str | None = None

    @property
    def fitted(self) -> bool:
        """In the fit and the bf16 held-out figures: a bf16/fp16 row the source keeps in, on a GPU whose peak
        is known."""
        return self.in_fit and self.precision in FIT_PRECISIONS and self.peak_not_known is None


def row_attention(r: Row) -> Attention:
    """The core attention the operator model prices a row with: its kernel (runs.yaml's `attention`); the
    unfused rows are Megatron's, with its fused 16-bit softmax kernel and attention dropout at Megatron's
    default 0.1 (runs.yaml's header)."""
    return Attention(r.attention, dropout=r.attention == UNFUSED)


def row_gpu(r: Row) -> GPU:
    """The GPU a row is priced on: the datasheet's (hardware.GPUS) on the network its source states (runs.yaml's
    `network`); optime.op_gpu carries the rate into the operator model, as it does a study's
    cluster.hardware.ib_gbps."""
    gpu = GPUS[r.gpu]
    return gpu if r.network is None else replace(gpu, ib_bytes_per_s=r.network.bytes_per_s)


def network_of(doc: dict, r: dict, path: Path = DATA) -> Network:
    """The row's `network`, else its source's `network` for the row's GPU (runs.yaml's header); a clear
    error naming the file, row and rule when it is missing or malformed."""
    where = f"{path}: row {r.get('id')!r}"
    net = r.get("network") or doc["sources"].get(r["source"], {}).get("network", {}).get(r["gpu"])
    if net is None:
        raise NetworkError(
            f"{where}: no network: give the row a `network` or its source `{r['source']}` a `network.{r['gpu']}` "
            "(the rate its source states, or `assumed:` with the DGX datasheet's)"
        )
    rates = [k for k in NETWORK_RATES if k in net]
    rate = net[rates[0]] if len(rates) == 1 else None
    if not isinstance(rate, (int, float)) or rate <= 0:
        raise NetworkError(f"{where}: network needs exactly one positive rate of {', '.join(NETWORK_RATES)}")
    if bool(net.get("stated")) == bool(net.get("assumed")):
        raise NetworkError(f"{where}: network needs either `stated` (the source's words) or `assumed` (why)")
    gpn, gpus = int(net.get("gpus_per_node", 0)), int(r["layout"]["gpus"])
    if gpn <= 0 or gpus % gpn:
        raise NetworkError(
            f"{where}: network.gpus_per_node {gpn}: the row's {gpus} GPUs must fill whole nodes of that many"
        )
    per_gpu = float(rate) / (gpn if rates[0] == "gbps_per_node" else 1)
    return Network(per_gpu, gpn, str(net.get("fabric", "")), net.get("stated"), net.get("assumed"))


def _arch(name: str, m: dict) -> ModelArch:
    llm = LLMArch(
        num_layers=m["layers"],
        hidden_size=m["hidden"],
        num_attention_heads=m["heads"],
        ffn_hidden_size=m["ffn"],
        vocab_size=m["vocab"],
        num_query_groups=m.get("query_groups"),
        kv_channels=m.get("kv_channels"),
        activation="silu" if m.get("gated") else "gelu",
        gated_linear_unit=bool(m.get("gated")),
        num_experts=m.get("experts", 0),
        moe_router_topk=m.get("topk", 2),
        name=name,
    )
    return ModelArch(name=name, encoder=None, llm=llm)


def _colocated(tp: int, dp: int) -> tuple[ModuleShape, ...]:
    """The text-only model's placeholder module on every rank, at the LLM's TP and DP (a colocated layout)."""
    return (ModuleShape(VISION, tp, 1, dp),)


# a DGX server's GPUs, for a shape built without its row's network (which states the node, runs.yaml's header)
DGX_GPUS_PER_NODE = 8


def _layout(lay: dict, experts: int, gpus_per_node: int = DGX_GPUS_PER_NODE) -> Layout:
    return Layout(
        nodes=lay["gpus"] // gpus_per_node,
        gpus_per_node=gpus_per_node,
        encoders=_colocated(lay["tp"], lay["dp"]),
        llm_tp=lay["tp"],
        llm_pp=lay["pp"],
        llm_dp=lay["dp"],
        llm_ep=lay["ep"],
        llm_cp=lay["cp"],
        num_experts=experts,
        gbs=lay["gbs"],
        mbs=lay["mbs"],
        colocated=True,
    )


def _shape(
    arch: ModelArch, seq: int, lay: dict, precision: str, gpus_per_node: int = DGX_GPUS_PER_NODE
) -> RunShape:
    """The row as the planner's RunShape. Topology's rank_layout derives the microbatches; it refuses
    llm.pp > 1 and llm.cp > 1 on a text-only (colocated) layout of the packaged trainer, which these
    published runs had, so it is asked about the same DP and TP without them (CP splits each sequence and PP
    each sample's layers, neither the batch) and the shape then takes the published layout."""
    full = _layout(lay, arch.llm.num_experts, gpus_per_node)
    per_node = math.gcd(gpus_per_node, lay["tp"] * lay["dp"])
    flat = replace(full, llm_pp=1, llm_cp=1, gpus_per_node=per_node, nodes=lay["tp"] * lay["dp"] // per_node)
    flat = replace(flat, encoders=_colocated(flat.llm_tp, flat.llm_dp))
    base = RunShape(
        layout=flat,
        preset=arch,
        seq_length=seq,
        microbatches=0,
        bf16=precision != "fp32",
        distributed_optimizer=bool(lay["distributed_optimizer"]),
        optimizer="adam",
        encoder_inflight=1,
        recompute=RecomputeSpec(encoder="none", llm=lay["recompute"]),
        virtual_stages=lay.get("vp", 1),
        overlap_dp=bool(lay.get("overlap_dp", False)),
        sp=bool(lay.get("sequence_parallel", False)),
        tp_comm_overlap=bool(lay.get("tp_comm_overlap", False)),
        fsdp=bool(lay.get("fsdp", False)),
        grad_reduce_bytes={"fp32": 4, "bf16": 2, "fp16": 2}[lay.get("grad_reduce", "fp32")],
        pipeline_split=PipelineSplit(**lay.get("pipeline_split", {})),
        # FSDP rows are torchtitan's, whose Llama MLP is torch's silu(w1 x) * w3 x: no fused SwiGLU
        fused_swiglu=not lay.get("fsdp", False),
    )
    # on_layout takes the virtual stages from the layout it is given (the flat one has none): the row's own
    return replace(
        on_layout(base, flat), layout=replace(full, llm_vp=lay.get("vp", 1)), virtual_stages=lay.get("vp", 1)
    )


def published_step_s(figure: dict, shape: RunShape) -> float:
    """The row's figure as seconds per iteration (runs.yaml's header: one rule per kind)."""
    kind, value = figure["kind"], float(figure["value"])
    lay = shape.layout
    if kind == "step_time_s":
        return value
    if kind == "tokens_per_s_per_gpu":
        return lay.gbs * shape.seq_length / (value * lay.world)
    if kind == "tokens_per_s":
        return lay.gbs * shape.seq_length / value
    if kind == "tflops_per_gpu":
        flops = flops_per_sample(shape.preset, shape.seq_length, 0.0).llm * lay.gbs
        return flops / (value * 1e12 * lay.world)
    raise ValueError(f"{DATA}: figure.kind {kind!r} is not one of {', '.join(KINDS)}")


def load_rows(path: Path = DATA) -> tuple[dict, list[Row]]:
    doc = yaml.safe_load(path.read_text())
    archs = {name: _arch(name, m) for name, m in doc["models"].items()}
    rows = []
    for r in doc["rows"]:
        if r.get("attention") not in ATTENTION_KERNELS:
            raise ValueError(
                f"{path}: row {r.get('id')!r}: attention {r.get('attention')!r} is not one of "
                f"{', '.join(ATTENTION_KERNELS)} (runs.yaml's header says which kernel each source ran)"
            )
        arch = archs[r["model"]]
        network = network_of(doc, r, path)
        shape = _shape(arch, r["seq_length"], r["layout"], r["precision"], network.gpus_per_node)
        rows.append(
            Row(
                r["id"],
                r["source"],
                r["gpu"],
                r["precision"],
                shape,
                published_step_s(r["figure"], shape),
                r["figure"],
                r.get("peak_memory_gib"),
                r.get("fit", True),
                r.get("memory_not_described"),
                r.get("sweep"),
                r.get("known_miss"),
                network,
                r["attention"],
                r.get("peak_not_known"),
            )
        )
    return doc, rows


def decomposed(rows: list[Row]) -> list[Decomposed]:
    """Each row's predicted step time as a / compute efficiency + b / network efficiency + c."""
    return [
        decompose(
            lambda eff, r=r: predict_shape(r.shape, GPUS[r.gpu], eff).time.iteration_s,
            gemm_width(r.shape.preset.llm.hidden_size, r.shape.layout.llm_tp),
        )
        for r in rows
    ]


def predicted_s(r: Row, eff: Efficiency) -> float:
    """The planner's step time for the row (the fit works on the decomposition, the errors on this)."""
    return predict_shape(r.shape, GPUS[r.gpu], eff).time.iteration_s


def errors(rows: list[Row], effs: dict[str, Efficiency] | None) -> list[float]:
    """predicted / published - 1 per row; `effs` per generation (None: the defaults)."""
    out = []
    for r in rows:
        eff = Efficiency() if effs is None else effs.get(generation(r.gpu), Efficiency())
        out.append(predicted_s(r, eff) / r.published_s - 1)
    return out


def stored(rows: list[Row]) -> dict[str, Efficiency]:
    """The efficiencies predict and plan use now (hardware.py's fitted figures)."""
    return {generation(r.gpu): efficiency_for(GPUS[r.gpu]) for r in rows}


def fresh_fit(
    rows: list[Row], parts: list[Decomposed], wanted: tuple[str, ...] = ()
) -> dict[str, Efficiency]:
    keep = [i for i, r in enumerate(rows) if r.fitted]
    fitted = fit_generations(
        [generation(rows[i].gpu) for i in keep],
        [parts[i] for i in keep],
        [rows[i].published_s for i in keep],
        wanted,
    )
    return {g: Efficiency(encoder=c, llm=c, network=n, gemm_half_width=w) for g, (c, n, w) in fitted.items()}


def held_out(rows: list[Row], parts: list[Decomposed]) -> list[float | None]:
    """Leave one source out: refit without its rows, price them (fitted rows only; None for the others)."""
    out: list[float | None] = [None] * len(rows)
    for src in sorted({r.source for r in rows}):
        train = [i for i, r in enumerate(rows) if r.source != src]
        wanted = tuple(generation(r.gpu) for r in rows if r.source == src)
        effs = fresh_fit([rows[i] for i in train], [parts[i] for i in train], wanted)
        for i, r in enumerate(rows):
            if r.source == src and r.fitted:
                out[i] = errors([r], effs)[0]
    return out


def held_out_bands(rows: list[Row], held: list[float | None]) -> dict[str, tuple[float, float, int, int]]:
    """Per generation, as hardware.HELD_OUT stores it: (median |error|, worst |error|, rows, sources) of its
    fitted rows priced by a fit without their source."""
    out = {}
    for g in sorted({generation(r.gpu) for r in rows}):
        errs = [
            (abs(e), r.source)
            for r, e in zip(rows, held, strict=True)
            if e is not None and generation(r.gpu) == g
        ]
        if errs:
            a = [e for e, _ in errs]
            out[g] = (round(statistics.median(a), 3), round(max(a), 3), len(a), len({s for _, s in errs}))
    return out


def memory_of(r: Row) -> dict[str, float]:
    """The planner's memory for the row's fullest rank (predict/memory.py), in GiB: weights, gradients and
    optimizer state; activations; and the framework allowance (CUDA context, NCCL buffers, allocator)."""
    plan = predict_shape(r.shape, GPUS[r.gpu], Efficiency()).memory
    worst = max(plan.classes, key=lambda c: c.total_bytes)
    state = sum(m.weight_bytes + m.grad_bytes + m.optimizer_bytes for m in worst.modules)
    act = sum(m.activation_bytes + m.bridge_bytes for m in worst.modules)
    gib = 1024**3
    return {
        "total": worst.total_bytes / gib,
        "state": state / gib,
        "activations": act / gib,
        "framework": worst.framework_bytes / gib,
    }


def memory_verdict(r: Row) -> str:
    """The planner's verdict on the row's layout on its GPU: `fits, ... free` or `over by ...`."""
    return predict_shape(r.shape, GPUS[r.gpu], Efficiency()).memory.verdict()


def _stats(errs: list[float]) -> str:
    a = [abs(e) for e in errs]
    return f"median |error| {statistics.median(a):6.1%}, worst {max(a):6.1%} ({len(a)} rows)"


def row_errors(rows: list[Row], parts: list[Decomposed]) -> dict[str, list]:
    """Every row's error with the default efficiencies, with the stored fit, and held out by source."""
    return {
        "before": errors(rows, None),
        "after": errors(rows, stored(rows)),
        "held_out": held_out(rows, parts),
    }


def summary(rows: list[Row], errs: dict[str, list]) -> dict[str, list[float]]:
    """row_errors of the bf16/fp16 rows the fit uses."""
    return {k: [v[i] for i, r in enumerate(rows) if r.fitted] for k, v in errs.items()}


def summary_lines(s: dict[str, list[float]]) -> list[str]:
    """The summary as printed (docs/predict.md quotes these lines; tests/predict/test_published.py holds
    the two to each other)."""
    return [
        f"bf16/fp16 rows, default efficiencies: {_stats(s['before'])}",
        f"bf16/fp16 rows, fitted (hardware.py): {_stats(s['after'])}",
        f"bf16/fp16 rows, leave-one-source-out: {_stats(s['held_out'])}",
    ]


def ranks(xs: list[float]) -> list[float]:
    """1-based ranks, ties sharing the mean of the ranks they span (as scipy.stats.rankdata's "average")."""
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    out = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out


def spearman(xs: list[float], ys: list[float]) -> float:
    """Spearman's rank correlation: Pearson's correlation of the two rankings (ties averaged)."""
    if len(xs) != len(ys) or len(xs) < 2:
        raise ValueError(f"spearman needs two equal-length lists of at least 2, got {len(xs)} and {len(ys)}")
    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    vx = sum((a - mx) ** 2 for a in rx)
    vy = sum((b - my) ** 2 for b in ry)
    if vx == 0 or vy == 0:
        raise ValueError("spearman is undefined when every value of one list is the same")
    return cov / math.sqrt(vx * vy)


@dataclass(frozen=True)
class SweepRank:
    name: str
    rows: int
    rho: float  # Spearman between predicted and published GPU-seconds per token
    fastest_in_top2: bool  # the published fastest is among the two the planner predicts fastest
    spread: tuple[float, float]  # published slowest / fastest - 1, predicted slowest / fastest - 1


def gpu_s_per_token(r: Row, step_s: float) -> float:
    """What a layout costs per token trained: within a sweep that holds GPUs and batch fixed it ranks as the
    step time does, and it stays comparable where a sweep varies them (the planner ranks layouts by it)."""
    lay = r.shape.layout
    return step_s * lay.world / (lay.gbs * r.shape.seq_length)


def flops_price(effs: dict[str, Efficiency]) -> Callable[[Row], float]:
    """A row's step time by the FLOPs model with the per-generation efficiencies `effs`."""
    return lambda r: predicted_s(r, effs[generation(r.gpu)])


def sweep_ranks(rows: list[Row], price: Callable[[Row], float]) -> list[SweepRank]:
    """Per sweep (runs.yaml's `sweep`), how well a time model (`price`: a row's predicted step seconds)
    orders its layouts."""
    out = []
    for name in sorted({r.sweep for r in rows if r.sweep}):
        members = [r for r in rows if r.sweep == name]
        pub = [gpu_s_per_token(r, r.published_s) for r in members]
        pred = [gpu_s_per_token(r, price(r)) for r in members]
        fastest = min(range(len(pub)), key=pub.__getitem__)
        top2 = sorted(range(len(pred)), key=pred.__getitem__)[:2]
        spread = (max(pub) / min(pub) - 1, max(pred) / min(pred) - 1)
        out.append(SweepRank(name, len(members), spearman(pred, pub), fastest in top2, spread))
    return out


def sweep_lines(sweeps: list[SweepRank]) -> list[str]:
    return [
        f"sweep {s.name:34} {s.rows:2} layouts: Spearman {s.rho:+.2f}, measured fastest in predicted top 2: "
        f"{'yes' if s.fastest_in_top2 else 'no'} (spread measured {s.spread[0]:.0%}, predicted {s.spread[1]:.0%})"
        for s in sweeps
    ]


def main(argv: list[str]) -> None:
    _, rows = load_rows()
    parts = decomposed(rows)
    errs = row_errors(rows, parts)
    before, after, lo = errs["before"], errs["after"], errs["held_out"]
    print(
        f"{'row':38} {'gpu':5} {'prec':5} {'published s':>11} {'default s':>9} {'err':>7} {'fitted s':>9} {'err':>7} {'held-out':>8}"
    )
    base, effs = Efficiency(), stored(rows)
    for r, b, a, h in zip(rows, before, after, lo, strict=True):
        eff = effs[generation(r.gpu)]
        print(
            f"{r.id:38} {r.gpu:5} {r.precision:5} {r.published_s:11.3f} {predicted_s(r, base):9.3f} {b:+7.1%} "
            f"{predicted_s(r, eff):9.3f} {a:+7.1%} " + (f"{h:+8.1%}" if h is not None else f"{'(no fit)':>8}")
        )
    print()
    print("\n".join(summary_lines(summary(rows, errs))))
    for label, keep in (
        ("fp8 rows", lambda r: r.precision == "fp8"),
        ("rows kept out", lambda r: not r.in_fit),
        ("rows on GPUs of unknown peak", lambda r: r.peak_not_known is not None and r.precision != "fp8"),
    ):
        errs = [a for r, a in zip(rows, after, strict=True) if keep(r)]
        if errs:
            print(f"{label} (not fitted), fitted efficiencies: {_stats(errs)}")
    print()
    print("ranking within each measured sweep (GPU-seconds per token, fitted efficiencies):")
    print("\n".join(sweep_lines(sweep_ranks(rows, flops_price(effs)))))
    print()
    print("memory verdicts: every row ran on its GPU, so each row the memory model describes must fit")
    for r in rows:
        v = memory_verdict(r)
        note = f"  (not described: {r.memory_not_described})" if r.memory_not_described else ""
        note += f"  (known miss: {r.known_miss})" if r.known_miss else ""
        print(f"{r.id:38} {r.gpu:5} {memory_of(r)['total']:7.1f} GiB  {v}{note}")
    memory_rows = [r for r in rows if r.peak_memory_gib is not None]
    if memory_rows:
        print()
        print(
            f"{'peak memory, GiB':38} {'published':>9} {'predicted':>9} {'state':>7} {'activ.':>7} {'framework':>9}"
        )
        for r in memory_rows:
            m = memory_of(r)
            print(
                f"{r.id:38} {r.peak_memory_gib:9.1f} {m['total']:9.1f} {m['state']:7.1f} {m['activations']:7.1f} "
                f"{m['framework']:9.1f}"
            )
    if "--fit" in argv:
        print()
        print(
            "fresh fit per generation, as hardware.FITTED_EFFICIENCY stores it (compute, network, half width):"
        )
        for g, e in sorted(fresh_fit(rows, parts).items()):
            print(f'    "{g}": ({e.llm:.3f}, {e.network:.3f}, {e.gemm_half_width:.0f}.0),')
        print()
        print(
            "held out by source per generation, as hardware.HELD_OUT stores it (median, worst, rows, sources):"
        )
        for g, b in held_out_bands(rows, held_out(rows, parts)).items():
            print(f'    "{g}": {b},')


if __name__ == "__main__":
    main(sys.argv[1:])

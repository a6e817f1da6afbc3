"""Topology arithmetic for a MIMO layout: heterogeneous (encoder and LLM on their own ranks) or colocated.

Pure integers, no torch: the CLI checks every study point with it before anything is submitted, and the
trainer re-checks the same plan at start and builds its grids from it.

Rank layout: encoder ranks occupy [0, E) and LLM ranks [E, world), E = enc_tp*enc_pp*enc_dp. Inside each
module ranks are ordered tp (fastest) -> pp -> dp (slowest), matching the grids the trainer builds, so a
TP group is a run of consecutive ranks. A colocated layout runs both modules on every rank: the LLM grid
covers the world and the encoder's grid is the same ranks with the same TP and DP.
"""

from __future__ import annotations

import copy
import math
from dataclasses import asdict, dataclass, field, fields

from mimo_jobs.errors import MimoJobsError


@dataclass(frozen=True)
class Layout:
    """One study point's parallel layout (what the user asked for)."""

    nodes: int
    gpus_per_node: int
    enc_tp: int
    enc_pp: int
    enc_dp: int
    llm_tp: int
    llm_pp: int
    llm_dp: int
    llm_ep: int = 1
    llm_etp: int = 1
    llm_cp: int = 1
    num_experts: int = 0  # 0 = dense LLM
    gbs: int = 1
    mbs: int = 1
    # every rank runs both modules (the ordinary LLaVA-style layout, the baseline a heterogeneous layout is
    # measured against): the encoder takes the LLM's TP and DP on the same ranks, and there is no bridge
    colocated: bool = False
    llm_layers: int = 0  # the LLM's transformer layers (0: unknown, the pp-layers rule is skipped)
    # virtual pipeline stages per rank (Megatron-LM's interleaved 1F1B, --num-virtual-stages-per-pipeline-rank)
    llm_vp: int = 1

    @property
    def world(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def llm_offset(self) -> int:
        """The LLM's first rank: after the encoder's ranks, or 0 when both modules share every rank."""
        return 0 if self.colocated else self.enc_ranks

    @property
    def enc_ranks(self) -> int:
        return self.enc_tp * self.enc_pp * self.enc_dp

    @property
    def llm_ranks(self) -> int:
        return self.llm_tp * self.llm_cp * self.llm_pp * self.llm_dp


@dataclass(frozen=True)
class Violation:
    """A broken rule: `rule` is a stable id, `message` has the numbers, `fit` a value that would work."""

    rule: str
    message: str
    fit: str | None = None

    def __str__(self) -> str:
        return f"[{self.rule}] {self.message}" + (f"; {self.fit}" if self.fit else "")


class TopologyError(MimoJobsError, ValueError):
    def __init__(self, violations: list[Violation]):
        self.violations = violations
        super().__init__("; ".join(str(v) for v in violations))


@dataclass(frozen=True)
class RankLayout:
    """What a feasible layout implies: rank ranges, node roles, bridge fan-out, microbatches."""

    layout: Layout
    world: int
    enc_rank_start: int
    enc_rank_end: int  # exclusive
    llm_rank_start: int
    llm_rank_end: int  # exclusive
    encoder_nodes: list[int]  # node indices that host at least one encoder rank
    llm_nodes: list[int]
    shared_nodes: list[int]  # nodes hosting both (allowed; reported)
    expert_dp: int  # size of the expert-data-parallel group (0 for dense)
    num_microbatches: int
    fan: str  # "out" (enc_dp < llm_dp), "in" (enc_dp > llm_dp), "1:1", or "colocated" (no bridge)
    lanes_per_encoder: int  # LLM DP lanes served by one encoder replica (1 for fan-in / 1:1)
    encoders_per_lane: int  # encoder replicas feeding one LLM lane (1 for fan-out / 1:1)
    samples_per_encoder_microbatch: int  # samples one encoder replica embeds per LLM microbatch step
    extras: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        # one level deep by hand: dataclasses.asdict recurses into every list element (10x slower on a
        # study of thousands of runs, whose node lists are long)
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        for k, v in d.items():
            if isinstance(v, list):
                d[k] = list(v)
        d["layout"] = asdict(self.layout)
        d["extras"] = copy.deepcopy(self.extras)
        return d

    def lanes_of_encoder(self, enc_dp_rank: int) -> list[int]:
        """LLM DP lanes whose samples encoder replica `enc_dp_rank` embeds (fan-out: k lanes; fan-in: 1)."""
        if self.fan == "in":
            return [enc_dp_rank // self.encoders_per_lane]
        k = self.lanes_per_encoder
        return list(range(enc_dp_rank * k, (enc_dp_rank + 1) * k))

    def encoders_of_lane(self, llm_dp_rank: int) -> list[int]:
        """Encoder replicas that embed LLM lane `llm_dp_rank`'s samples (fan-in: k replicas; else 1)."""
        if self.fan == "in":
            k = self.encoders_per_lane
            return list(range(llm_dp_rank * k, (llm_dp_rank + 1) * k))
        return [llm_dp_rank // self.lanes_per_encoder]

    def node_of_rank(self, rank: int) -> int:
        return rank // self.layout.gpus_per_node


def _divisors(n: int) -> list[int]:
    """Divisors of n in ascending order, found up to sqrt(n) (no enumeration of every rank)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


def _nearest(candidates: list[int], target: int) -> int | None:
    return min(candidates, key=lambda c: (abs(c - target), c)) if candidates else None


def _positive(lay: Layout) -> list[Violation]:
    """`positive`: every size is an integer >= 1 (num_experts >= 0). The other rules assume it."""
    sizes = {
        "nodes": lay.nodes,
        "gpus_per_node": lay.gpus_per_node,
        "encoder.tp": lay.enc_tp,
        "encoder.pp": lay.enc_pp,
        "encoder.dp": lay.enc_dp,
        "llm.tp": lay.llm_tp,
        "llm.pp": lay.llm_pp,
        "llm.dp": lay.llm_dp,
        "llm.ep": lay.llm_ep,
        "llm.etp": lay.llm_etp,
        "llm.cp": lay.llm_cp,
        "gbs": lay.gbs,
        "mbs": lay.mbs,
    }
    bad = [k for k, x in sizes.items() if not isinstance(x, int) or x < 1]
    if bad:
        return [Violation("positive", "must be integers >= 1: " + ", ".join(f"{k}={sizes[k]}" for k in bad))]
    if lay.num_experts < 0:
        return [Violation("positive", f"num_experts={lay.num_experts} must be >= 0")]
    return []


def _tiling(lay: Layout, who: Trainer) -> list[Violation]:
    """`tiling`: encoder + LLM ranks cover the world exactly, no idle or stub rank (colocated: the LLM grid
    alone covers it, and the encoder runs on the same ranks)."""
    if lay.colocated:
        return _colocated_tiling(lay, who)
    world, gpn = lay.world, lay.gpus_per_node
    e, l_ = lay.enc_ranks, lay.llm_ranks
    if e + l_ == world:
        return []
    per_dp = lay.llm_tp * lay.llm_cp * lay.llm_pp
    rest = world - e
    if rest > 0 and rest % per_dp == 0:
        fit = f"llm.dp={rest // per_dp} fits"
    elif rest > 0:
        fit = f"no llm.dp fits: {rest} LLM GPUs is not a multiple of llm.tp*cp*pp={per_dp}"
    else:
        fit = f"the encoder alone needs {e} GPUs; use at least {math.ceil((e + per_dp) / gpn)} nodes"
    what = f"leaves {world - e - l_} GPUs unused" if e + l_ < world else f"needs {e + l_ - world} GPUs more"
    return [
        Violation(
            "tiling",
            f"encoder {lay.enc_tp}x{lay.enc_pp}x{lay.enc_dp}={e} + llm "
            f"{lay.llm_tp}x{lay.llm_cp}x{lay.llm_pp}x{lay.llm_dp}={l_} ranks {what} on "
            f"{lay.nodes}x{gpn}={world}",
            fit,
        )
    ]


def _colocated_tiling(lay: Layout, who: Trainer) -> list[Violation]:
    world, per_dp = lay.world, lay.llm_tp * lay.llm_cp * lay.llm_pp
    out = []
    if lay.llm_ranks != world:
        fit = (
            f"llm.dp={world // per_dp} fits"
            if world % per_dp == 0
            else (f"llm.tp*cp*pp={per_dp} must divide the {world} GPUs")
        )
        out.append(
            Violation(
                "tiling",
                f"colocated: llm {lay.llm_tp}x{lay.llm_cp}x{lay.llm_pp}x{lay.llm_dp}={lay.llm_ranks} ranks must be "
                f"all {lay.nodes}x{lay.gpus_per_node}={world} GPUs",
                fit,
            )
        )
    if lay.llm_pp > 1 and not who.text_only:
        out.append(
            Violation(
                "colocated",
                f"colocated: llm.pp={lay.llm_pp}, but every rank runs the encoder and hands its image "
                "embeddings to the LLM on the same rank, so there is no later pipeline stage to feed",
                "llm.pp=1 (pipeline the LLM in a heterogeneous point)",
            )
        )
    elif lay.llm_pp > 1 and who.packaged:
        out.append(
            Violation(
                "text-only-pp",
                f"llm.pp={lay.llm_pp}: the packaged trainer runs a text-only model without pipeline stages "
                "(every rank holds the whole model); a study of its own command (trainer.command, e.g. "
                "Megatron-LM's pretrain_gpt.py) may pipeline it, and predict and plan price it",
                "llm.pp=1, or trainer.command",
            )
        )
    if (lay.enc_tp, lay.enc_pp, lay.enc_dp) != (lay.llm_tp, 1, lay.llm_dp):
        out.append(
            Violation(
                "colocated",
                f"colocated: the encoder runs with the LLM's TP and DP on the same ranks, got encoder "
                f"{lay.enc_tp}x{lay.enc_pp}x{lay.enc_dp} for llm.tp={lay.llm_tp}, llm.dp={lay.llm_dp}",
                "leave encoder out of a colocated point",
            )
        )
    return out


def _tp_within_node(lay: Layout) -> list[Violation]:
    """`tp-within-node`: TP groups stay inside a node. Encoder TP blocks start at 0, LLM blocks at E."""
    gpn, out = lay.gpus_per_node, []
    for name, tp, start in (("encoder.tp", lay.enc_tp, 0), ("llm.tp", lay.llm_tp, lay.llm_offset)):
        if gpn % tp != 0 or (start % gpn) % tp != 0:
            fits = [d for d in _divisors(gpn) if (start % gpn) % d == 0]
            out.append(
                Violation(
                    "tp-within-node",
                    f"{name}={tp} makes TP groups cross node boundaries (gpus_per_node={gpn}, first rank {start})",
                    f"{name} in {fits} fits",
                )
            )
    return out


def _cp(lay: Layout, who: Trainer) -> list[Violation]:
    """`cp`: no context parallelism in the packaged trainer (the bridge scatters whole sequences); a study
    of its own command may use it (predict and plan price it as Megatron-LM runs it), `vp`: virtual
    pipeline stages need a pipeline and whole layers per virtual stage, and a command of the study's own
    (the packaged trainer's schedule is plain 1F1B)."""
    out = []
    if lay.llm_cp != 1 and who.packaged:
        out.append(
            Violation(
                "cp",
                f"llm.cp={lay.llm_cp}: the packaged trainer has no context parallelism (the bridge hands each "
                "LLM rank whole sequences); a study of its own command (trainer.command) may use it",
                "llm.cp=1",
            )
        )
    if lay.llm_vp != 1:
        if lay.llm_pp == 1:
            out.append(Violation("vp", f"llm.vp={lay.llm_vp} needs a pipeline (llm.pp > 1)", "llm.vp=1"))
        elif lay.llm_layers and lay.llm_layers % (lay.llm_pp * lay.llm_vp):
            out.append(
                Violation(
                    "vp",
                    f"llm.vp={lay.llm_vp}: {lay.llm_layers} layers do not split into llm.pp x llm.vp = "
                    f"{lay.llm_pp * lay.llm_vp} equal virtual stages",
                    f"llm.vp in {[v for v in _divisors(lay.llm_layers // lay.llm_pp) if (lay.llm_layers // lay.llm_pp) % v == 0]}"
                    if lay.llm_layers % lay.llm_pp == 0
                    else None,
                )
            )
        if who.packaged:
            out.append(
                Violation(
                    "vp",
                    f"llm.vp={lay.llm_vp}: the packaged trainer's pipeline is plain 1F1B (no virtual stages); "
                    "a study of its own command (trainer.command) may interleave",
                    "llm.vp=1",
                )
            )
    return out


def _moe(lay: Layout) -> list[Violation]:
    """`moe-experts`, `moe-expert-dp`, `moe-dense`: the expert layout divides what it splits."""
    if lay.num_experts == 0:
        if lay.llm_ep != 1 or lay.llm_etp != 1:
            return [
                Violation(
                    "moe-dense",
                    f"llm.ep={lay.llm_ep}, llm.etp={lay.llm_etp} given for a dense model (num_experts=0)",
                    "llm.ep=1 (or choose an MoE model preset)",
                )
            ]
        return []
    out, tp_dp = [], lay.llm_tp * lay.llm_dp
    if lay.num_experts % lay.llm_ep != 0:
        fits = [d for d in _divisors(lay.num_experts) if tp_dp % (d * lay.llm_etp) == 0]
        out.append(
            Violation(
                "moe-experts",
                f"num_experts={lay.num_experts} is not divisible by llm.ep={lay.llm_ep}",
                f"llm.ep in {fits} fits",
            )
        )
    if tp_dp % (lay.llm_ep * lay.llm_etp) != 0:
        out.append(
            Violation(
                "moe-expert-dp",
                f"llm.tp*llm.dp={tp_dp} is not divisible by llm.ep*llm.etp={lay.llm_ep * lay.llm_etp}",
                f"llm.ep in {[d for d in _divisors(lay.num_experts) if tp_dp % d == 0]} fits",
            )
        )
    return out


def _gbs(lay: Layout) -> list[Violation]:
    """`gbs`: the global batch splits into whole microbatches across the LLM DP lanes."""
    step = lay.mbs * lay.llm_dp
    if lay.gbs % step == 0:
        return []
    lo, hi = (lay.gbs // step) * step, (lay.gbs // step + 1) * step
    return [
        Violation(
            "gbs",
            f"gbs={lay.gbs} is not divisible by mbs*llm.dp={lay.mbs}*{lay.llm_dp}={step}",
            f"gbs={hi}" + (f" or gbs={lo}" if lo > 0 else "") + " fits",
        )
    ]


def _bridge(lay: Layout) -> list[Violation]:
    """`bridge-ratio`, `bridge-samples`: one of enc_dp, llm_dp divides the other, and each encoder replica
    embeds whole samples of every microbatch (colocated: no bridge, nothing to check)."""
    if lay.colocated:
        return []
    if lay.enc_dp % lay.llm_dp != 0 and lay.llm_dp % lay.enc_dp != 0:
        cands = _divisors(lay.llm_dp) + [lay.llm_dp * m for m in range(2, 5)]
        return [
            Violation(
                "bridge-ratio",
                f"encoder.dp={lay.enc_dp} and llm.dp={lay.llm_dp}: neither divides the other",
                f"encoder.dp={_nearest(cands, lay.enc_dp)} fits",
            )
        ]
    if (lay.mbs * lay.llm_dp) % lay.enc_dp != 0:
        need = lay.enc_dp // math.gcd(lay.enc_dp, lay.llm_dp)
        return [
            Violation(
                "bridge-samples",
                f"mbs*llm.dp={lay.mbs}*{lay.llm_dp}={lay.mbs * lay.llm_dp} samples per microbatch do not split over "
                f"encoder.dp={lay.enc_dp} replicas",
                f"mbs={need} (a multiple of {need}) fits",
            )
        ]
    return []


def _pp(lay: Layout) -> list[Violation]:
    """`pp-layers`, `encoder-pp`, `moe-pp`: LLM pipeline stages hold whole, equal shares of the layers (and,
    with experts, split them over their own DP ranks: ETP = TP); the encoder is one stage (it runs 1F1B
    against the bridge instead of a pipeline of its own)."""
    out = []
    if lay.enc_pp != 1:
        out.append(
            Violation(
                "encoder-pp",
                f"encoder.pp={lay.enc_pp}: the encoder is not pipelined (its microbatches already overlap "
                "with the LLM's through the bridge)",
                "encoder.pp=1",
            )
        )
    if lay.num_experts and lay.llm_pp > 1 and lay.llm_etp != lay.llm_tp:
        out.append(
            Violation(
                "moe-pp",
                f"llm.pp={lay.llm_pp} with experts: each stage splits its experts over its own DP ranks, so "
                f"llm.etp must equal llm.tp, got etp={lay.llm_etp}, tp={lay.llm_tp}",
                f"llm.etp={lay.llm_tp}",
            )
        )
    if lay.llm_layers and lay.llm_layers % lay.llm_pp:
        fits = [d for d in _divisors(lay.llm_layers) if d <= lay.llm_layers]
        out.append(
            Violation(
                "pp-layers",
                f"llm.pp={lay.llm_pp} stages cannot split the LLM's {lay.llm_layers} layers equally",
                f"llm.pp in {fits} fits",
            )
        )
    return out


# One function per rule id, in the order problems are reported (docs/topology.md lists them).
@dataclass(frozen=True)
class Trainer:
    """What the rules need to know of the model and of who trains it: a text-only model (no encoder, so a
    colocated layout has no image embeddings to hand a later stage) and the packaged trainer (its own
    limits: no context parallelism, no virtual stages, no pipeline for a text-only model), or a study's own
    command, whose layouts are only priced and rendered."""

    text_only: bool = False
    packaged: bool = True


PACKAGED = Trainer()
RULES = (_tiling, _tp_within_node, _cp, _moe, _pp, _gbs, _bridge)
_WHO = {_tiling, _cp}  # the rules that depend on the model and the trainer


def check(lay: Layout, who: Trainer = PACKAGED) -> list[Violation]:
    """Every topology rule at once; an empty list means feasible. `who`: the model and the trainer the
    layout is for (default: the packaged trainer, the strictest)."""
    bad_sizes = _positive(lay)
    if bad_sizes:
        return bad_sizes
    return [v for rule in RULES for v in (rule(lay, who) if rule in _WHO else rule(lay))]


def rank_layout(lay: Layout, who: Trainer = PACKAGED) -> RankLayout:
    """The plan of a feasible layout; raises TopologyError listing every broken rule."""
    violations = check(lay, who)
    if violations:
        raise TopologyError(violations)
    gpn, e = lay.gpus_per_node, lay.enc_ranks
    enc_nodes = list(range(0, -(-e // gpn)))  # nodes hosting ranks [0, e)
    llm_nodes = sorted(set(range(lay.llm_offset // gpn, lay.nodes)))
    if lay.colocated:
        fan, lpe, epl = "colocated", 1, 1
    elif lay.enc_dp == lay.llm_dp:
        fan, lpe, epl = "1:1", 1, 1
    elif lay.enc_dp < lay.llm_dp:
        fan, lpe, epl = "out", lay.llm_dp // lay.enc_dp, 1
    else:
        fan, lpe, epl = "in", 1, lay.enc_dp // lay.llm_dp
    expert_dp = lay.llm_tp * lay.llm_dp // (lay.llm_ep * lay.llm_etp) if lay.num_experts else 0
    return RankLayout(
        layout=lay,
        world=lay.world,
        enc_rank_start=0,
        enc_rank_end=e,
        llm_rank_start=lay.llm_offset,
        llm_rank_end=lay.world,
        encoder_nodes=enc_nodes,
        llm_nodes=llm_nodes,
        shared_nodes=sorted(set(enc_nodes) & set(llm_nodes)),
        expert_dp=expert_dp,
        num_microbatches=lay.gbs // (lay.mbs * lay.llm_dp),
        fan=fan,
        lanes_per_encoder=lpe,
        encoders_per_lane=epl,
        samples_per_encoder_microbatch=lay.mbs * lay.llm_dp // lay.enc_dp,
    )


def derive_llm_dp(
    nodes: int,
    gpus_per_node: int,
    enc_tp: int,
    enc_pp: int,
    enc_dp: int,
    llm_tp: int,
    llm_pp: int,
    llm_cp: int = 1,
) -> int | None:
    """The llm.dp that tiles the world exactly, or None when none does."""
    rest = nodes * gpus_per_node - enc_tp * enc_pp * enc_dp
    per = llm_tp * llm_pp * llm_cp
    if rest <= 0 or per <= 0 or rest % per:
        return None
    return rest // per

"""Topology arithmetic for a MIMO layout: heterogeneous (encoder and LLM on their own ranks) or colocated.

Pure integers, no torch: the CLI checks every study point with it before anything is submitted, and the
trainer re-checks the same plan at start and builds its grids from it.

Rank layout: the encoders' ranks come first, one module after another in the order the model names them
(module i occupies [E_0+...+E_{i-1}, E_0+...+E_i), E_i = tp*pp*dp of module i), then the LLM's ranks up to
the world. Inside each module ranks are ordered tp (fastest) -> pp -> dp (slowest), matching the grids the
trainer builds, so a TP group is a run of consecutive ranks. A colocated layout runs every module on every
rank: the LLM grid covers the world and each encoder's grid is the same ranks with the same TP and DP.
`module_ranges` is the one owner of where each module's ranks are (predict, ingest and the trainer ask it).
"""

from __future__ import annotations

import copy
import math
from dataclasses import asdict, dataclass, field, fields

from mimo_jobs.errors import MimoJobsError
from mimo_jobs.model.arch import VISION, module_name_problem  # noqa: F401 (the naming rule, for ingest)


@dataclass(frozen=True)
class ModuleShape:
    """One encoder module's sizes in a layout, under its name in the study."""

    name: str
    tp: int = 1
    pp: int = 1
    dp: int = 1

    @property
    def ranks(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def sizes(self) -> str:
        return f"{self.tp}x{self.pp}x{self.dp}"


# a record's one vision encoder, flat (to_dict writes them, from_dict reads them)
_FLAT = ("enc_tp", "enc_pp", "enc_dp")


@dataclass(frozen=True, init=False)
class Layout:
    """One study point's parallel layout (what the user asked for): the encoder modules in rank order
    (`encoders=(ModuleShape(name, tp, pp, dp), ...)`; none given: one module `vision` of 1x1x1), then the
    LLM. A record's flat enc_tp/enc_pp/enc_dp are read by from_dict alone."""

    nodes: int
    gpus_per_node: int
    encoders: tuple  # ModuleShape, ... in rank order
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

    def __init__(
        self,
        nodes: int,
        gpus_per_node: int,
        llm_tp: int = 1,
        llm_pp: int = 1,
        llm_dp: int = 1,
        llm_ep: int = 1,
        llm_etp: int = 1,
        llm_cp: int = 1,
        num_experts: int = 0,
        gbs: int = 1,
        mbs: int = 1,
        colocated: bool = False,
        llm_layers: int = 0,
        llm_vp: int = 1,
        encoders=None,
    ):
        mods = tuple(m if isinstance(m, ModuleShape) else ModuleShape(**m) for m in (encoders or ()))
        values = dict(
            nodes=nodes,
            gpus_per_node=gpus_per_node,
            encoders=mods or (ModuleShape(VISION),),
            llm_tp=llm_tp,
            llm_pp=llm_pp,
            llm_dp=llm_dp,
            llm_ep=llm_ep,
            llm_etp=llm_etp,
            llm_cp=llm_cp,
            num_experts=num_experts,
            gbs=gbs,
            mbs=mbs,
            colocated=colocated,
            llm_layers=llm_layers,
            llm_vp=llm_vp,
        )
        for k, v in values.items():
            object.__setattr__(self, k, v)

    @property
    def world(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def llm_offset(self) -> int:
        """The LLM's first rank: after every encoder's ranks, or 0 when the modules share every rank."""
        return 0 if self.colocated else self.encoder_ranks

    @property
    def encoder_ranks(self) -> int:
        """Ranks of all encoder modules together (heterogeneous: they come before the LLM's)."""
        return sum(m.ranks for m in self.encoders)

    @property
    def several(self) -> bool:
        return len(self.encoders) > 1

    @property
    def flat(self) -> bool:
        """One encoder named vision: what a study's `encoder:` form and older records (flat enc_tp/enc_pp/
        enc_dp) describe."""
        return len(self.encoders) == 1 and self.encoders[0].name == VISION

    def label(self, m: ModuleShape) -> str:
        """Where a module's sizes sit in a point: `encoder` for the one vision encoder (the study's `encoder:`
        form), else `encoders.<name>` as the study names it."""
        return "encoder" if self.flat else f"encoders.{m.name}"

    @property
    def single(self) -> ModuleShape:
        """The one encoder (for the code that runs one); several: TopologyError naming the rule."""
        return _single(self.encoders, "this part runs one encoder")

    @property
    def llm_ranks(self) -> int:
        return self.llm_tp * self.llm_cp * self.llm_pp * self.llm_dp

    def to_dict(self) -> dict:
        """As run.yaml and a checkpoint's manifest record it: one encoder named vision as the flat
        enc_tp/enc_pp/enc_dp (what every layout was before encoders had names), else `encoders`."""
        d = {"nodes": self.nodes, "gpus_per_node": self.gpus_per_node}
        if self.flat:
            m = self.encoders[0]
            d |= {"enc_tp": m.tp, "enc_pp": m.pp, "enc_dp": m.dp}
        else:
            d["encoders"] = [asdict(m) for m in self.encoders]
        return d | {
            f.name: getattr(self, f.name) for f in fields(self) if f.name not in d and f.name != "encoders"
        }

    @classmethod
    def from_dict(cls, d: dict) -> Layout:
        """A layout as to_dict records it. Migration: one vision encoder recorded flat (enc_tp/enc_pp/enc_dp:
        what run.yaml and a manifest keep for it, as every record did before encoders had names) becomes
        its module here, the one reader of those keys."""
        d = dict(d)
        flat = {k: d.pop(k) for k in _FLAT if k in d}
        if flat:
            m = _single(
                tuple(e if isinstance(e, ModuleShape) else ModuleShape(**e) for e in d.get("encoders") or ())
                or (ModuleShape(VISION),),
                "enc_tp/enc_pp/enc_dp",
            )
            d["encoders"] = (
                ModuleShape(
                    m.name, flat.get("enc_tp", m.tp), flat.get("enc_pp", m.pp), flat.get("enc_dp", m.dp)
                ),
            )
        return cls(**d)


def _single(mods: tuple, why: str) -> ModuleShape:
    if len(mods) != 1:
        raise TopologyError(
            [
                Violation(
                    "encoders",
                    f"{len(mods)} encoders ({', '.join(m.name for m in mods)}): {why}; what handles several "
                    "reads each module (Layout.encoders, module_ranges)",
                )
            ]
        )
    return mods[0]


@dataclass(frozen=True)
class ModuleRanks:
    """Where one encoder module's ranks are and how it meets the LLM across the bridge."""

    name: str
    tp: int
    pp: int
    dp: int
    rank_start: int
    rank_end: int  # exclusive
    fan: str  # "out" (dp < llm dp), "in" (dp > llm dp), "1:1", or "colocated" (no bridge)
    lanes_per_encoder: int  # LLM DP lanes served by one replica of this module (1 for fan-in / 1:1)
    encoders_per_lane: int  # replicas of this module feeding one LLM lane (1 for fan-out / 1:1)
    samples_per_encoder_microbatch: int  # samples one replica embeds per LLM microbatch step


def fan_of(enc_dp: int, llm_dp: int, colocated: bool) -> tuple[str, int, int]:
    """(fan, lanes per encoder replica, encoder replicas per lane) of one module against the LLM's DP."""
    if colocated:
        return "colocated", 1, 1
    if enc_dp == llm_dp:
        return "1:1", 1, 1
    if enc_dp < llm_dp:
        return "out", llm_dp // enc_dp, 1
    return "in", 1, enc_dp // llm_dp


def module_ranges(lay: Layout) -> tuple[ModuleRanks, ...]:
    """Every encoder module's ranks, in rank order (colocated: every module on every rank), and its fan."""
    out, start = [], 0
    for m in lay.encoders:
        end = lay.world if lay.colocated else start + m.ranks
        fan, lpe, epl = fan_of(m.dp, lay.llm_dp, lay.colocated)
        spm = lay.mbs * lay.llm_dp // m.dp if m.dp else 0
        out.append(
            ModuleRanks(m.name, m.tp, m.pp, m.dp, 0 if lay.colocated else start, end, fan, lpe, epl, spm)
        )
        start = 0 if lay.colocated else end
    return tuple(out)


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
    enc_rank_start: int  # the encoders' ranks, all modules together
    enc_rank_end: int  # exclusive
    llm_rank_start: int
    llm_rank_end: int  # exclusive
    encoder_nodes: list[int]  # node indices that host at least one encoder rank
    llm_nodes: list[int]
    shared_nodes: list[int]  # nodes hosting both (allowed; reported)
    expert_dp: int  # size of the expert-data-parallel group (0 for dense)
    num_microbatches: int
    # "out" (enc_dp < llm_dp), "in" (enc_dp > llm_dp), "1:1", "colocated" (no bridge), or "modules" (several
    # encoders: each has its own, in `encoders`, and the three counts below are 0)
    fan: str
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
        d["layout"] = self.layout.to_dict()
        d["extras"] = copy.deepcopy(self.extras)
        if self.layout.several:
            d["encoders"] = [asdict(m) for m in self.encoders]
        return d

    @property
    def encoders(self) -> tuple[ModuleRanks, ...]:
        """Each encoder module's ranks and fan (topology.module_ranges)."""
        return module_ranges(self.layout)

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
        **{f"{lay.label(m)}.{a}": getattr(m, a) for m in lay.encoders for a in ("tp", "pp", "dp")},
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
    e, l_ = lay.encoder_ranks, lay.llm_ranks
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
            f"{_encoders_text(lay)} + llm "
            f"{lay.llm_tp}x{lay.llm_cp}x{lay.llm_pp}x{lay.llm_dp}={l_} ranks {what} on "
            f"{lay.nodes}x{gpn}={world}",
            fit,
        )
    ]


def _encoders_text(lay: Layout) -> str:
    """The encoders' sizes as a message gives them: `encoder 1x1x8=8`, or `encoders vision 1x1x4=4 + audio
    1x1x2=2`."""
    if not lay.several:
        m = lay.encoders[0]
        return f"encoder {m.sizes}={m.ranks}"
    return "encoders " + " + ".join(f"{m.name} {m.sizes}={m.ranks}" for m in lay.encoders)


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
    for m in lay.encoders:
        if (m.tp, m.pp, m.dp) != (lay.llm_tp, 1, lay.llm_dp):
            what = lay.label(m)
            out.append(
                Violation(
                    "colocated",
                    f"colocated: the encoder runs with the LLM's TP and DP on the same ranks, got {what} "
                    f"{m.sizes} for llm.tp={lay.llm_tp}, llm.dp={lay.llm_dp}",
                    f"leave {what.split('.')[0]} out of a colocated point",
                )
            )
    return out


def _tp_within_node(lay: Layout) -> list[Violation]:
    """`tp-within-node`: TP groups stay inside a node. Each encoder's TP blocks start at its first rank, the
    LLM's at the encoders' end."""
    gpn, out = lay.gpus_per_node, []
    mods = [(f"{lay.label(m)}.tp", m.tp, r.rank_start) for m, r in zip(lay.encoders, module_ranges(lay))]
    for name, tp, start in (*mods, ("llm.tp", lay.llm_tp, lay.llm_offset)):
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
    layers = lay.llm_layers + who.split_layers if lay.llm_layers else 0  # what megatron-core splits
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
        elif layers and layers % (lay.llm_pp * lay.llm_vp):
            out.append(
                Violation(
                    "vp",
                    f"llm.vp={lay.llm_vp}: {layers} layers do not split into llm.pp x llm.vp = "
                    f"{lay.llm_pp * lay.llm_vp} equal virtual stages",
                    f"llm.vp in {[v for v in _divisors(layers // lay.llm_pp) if (layers // lay.llm_pp) % v == 0]}"
                    if layers % lay.llm_pp == 0
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
    """`bridge-ratio`, `bridge-samples`: for each encoder, one of its dp and llm_dp divides the other, and
    each of its replicas embeds whole samples of every microbatch (colocated: no bridge, nothing to check)."""
    if lay.colocated:
        return []
    out = []
    for m in lay.encoders:
        dp = f"{lay.label(m)}.dp"
        if m.dp % lay.llm_dp != 0 and lay.llm_dp % m.dp != 0:
            cands = _divisors(lay.llm_dp) + [lay.llm_dp * k for k in range(2, 5)]
            out.append(
                Violation(
                    "bridge-ratio",
                    f"{dp}={m.dp} and llm.dp={lay.llm_dp}: neither divides the other",
                    f"{dp}={_nearest(cands, m.dp)} fits",
                )
            )
        elif (lay.mbs * lay.llm_dp) % m.dp != 0:
            need = m.dp // math.gcd(m.dp, lay.llm_dp)
            out.append(
                Violation(
                    "bridge-samples",
                    f"mbs*llm.dp={lay.mbs}*{lay.llm_dp}={lay.mbs * lay.llm_dp} samples per microbatch do not "
                    f"split over {dp}={m.dp} replicas",
                    f"mbs={need} (a multiple of {need}) fits",
                )
            )
    return out


def _encoder_pp(lay: Layout) -> list[Violation]:
    """`encoder-pp`: the encoder is one stage (it runs 1F1B against the bridge instead of a pipeline of its
    own)."""
    out = []
    for m in lay.encoders:
        if m.pp != 1:
            pp = f"{lay.label(m)}.pp"
            out.append(
                Violation(
                    "encoder-pp",
                    f"{pp}={m.pp}: the encoder is not pipelined (its microbatches already overlap "
                    "with the LLM's through the bridge)",
                    f"{pp}=1",
                )
            )
    return out


def _llm_pp(lay: Layout, who: Trainer) -> list[Violation]:
    """`moe-pp`, `pp-layers`: LLM pipeline stages hold whole, equal shares of the layers (and, with experts,
    split them over their own DP ranks: ETP = TP)."""
    out = []
    if lay.num_experts and lay.llm_pp > 1 and lay.llm_etp != lay.llm_tp:
        out.append(
            Violation(
                "moe-pp",
                f"llm.pp={lay.llm_pp} with experts: each stage splits its experts over its own DP ranks, so "
                f"llm.etp must equal llm.tp, got etp={lay.llm_etp}, tp={lay.llm_tp}",
                f"llm.etp={lay.llm_tp}",
            )
        )
    layers = lay.llm_layers + who.split_layers if lay.llm_layers else 0
    if layers and layers % lay.llm_pp:
        fits = [d for d in _divisors(layers) if d <= layers]
        counted = f" (with the {who.split_layers} the split counts as layers)" if who.split_layers else ""
        out.append(
            Violation(
                "pp-layers",
                f"llm.pp={lay.llm_pp} stages cannot split the LLM's {layers} layers{counted} equally",
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
    # layers megatron-core adds to the pipeline split where a study's own command counts the embedding and
    # the loss as layers (trainer.account_for_embedding/loss_in_pipeline_split; predict/pipesplit.py holds
    # the split): pp (x vp) must divide llm_layers + these
    split_layers: int = 0


PACKAGED = Trainer()
RULES = (_tiling, _tp_within_node, _cp, _moe, _encoder_pp, _llm_pp, _gbs, _bridge)
_WHO = {_tiling, _cp, _llm_pp}  # the rules that depend on the model and the trainer
# The rules that read only the LLM's sizes, its layers and the batch (not the encoders, not where any rank
# sits): a layout that breaks one breaks it whatever its encoders are.
LLM_RULES = (_cp, _moe, _llm_pp, _gbs)


def check(lay: Layout, who: Trainer = PACKAGED) -> list[Violation]:
    """Every topology rule at once; an empty list means feasible. `who`: the model and the trainer the
    layout is for (default: the packaged trainer, the strictest)."""
    bad_sizes = _positive(lay)
    if bad_sizes:
        return bad_sizes
    return [v for rule in RULES for v in (rule(lay, who) if rule in _WHO else rule(lay))]


def llm_check(lay: Layout, who: Trainer = PACKAGED) -> list[Violation]:
    """The violations of LLM_RULES alone: for a layout of sizes >= 1, a part of what `check` reports, the
    same for every layout with these LLM sizes and this batch (plan asks once per LLM shape, not once per
    encoder split)."""
    return [v for rule in LLM_RULES for v in (rule(lay, who) if rule in _WHO else rule(lay))]


def rank_layout(lay: Layout, who: Trainer = PACKAGED) -> RankLayout:
    """The plan of a feasible layout; raises TopologyError listing every broken rule."""
    violations = check(lay, who)
    if violations:
        raise TopologyError(violations)
    gpn = lay.gpus_per_node
    e = lay.world if lay.colocated else lay.encoder_ranks  # colocated: every module on every rank
    enc_nodes = list(range(0, -(-e // gpn)))  # nodes hosting ranks [0, e)
    llm_nodes = sorted(set(range(lay.llm_offset // gpn, lay.nodes)))
    if lay.several and not lay.colocated:
        # each module meets the LLM on its own terms (RankLayout.encoders); no one fan describes them all
        fan, lpe, epl, spm = "modules", 0, 0, 0
    else:
        one = module_ranges(lay)[0]  # colocated: every module alike
        fan, lpe, epl, spm = (
            one.fan,
            one.lanes_per_encoder,
            one.encoders_per_lane,
            one.samples_per_encoder_microbatch,
        )
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
        samples_per_encoder_microbatch=spm,
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
    """The llm.dp that tiles the world exactly, or None when none does (several encoders:
    derive_llm_dp_after)."""
    return derive_llm_dp_after(nodes, gpus_per_node, enc_tp * enc_pp * enc_dp, llm_tp, llm_pp, llm_cp)


def derive_llm_dp_after(
    nodes: int, gpus_per_node: int, encoder_ranks: int, llm_tp: int, llm_pp: int, llm_cp: int = 1
) -> int | None:
    """The llm.dp that tiles the world left after `encoder_ranks` (every encoder's ranks together), or None."""
    rest = nodes * gpus_per_node - encoder_ranks
    per = llm_tp * llm_pp * llm_cp
    if rest <= 0 or per <= 0 or rest % per:
        return None
    return rest // per

"""The verdicts that rest on an assumed image mix (pure): a plan's top layouts priced again at the prior's
low and high ends (modmix.ModuleMix.ends, prior.py), and whether the best of them changes from one end to
the other: colocated against heterogeneous, or a different encoder share. A cheap re-pricing of the
candidates the plan already ranked, not a new search; `plan` prints the answer (planning.py)."""

from __future__ import annotations

from dataclasses import dataclass

from mimo_jobs.study.topology import Layout

from .hardware import GPU
from .layouts import Candidate, free_bytes, price_with_savers, ranked
from .run import RunShape
from .steptime import Efficiency

ENDS = ("low", "high")


def range_words(span: tuple[float, float]) -> str:
    """An assumed mix's range as `predict` and `plan` print it."""
    lo, hi = span
    if round(lo) == round(hi):
        return f"{lo:.0f} image tokens a sample at both ends of its range"
    return f"range {lo:.0f} to {hi:.0f} image tokens a sample"


def verdict(c: Candidate | None) -> str:
    """What a best layout says: "colocated", "heterogeneous (vision 2 nodes)" (each encoder module's share
    under its name), or "nothing fits"."""
    if c is None:
        return "nothing fits"
    lay = c.layout
    if lay.colocated:
        return "colocated"
    gpn = lay.gpus_per_node
    shares = []
    for m in lay.encoders:
        n, what = (m.ranks // gpn, "node") if m.ranks % gpn == 0 else (m.ranks, "GPU")
        shares.append(f"{m.name} {n} {what}{'s' if n != 1 else ''}")
    return f"heterogeneous ({', '.join(shares)})"


@dataclass(frozen=True)
class EndVerdict:
    end: str  # low | high
    image_tokens: float  # mean image tokens per sample (per row when packed) at this end
    best: Candidate | None  # the fastest of the re-priced layouts that fits

    @property
    def words(self) -> str:
        return verdict(self.best)


@dataclass(frozen=True)
class EndsVerdict:
    low: EndVerdict
    high: EndVerdict

    @property
    def flips(self) -> bool:
        return self.low.words != self.high.words

    def line(self, measure: str) -> str:
        """The one-line warning `plan` prints when the verdict flips within the prior's range."""
        return (
            f"assumed image mix: {self.low.words} best at the low end ({self.low.image_tokens:.0f} image "
            f"tokens a sample), {self.high.words} at the high end ({self.high.image_tokens:.0f}): measure "
            f"with {measure}"
        )


def end_verdict(
    shape: RunShape, end: str, layouts: list[Layout], gpu: GPU, eff: Efficiency, headroom: int
) -> EndVerdict:
    rs = shape.at_end(ENDS.index(end))
    cands = [Candidate(lay, price_with_savers(rs, lay, gpu, eff, headroom)) for lay in layouts]
    fit = ranked([c for c in cands if free_bytes(c.prediction) >= headroom])
    return EndVerdict(end, rs.image_tokens_mean, fit[0] if fit else None)


def ends_verdict(
    shape: RunShape, layouts: list[Layout], gpu: GPU, eff: Efficiency, headroom: int = 0
) -> EndsVerdict | None:
    """The best of `layouts` (a plan's top candidates) at each end of the assumed mix; None when the image
    mix was not assumed (statistics or the mock provider priced it) or there is nothing to compare."""
    if not shape.image_assumed or shape.preset.text_only or not layouts:
        return None
    low, high = (end_verdict(shape, e, list(dict.fromkeys(layouts)), gpu, eff, headroom) for e in ENDS)
    return EndsVerdict(low, high)

"""Number formatting shared by the renderers (one place, so table/md/html agree), and how each text format
carries text it did not write (names, flags, log excerpts) without that text acting in it."""

from __future__ import annotations

import re
from html import escape

from mimo_jobs.textsafe import visible

from .model import ParityRow, Report, RunRow

# A spreadsheet reads a cell starting with one of these as a formula (OWASP, "CSV Injection").
_FORMULA_LEAD = ("=", "+", "-", "@", "\t", "\r")
# Text that is a plain number, or the "none" placeholder, is no formula however it starts.
_NUMBER = re.compile(r"-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?|-")


def csv_cell(v):
    """A CSV cell that a spreadsheet shows as the text it is: text starting with a formula character gets a
    leading single quote (OWASP's rule). Numbers stay numbers: only text is ever prefixed."""
    if isinstance(v, str) and v.startswith(_FORMULA_LEAD) and not _NUMBER.fullmatch(v):
        return "'" + v
    return v


# Markdown punctuation that can start emphasis, code, a link, a table cell or strike-through inline, and
# the characters of HTML (GitHub renders inline HTML): all literal once escaped.
_MD = str.maketrans({**{c: "\\" + c for c in "\\`*_[]|~"}, "<": "&lt;", ">": "&gt;", "&": "&amp;"})


def md_text(s: str) -> str:
    """`s` as literal markdown text inside a line or a table cell: visible (no control characters, so no
    line break either), with every markup character escaped."""
    return visible(s).translate(_MD)


def html_text(s: str) -> str:
    """`s` as literal HTML text or attribute value: visible, then escaped."""
    return escape(visible(s))


def num(x: float | int | None, digits: int = 1) -> str:
    if x is None:
        return "-"
    if isinstance(x, int):
        return f"{x:,}"
    if x != x:  # nan
        return "nan"
    if abs(x) >= 1e6:
        return f"{x:,.0f}"
    return f"{x:,.{digits}f}"


def pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def loss(x: float | None) -> str:
    return "-" if x is None else f"{x:.4f}"


def iters(r: RunRow) -> str:
    if r.iterations is None:
        return "-"
    return f"{r.iterations}/{r.train_iters}" if r.train_iters else str(r.iterations)


RUN_HEADERS = [
    "study",
    "run",
    "nodes",
    "GPUs",
    "state",
    "iter",
    "t med (ms)",
    "t mean",
    "t std",
    "samples/s",
    "tokens/s",  # carried (TOKENS_NOTE): the headline
    "tokens/s/GPU*",
    "loss tok/s/GPU",
    "padded",
    "slots/s/GPU",
    "MFU",
    "E(N)",
    "final loss",
    "flags",
]


# Under the runs table: what its token columns count (docs/ingest-and-report.md compares them with Megatron's).
TOKENS_NOTE = (
    "tokens = carried tokens: the positions each sample fills (text and image placeholders, not padding), "
    "summed over the steady window and divided by its time; loss tok = the loss-bearing ones; padded = the "
    "share of the gbs x seq_length slots left as padding; slots/s = gbs x seq_length / median time"
)


def names_repeat(runs: list[RunRow]) -> bool:
    """Whether two runs of one study share a name (runs known from their logs keep a file's name): the runs
    table then says each run's id."""
    names = [(r.study, r.name) for r in runs]
    return len(set(names)) < len(names)


def run_headers(with_id: bool = False) -> list[str]:
    """RUN_HEADERS, with a "run id" column after the run's name when names repeat."""
    return RUN_HEADERS[:2] + ["run id"] + RUN_HEADERS[2:] if with_id else list(RUN_HEADERS)


def run_cells(r: RunRow, with_id: bool = False) -> list[str]:
    return [
        r.study,
        r.name,
        *([r.run_id] if with_id else []),
        num(r.nodes),
        num(r.gpus),
        r.state,
        iters(r),
        num(r.t_median_ms),
        num(r.t_mean_ms),
        num(r.t_std_ms),
        num(r.samples_per_s, 2),
        num(r.tokens_per_s, 0),
        num(r.tokens_per_s_per_gpu, 1),
        num(r.loss_tokens_per_s_per_gpu, 1),
        pct(r.padded_share),
        num(r.slots_per_s_per_gpu, 1),
        pct(r.mfu),
        "-" if r.efficiency is None else f"{r.efficiency:.3f}",
        loss(r.final_loss),
        "; ".join(r.flags),
    ]


def parity_cells(p: ParityRow, abs_diff: bool = True) -> list[str]:
    """A loss-parity row: run, nodes, samples, loss, baseline loss, [max |diff|,] max rel diff."""
    cells = [
        p.name,
        num(p.nodes),
        ", ".join(num(s, 0) for s in p.samples),
        ", ".join(loss(x) for x in p.loss),
        ", ".join(loss(x) for x in p.baseline_loss),
    ]
    return cells + ([loss(p.max_abs_diff)] if abs_diff else []) + [pct(p.max_rel_diff)]


def phase_names(report: Report) -> list[str]:
    seen: list[str] = []
    for r in report.runs:
        for p in r.phase_share:
            if p not in seen:
                seen.append(p)
    return seen


# What P(N), the throughput a study's runs are compared by, can be: the first every run with data has.
# "tokens" are the carried tokens (the headline); "slots" count gbs x seq_length, padding included
METRICS = ("tokens/s/GPU", "slots/s/GPU", "samples/s/GPU")
_METRIC_FIELD = dict(zip(METRICS, ("tokens_per_s_per_gpu", "slots_per_s_per_gpu", "samples_per_s_per_gpu")))


def metric_of(runs: list[RunRow]) -> str:
    """The study's P(N): (carried) tokens/s/GPU when every run with data has them counted, else slots, else samples."""
    for m in METRICS[:-1]:
        if runs and all(per_gpu(r, m) is not None for r in runs):
            return m
    return METRICS[-1]


def per_gpu(r: RunRow, metric: str) -> float | None:
    """The run's value of the metric `metric` (one of METRICS)."""
    return getattr(r, _METRIC_FIELD[metric])


def phase_rows(report: Report, names: list[str]) -> list[list[str]]:
    """The phase-share table's rows (study, run, a share per phase), shared by every rendering: equal run
    names of two studies are told apart by the study column."""
    return [
        [r.study, r.name, *[pct(r.phase_share.get(p)) for p in names]] for r in report.runs if r.phase_share
    ]


def study_line(s) -> str:
    """What follows a study's name: how its runs are compared (a scaling curve, or layouts of one size)."""
    if s.sizes == 1:
        return (
            f": one node count ({s.baseline_nodes}): its runs are layouts of one size, compared by {s.metric} "
            "relative to the best layout (no scaling efficiency)"
        )
    return (
        f": {s.scaling} scaling, baseline N0={s.baseline_nodes} nodes, P(N) = {s.metric}, E(N) = P(N)/P(N0)"
    )

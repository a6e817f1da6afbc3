"""A run's own training command (`trainer.command`, or `command` on a matrix point): a Jinja template of the
run's values, rendered into the words launch.sh hands to torchrun on every node.

Every value substituted is shell-quoted (Jinja's `finalize`), so a path with quotes, `$(...)` or a newline
stays one inert word; the template's own text is the user's shell words, trusted like `cluster.setup`, but
it must be one simple command: an unquoted `;`, `|`, `&`, redirection or subshell would cut the torchrun
line or redirect torchrun itself, so it is refused. Unknown names are errors (StrictUndefined), never empty.
"""

from __future__ import annotations

import shlex
from typing import Any

import jinja2
import jinja2.sandbox

from mimo_jobs.contract.rundir import RunDir
from mimo_jobs.study.diagnose import Problem
from mimo_jobs.study.runspec import RunSpec

# shlex's punctuation_chars: a token made only of these is a shell control operator or redirection.
_OPERATOR_CHARS = set("();<>|&")


def _finalize(value: Any) -> str:
    # Every expression's output is one shell word, whatever it holds.
    return shlex.quote(str(value))


_ENV = jinja2.sandbox.SandboxedEnvironment(
    undefined=jinja2.StrictUndefined, autoescape=False, finalize=_finalize, keep_trailing_newline=False
)


def command_of(spec: RunSpec) -> str | None:
    """The run's command template: the point's own, else the study's `trainer.command`; None runs the
    packaged trainer."""
    return spec.point.command or spec.trainer.command


def values(spec: RunSpec, rd: RunDir) -> dict[str, Any]:
    """The names a command template may use (a name whose value is unset, e.g. train_iters of a run given
    train_samples, is left out so using it is an error that names it)."""
    lay, t = spec.layout, spec.trainer
    out: dict[str, Any] = {
        "study": spec.study,
        "run_name": spec.name,
        "run_id": spec.run_id,
        "run_dir": str(rd.root),
        "checkpoint_dir": str(rd.checkpoint_dir(t.checkpoint_dir)),
        "nodes": lay.nodes,
        "gpus_per_node": lay.gpus_per_node,
        "world": lay.nodes * lay.gpus_per_node,
        "gbs": lay.gbs,
        "mbs": lay.mbs,
        "seq_length": t.seq_length,
        "seed": t.seed,
        "python": spec.cluster.python,
        "colocated": "true" if lay.colocated else "false",
        # Jinja reads `llm.tp` as llm["tp"] when the attribute is missing
        "encoder": {"tp": lay.enc_tp, "pp": lay.enc_pp, "dp": lay.enc_dp},
        "llm": {
            "tp": lay.llm_tp,
            "pp": lay.llm_pp,
            "ep": lay.llm_ep,
            "etp": lay.llm_etp,
            "cp": lay.llm_cp,
            "dp": lay.llm_dp,
        },
    }
    for key in ("train_iters", "train_samples", "save_interval"):
        if getattr(t, key) is not None:
            out[key] = getattr(t, key)
    return out


def names(spec: RunSpec, rd: RunDir) -> list[str]:
    """The names a command template of `spec` may use, dotted ones spelled out (llm.tp, ...)."""
    out = []
    for k, v in values(spec, rd).items():
        out += [f"{k}.{sub}" for sub in v] if isinstance(v, dict) else [k]
    return out


def operator_in(words: str) -> str | None:
    """The first unquoted shell control operator or redirection in `words`, None when there is none."""
    lex = shlex.shlex(words, posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    lex.commenters = ""  # '#' inside a word (a URL fragment, an image tag) is not a comment here
    try:
        for tok in lex:
            if tok and set(tok) <= _OPERATOR_CHARS:
                return tok
    except ValueError as e:  # an unclosed quote
        return f"({e})"
    return None


def render_command(spec: RunSpec, rd: RunDir) -> str | None:
    """The run's command as shell words, or None for the packaged trainer. Raises jinja2.TemplateError for
    a template that does not render, ValueError for one that is not a single simple command."""
    template = command_of(spec)
    if template is None:
        return None
    # Folded or literal YAML blocks both end up as one line: newlines in the template are word breaks.
    text = _ENV.from_string(" ".join(template.split("\n"))).render(**values(spec, rd)).strip()
    if not text:
        raise ValueError("renders to nothing")
    op = operator_in(text)
    if op is not None:
        raise ValueError(
            f"renders to more than one simple command (unquoted {op!r}): torchrun runs one program; "
            "put pipelines or redirections in a script and run that"
        )
    return text


def command_problems(runs: list[RunSpec], rd_of) -> list[Problem]:
    """Every run whose command does not render, once per distinct message (`rd_of(run)` gives its RunDir)."""
    seen: set[str] = set()
    out: list[Problem] = []
    for r in runs:
        if command_of(r) is None:
            continue
        where = "command" if r.point.command else "trainer.command"
        try:
            render_command(r, rd_of(r))
        except jinja2.UndefinedError as e:
            msg = f"{where}: {e}; it may use {', '.join(names(r, rd_of(r)))}"
        except jinja2.TemplateError as e:
            msg = f"{where}: {type(e).__name__}: {e}"
        except ValueError as e:
            msg = f"{where}: {e}"
        else:
            continue
        if msg not in seen:
            seen.add(msg)
            out.append(Problem(r.name, "command", msg))
    return out

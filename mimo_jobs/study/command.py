"""A run's own training command (`trainer.command`, or `command` on a matrix point): a Jinja template of the
run's values, rendered into the words launch.sh hands to torchrun on every node.

Every value substituted reaches the shell as one inert word, however the template surrounds it: bare, a
value is shell-quoted; inside the template's own '...' or "..." the quote is closed around the quoted value
and reopened, so `--save '{{ checkpoint_dir }}'` and `--save "{{ checkpoint_dir }}"` mean what they look like.
A placeholder inside backquotes or $'...' is refused (the shell would read the value again). The template's
own text is the user's shell words, trusted like `cluster.setup`, but it must be one simple command on one
line: an unquoted `;`, `|`, `&`, redirection or subshell would cut the torchrun line or redirect torchrun
itself, an unquoted word starting with `#` would turn the rest of the line (the exit-code capture after it)
into a comment, and a line break would start a second command; each is refused. Unknown names are errors
(StrictUndefined), never empty; rendering is bounded in time and size.
"""

from __future__ import annotations

import shlex
import signal
import threading
from contextlib import contextmanager
from typing import Any

import jinja2
import jinja2.sandbox

from mimo_jobs.contract.rundir import RunDir
from mimo_jobs.study.diagnose import Problem
from mimo_jobs.study.paths import script_problems
from mimo_jobs.study.runspec import RunSpec

# shlex's punctuation_chars: a token made only of these is a shell control operator or redirection.
_OPERATOR_CHARS = set("();<>|&")
_MARK = "\x00"  # brackets a placeholder's index while the rendered text is checked (refused in a template)
MAX_WORD = 128 * 1024 - 1  # Linux's MAX_ARG_STRLEN: no exec takes one argument longer than 128 KiB
MAX_COMMAND = 1024 * 1024  # the whole command, well under the 2 MiB ARG_MAX that the environment shares
RENDER_S = 5  # a template that takes longer (nested loops) is refused


class CommandError(ValueError):
    """A command template that does not render into one simple command; the message says why."""


def _environment(found: list[str]) -> jinja2.sandbox.SandboxedEnvironment:
    """A sandbox whose every expression output becomes a numbered mark; the values are kept in `found`."""

    def finalize(value: Any) -> str:
        found.append(str(value))
        return f"{_MARK}{len(found) - 1}{_MARK}"

    return jinja2.sandbox.SandboxedEnvironment(
        undefined=jinja2.StrictUndefined, autoescape=False, finalize=finalize, keep_trailing_newline=False
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
        # the one encoder's sizes; several encoders: each module's by its name
        **_encoder_sizes(lay),
        "llm": {
            "tp": lay.llm_tp,
            "pp": lay.llm_pp,
            "ep": lay.llm_ep,
            "etp": lay.llm_etp,
            "cp": lay.llm_cp,
            "dp": lay.llm_dp,
        },
    }
    if spec.study_dir is not None:  # where the study's own scripts are (study/paths.py)
        out["study_dir"] = spec.study_dir
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
    """The run's command as shell words, or None for the packaged trainer. Raises jinja2.UndefinedError for an
    unknown name and CommandError for every other template that does not render into one simple command."""
    template = command_of(spec)
    if template is None:
        return None
    if _MARK in template:
        raise CommandError("holds a NUL character")
    # Folded or literal YAML blocks both end up as one line: newlines in the template are word breaks.
    found: list[str] = []
    marked = _rendered(" ".join(template.split("\n")), spec, rd, found).strip()
    if not marked:
        raise CommandError("renders to nothing")
    text = substitute(marked, found)
    _check_size(text)
    op = operator_in(text)
    if op is not None:
        raise CommandError(
            f"renders to more than one simple command (unquoted {op!r}): torchrun runs one program; "
            "put pipelines or redirections in a script and run that"
        )
    return text


def _rendered(template: str, spec: RunSpec, rd: RunDir, found: list[str]) -> str:
    try:
        with _deadline(RENDER_S):
            return _environment(found).from_string(template).render(**values(spec, rd))
    except jinja2.UndefinedError:
        raise
    except jinja2.TemplateError as e:
        raise CommandError(f"{type(e).__name__}: {e}") from None
    except CommandError:
        raise
    except TypeError as e:
        if "no loader" in str(e):  # include, import, extends: there is no other template to read
            raise CommandError(
                "{% include %}, {% import %} and {% extends %} have nothing to read: a command is one template"
            ) from None
        raise CommandError(f"does not render (TypeError: {e})") from None
    except RecursionError:
        raise CommandError("does not render (it recurses without end)") from None
    except Exception as e:  # noqa: BLE001 - 1/0, int('x'), ...: the template's own arithmetic fails
        raise CommandError(f"does not render ({type(e).__name__}: {e})") from None


@contextmanager
def _deadline(seconds: float):
    """CommandError when the block takes longer than `seconds` (on the main thread, where signals arrive)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum, frame):
        raise CommandError(f"took more than {seconds:g} s to render (loops too large for one command line)")

    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def substitute(marked: str, found: list[str]) -> str:
    """The rendered text with each mark replaced by its value as one shell word, for the quoting context the
    mark sits in; CommandError for a context where no quoting is safe, an unquoted line break or an unquoted
    word starting with '#'. Inside the template's quotes the quote is closed before the value and reopened
    after it, leaving out a pair that would be empty ('' is legal but reads as a mistake)."""
    out: list[str] = []
    state = ""  # "", "'", '"', "`" or "$'": the quoting the scan is inside
    opened = 0  # len(out) just after the current quote was opened
    reopen = False  # a value closed the current quote: reopen it before more quoted text
    i, word_start = 0, True
    while i < len(marked):
        c = marked[i]
        if c == _MARK:
            j = marked.find(_MARK, i + 1)
            value = shlex.quote(found[int(marked[i + 1 : j])])
            if state in ("'", '"'):
                if reopen:
                    pass  # the quote is still closed after the previous value
                elif len(out) == opened:
                    out.pop()  # nothing quoted yet: drop the opening quote instead of closing it
                else:
                    out.append(state)
                reopen = True
            elif state:
                where = "backquotes" if state == "`" else "$'...'"
                raise CommandError(
                    f"has a placeholder inside {where}: the shell would read its value again; move it out"
                )
            out.append(value)
            i, word_start = j + 1, False
            continue
        step = 2 if c == "\\" and state != "'" else 1  # a backslash escapes the next character
        if not state:
            if c == "\n":
                raise CommandError("renders to more than one line: torchrun runs one command on one line")
            if c == "#" and word_start:
                raise CommandError(
                    "has an unquoted word starting with '#': bash would read the rest of the line as a "
                    "comment (quote it)"
                )
            if marked.startswith("$'", i):
                state, step = "$'", 2
            elif c in "'\"`":
                state = c
            word_start = c in " \t"
            out.append(marked[i : i + step])
            opened = len(out)
        elif (c == "'" and state in ("'", "$'")) or c == state:
            if not reopen:
                out.append(c)  # a closing quote that a value did not already close
            state, reopen = "", False
        else:
            if reopen:
                out.append(state)
                reopen = False
            out.append(marked[i : i + step])
        i += step
    return "".join(out)


def _check_size(text: str) -> None:
    if len(text) > MAX_COMMAND:
        raise CommandError(
            f"renders to {len(text):,} characters; a command line holds at most {MAX_COMMAND:,}"
        )
    if len(text) <= MAX_WORD:
        return  # no word can be longer than the whole
    try:
        words = shlex.split(text)
    except ValueError:
        return  # an unclosed quote: operator_in names it
    longest = max(words, key=len, default="")
    if len(longest) > MAX_WORD:
        raise CommandError(
            f"renders a word of {len(longest):,} characters; Linux execs no argument over 128 KiB "
            "(MAX_ARG_STRLEN): pass it in a file"
        )


def command_problems(runs: list[RunSpec], rd_of) -> list[Problem]:
    """Every run whose command does not render, once per distinct message (`rd_of(run)` gives its RunDir)."""
    seen: set[str] = set()
    out: list[Problem] = []
    for r in runs:
        if command_of(r) is None:
            continue
        where = "command" if r.point.command else "trainer.command"
        try:
            text = render_command(r, rd_of(r))
        except jinja2.UndefinedError as e:
            msg = f"{where}: {e}; it may use {', '.join(names(r, rd_of(r)))}"
        except jinja2.TemplateError as e:
            msg = f"{where}: {type(e).__name__}: {e}"
        except ValueError as e:
            msg = f"{where}: {e}"
        else:
            for p in script_problems(r.study_dir, shlex.split(text), where, str(rd_of(r).root)):
                if p.message not in seen:
                    seen.add(p.message)
                    out.append(Problem(r.name, p.rule, f"{p.path}: {p.message}", p.fit))
            continue
        if msg not in seen:
            seen.add(msg)
            out.append(Problem(r.name, "command", msg))
    return out


def _encoder_sizes(lay) -> dict:
    """`encoder: {tp, pp, dp}` of the one encoder, or `encoders: {name: {tp, pp, dp}}` of several."""
    sizes = {m.name: {"tp": m.tp, "pp": m.pp, "dp": m.dp} for m in lay.encoders}
    return {"encoders": sizes} if lay.several else {"encoder": next(iter(sizes.values()))}

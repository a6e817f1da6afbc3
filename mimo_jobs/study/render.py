"""Render a study's runs into run directories: run.yaml (the trainer's input), launch.sh, sbatch.sh.

Templates are Jinja with StrictUndefined (a missing variable is an error, never an empty string). Every value
that reaches the shell goes through `shq` (shlex.quote) or a filter that validates it; setup lines are
the one deliberate exception (user shell code) and must each be a complete command (`bash -n`).
All scripts of all selected runs are rendered and checked in memory first, then each file is written to a
temporary file and renamed, so a failure leaves no half-written run directory behind.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import jinja2
import yaml

from mimo_jobs import __version__
from mimo_jobs.contract import ports
from mimo_jobs.contract.requeue import REQUEUE_EXIT_CODE, REQUEUE_MARKER
from mimo_jobs.contract.rundir import RunDir
from mimo_jobs.errors import MimoJobsError
from mimo_jobs.study.command import command_problems, render_command
from mimo_jobs.study.diagnose import Problem
from mimo_jobs.study.expand import runs_of
from mimo_jobs.study.runspec import RunSpec, run_yaml_doc
from mimo_jobs.study.spec import ClusterSpec, StudySpec

TEMPLATE_NAMES = ("sbatch.sh.j2", "launch.sh.j2")
PORT_BASE, PORT_SPAN = 20000, 20000  # MASTER_PORT = base + job id % span (per job on shared hosts)
# Run directory paths appear in #SBATCH headers ('%' is a SLURM pattern there) and in pyxis mount lists
# (',' and ':' are separators), so they are limited to characters that need neither; a space is quoted in
# an #SBATCH line (sbatch_value) and in the shell (shq).
RUN_PATH_RE = re.compile(r"^[A-Za-z0-9_./@+=~ -]+\Z")
_SBATCH_WORD_RE = re.compile(r"^[A-Za-z0-9_.,:=+/@%~-]+\Z")
# What a double-quoted #SBATCH value may hold: slurm's src/sbatch/opt.c (_get_argument) splits an #SBATCH
# line at whitespace outside double quotes and drops the quotes, while a quote, a backslash (an escape in
# later releases) or an unquoted '#' (a comment) would change the argument; so only spaces are quoted.
_SBATCH_QUOTABLE_RE = re.compile(r"^[A-Za-z0-9_.,:=+/@%~ -]+\Z")
_SHELL_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")


class TemplatesNotFound(MimoJobsError, FileNotFoundError):
    """A templates (or studies) directory given or packaged is missing what rendering needs."""


class RenderError(MimoJobsError, ValueError):
    """Rendering refused; `problems` say where and why (same shape as `validate`'s)."""

    def __init__(self, problems: list[Problem], where: str | None = None):
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems), where)


@dataclass(frozen=True)
class RenderedRun:
    run: RunSpec
    run_dir: Path
    run_yaml: Path
    launch_sh: Path
    sbatch_sh: Path
    sbatch_sha256: str  # of sbatch.sh exactly as written (no timestamps in it: re-rendering keeps the hash)
    status: str  # "new", "updated" or "unchanged"


# ---------------------------------------------------------------- templates


def packaged_templates() -> Path:
    """The templates shipped inside the package (mimo_jobs/_templates; `templates/` at the repository root
    is a link to it for people browsing the source)."""
    cand = Path(__file__).resolve().parents[1] / "_templates"
    if all((cand / n).is_file() for n in TEMPLATE_NAMES):
        return cand
    here = cand.parent
    raise TemplatesNotFound(
        f"packaged templates not found next to {here} (expected _templates/{TEMPLATE_NAMES[0]})"
    )


def packaged_studies() -> Path:
    cand = Path(__file__).resolve().parents[1] / "_studies"
    if cand.is_dir():
        return cand
    raise TemplatesNotFound(f"packaged studies not found in {cand.parent}")


def _sbatch_word(value: Any) -> str:
    s = str(value)
    if not _SBATCH_WORD_RE.match(s):
        raise jinja2.TemplateRuntimeError(
            f"{s!r} cannot go into an #SBATCH header (no spaces/quotes/shell chars)"
        )
    return s


def sbatch_value(value: Any) -> str:
    """A value for an #SBATCH line: as is when it is one word, in double quotes when it holds spaces (which
    sbatch then keeps in the argument); anything else cannot be carried there."""
    s = str(value)
    if _SBATCH_WORD_RE.match(s):
        return s
    if _SBATCH_QUOTABLE_RE.match(s):
        return f'"{s}"'
    raise jinja2.TemplateRuntimeError(
        f"{s!r} cannot go into an #SBATCH header (letters, digits, spaces and _.,:=+/@%~- only: sbatch "
        "reads no quote, backslash or '#' inside a quoted value)"
    )


def _shell_name(value: Any) -> str:
    s = str(value)
    if not _SHELL_NAME_RE.match(s):
        raise jinja2.TemplateRuntimeError(f"{s!r} is not a shell variable name")
    return s


def environment(templates_dir: str | Path | None = None) -> jinja2.Environment:
    """Jinja environment: `templates_dir` (if given) overrides the packaged templates file by file."""
    loaders: list[jinja2.BaseLoader] = []
    if templates_dir is not None:
        tdir = Path(templates_dir)
        if not tdir.is_dir():
            raise TemplatesNotFound(f"--templates {tdir}: not a directory")
        if not any((tdir / n).is_file() for n in TEMPLATE_NAMES):
            raise TemplatesNotFound(f"--templates {tdir}: contains none of {', '.join(TEMPLATE_NAMES)}")
        loaders.append(jinja2.FileSystemLoader(str(tdir)))
    loaders.append(jinja2.FileSystemLoader(str(packaged_templates())))
    env = jinja2.Environment(
        loader=jinja2.ChoiceLoader(loaders),
        undefined=jinja2.StrictUndefined,
        autoescape=False,  # shell, not HTML: quoting is explicit (shq)
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["shq"] = lambda v: shlex.quote(str(v))
    # Always quoted, even when shlex finds it safe (comma lists inside arrays read as mistakes to shellcheck).
    env.filters["shq_always"] = lambda v: "'" + str(v).replace("'", "'\"'\"'") + "'"
    env.filters["sbatch_word"] = _sbatch_word
    env.filters["sbatch_value"] = sbatch_value
    env.filters["shell_name"] = _shell_name
    return env


# ---------------------------------------------------------------- checks


def _bash_n(text: str) -> str | None:
    """bash's own syntax check; returns its complaint or None."""
    r = subprocess.run(["bash", "-n"], check=False, input=text, capture_output=True, text=True)
    if r.returncode == 0 and not r.stderr.strip():  # warnings count too (e.g. an unterminated here-document)
        return None
    return r.stderr.strip().replace("bash: ", "") or "syntax error"


def setup_problems(cluster: ClusterSpec) -> list[Problem]:
    """Setup lines are user shell code, pasted as is: each must be a complete command on its own, or it would
    swallow the rest of the script (an open quote, an unfinished if/heredoc)."""
    problems: list[Problem] = []
    for i, line in enumerate(cluster.setup):
        if "\n" in line.strip():
            problems.append(
                Problem(f"cluster.setup[{i}]", "setup", "one command per list item (no newlines)")
            )
            continue
        # Inside a function body, anything that reaches past its own line (open quote or block, heredoc,
        # trailing backslash joining the next line) leaves the closing brace unmatched: bash -n fails.
        err = _bash_n(f"_mimo_jobs_setup() {{\n{line}\n}}\n")
        if err:
            problems.append(
                Problem(
                    f"cluster.setup[{i}]",
                    "setup",
                    f"{line!r} is not a complete shell command ({err})",
                    "close quotes/blocks on the same line, or split it into complete commands",
                )
            )
    return problems


def path_problems(runs_root: str | Path) -> list[Problem]:
    """The runs root goes into #SBATCH lines (quoted there when it has a space) and container mounts, which
    cannot carry a quote, a backslash, '#', '%', ',' or ':'."""
    root = str(Path(runs_root).resolve())
    if RUN_PATH_RE.match(root):
        return []
    bad = "".join(sorted({c for c in root if not RUN_PATH_RE.match(c)}))
    return [
        Problem(
            "--output",
            "run-path",
            f"runs root {root!r} contains {bad!r}, which #SBATCH lines and container mounts cannot carry",
            "use a path of letters, digits, spaces and _./@+=~-",
        )
    ]


def preflight(spec: StudySpec, runs_root: str | Path | None = None) -> list[Problem]:
    """Problems that only rendering reveals (validate reports them too)."""
    return setup_problems(spec.cluster) + (path_problems(runs_root) if runs_root is not None else [])


# ---------------------------------------------------------------- rendering


def provenance() -> dict:
    """Where run.yaml came from: package version, git commit of the package source (if a checkout), time."""
    src = Path(__file__).resolve().parent
    sha, dirty = None, None
    try:
        r = subprocess.run(
            ["git", "-C", str(src), "rev-parse", "HEAD"],
            check=False,
            capture_output=True,
            text=True,
            timeout=5,
        )
        if r.returncode == 0:
            sha = r.stdout.strip()
            st = subprocess.run(
                ["git", "-C", str(src), "status", "--porcelain", "--", "."],
                check=False,
                capture_output=True,
                text=True,
                timeout=10,
            )
            dirty = bool(st.stdout.strip()) if st.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        pass
    if sha is None:  # no checkout, e.g. inside the mimo-jobs image: the commit the image was built from
        from mimo_jobs.image import image_sha

        sha, dirty = image_sha()
    return {
        "mimo_jobs_version": __version__,
        "git_sha": sha,
        "git_dirty": dirty,
        "rendered_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def context(spec: RunSpec, rd: RunDir, pet_rendezvous: bool = False) -> dict:
    """Everything the templates may use (StrictUndefined: anything else is an error). The run's layout and
    sizes are here raw (templates quote what they put in the shell); `command` is the run's own training
    command already rendered as shell words (study/command.py), None for the packaged trainer.
    `pet_rendezvous`: launch.sh also takes a node's rank and rendezvous from torchrun's PET_* variables (an
    executor whose job object sets them, e.g. a Kubeflow Trainer TrainJob)."""
    c = spec.cluster
    slurm = c.section("slurm")
    run_dir = str(rd.root)
    lay, t = spec.layout, spec.trainer
    container = None
    if c.container is not None:
        ck = rd.checkpoint_dir(spec.trainer.checkpoint_dir)
        mounts = [f"{run_dir}:{run_dir}"]
        if not ck.resolve().is_relative_to(rd.root):
            mounts.append(f"{ck}:{ck}")
        mounts += [m for m in c.container.mounts if m not in mounts]
        container = {
            "runtime": c.container.runtime,
            "image": c.container.image,
            "mounts": mounts,
            "workdir": c.container.workdir or run_dir,
            "mount_home": c.container.mount_home,
        }
    return {
        "version": __version__,
        "study": spec.study,
        "run_name": spec.name,
        "run_id": spec.run_id,
        "job_name": f"{spec.study}.{spec.name}",
        "run_dir": run_dir,
        "run_yaml": str(rd.run_yaml),
        "launch_sh": str(rd.launch_sh),
        "slurm_out": str(rd.slurm_out()),
        "nodes": spec.layout.nodes,
        "nproc_per_node": c.gpus_per_node,
        "gpus_per_node": c.gpus_per_node,
        "accelerator": c.accelerator,
        "time_limit": spec.time_limit,
        "partition": slurm.partition,
        "account": slurm.account,
        "qos": slurm.qos,
        "exclusive": slurm.exclusive,
        "signal": c.signal,
        "signal_name": c.signal.split("@")[0].removeprefix("B:"),
        "requeue": c.requeue,
        "sbatch_args": list(slurm.sbatch_args),
        "srun_args": list(slurm.srun_args),
        "env": sorted(c.env.items()),
        "setup": list(c.setup),
        "python": c.python,
        "container": container,
        "port_base": PORT_BASE,
        "port_span": PORT_SPAN,
        "port_probe": ports.probe_source(),
        # requeue contract (trainer/signals.py; literals so rendering imports no trainer module)
        "time_limit_s": spec.cluster.model_copy(update={"time_limit": spec.time_limit}).time_limit_seconds(),
        "requeue_marker": str(rd.checkpoint_dir(spec.trainer.checkpoint_dir) / REQUEUE_MARKER),
        "requeue_exit_code": REQUEUE_EXIT_CODE,
        "checkpoint_dir": str(rd.checkpoint_dir(t.checkpoint_dir)),
        "gbs": lay.gbs,
        "mbs": lay.mbs,
        "world": lay.nodes * lay.gpus_per_node,
        "seq_length": t.seq_length,
        "train_iters": t.train_iters,
        "train_samples": t.train_samples,
        "colocated": lay.colocated,
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
        "command": render_command(spec, rd),
        "pet_rendezvous": pet_rendezvous,
    }


@dataclass(frozen=True)
class Planned:
    """A run rendered in memory: its files' texts, nothing written (what --dry-run shows)."""

    spec: RunSpec
    rd: RunDir
    files: dict[Path, tuple[str, int]]  # path -> (text, mode)

    def text(self, path: Path) -> str:
        return self.files[path][0]


# An executor's own files for a run (path -> text), rendered with its run.yaml and scripts (e.g. the
# Kubernetes executor's trainjob.yaml); a ValueError says why the run cannot have them.
Artefacts = Callable[[RunSpec, RunDir], dict[Path, str]]


def _plan_run(
    spec: RunSpec,
    rd: RunDir,
    env: jinja2.Environment,
    prov: dict,
    pet_rendezvous: bool = False,
    artefacts: Artefacts | None = None,
) -> Planned:
    ctx = context(spec, rd, pet_rendezvous)
    files: dict[Path, tuple[str, int]] = {}
    doc = run_yaml_doc(spec, rd.root, prov)
    files[rd.run_yaml] = (yaml.safe_dump(doc, sort_keys=False, default_flow_style=False), 0o644)
    for name, path in (("launch.sh.j2", rd.launch_sh), ("sbatch.sh.j2", rd.sbatch_sh)):
        try:
            text = env.get_template(name).render(**ctx)
        except jinja2.TemplateError as e:
            where = getattr(e, "filename", None) or name
            raise RenderError([Problem(spec.name, "template", f"{where}: {e}")]) from None
        err = _bash_n(text)
        if err:
            raise RenderError(
                [Problem(spec.name, "template", f"rendered {path.name} is not valid bash: {err}")]
            )
        files[path] = (text, 0o755)
    if artefacts is not None:
        try:
            files.update({path: (text, 0o644) for path, text in artefacts(spec, rd).items()})
        except ValueError as e:
            raise RenderError([Problem(spec.name, "executor", str(e))]) from None
    return Planned(spec, rd, files)


def _same_run_yaml(path: Path, text: str) -> bool:
    """True when `path` holds the same run.yaml apart from provenance (so re-rendering keeps it untouched)."""
    try:
        old = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return False
    new = yaml.safe_load(text)
    if not isinstance(old, dict):
        return False
    return {k: v for k, v in old.items() if k != "provenance"} == {
        k: v for k, v in new.items() if k != "provenance"
    }


def _write_atomic(path: Path, text: str, mode: int) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _write(p: Planned) -> RenderedRun:
    """Write a planned run's files; a run directory this call created is removed again if any write fails
    (a full disk, a name the filesystem refuses), so a failed render leaves no half-made run behind."""
    new_dir = not p.rd.root.exists()
    try:
        return _write_files(p)
    except OSError as e:
        if new_dir:
            shutil.rmtree(p.rd.root, ignore_errors=True)
        raise RenderError(
            [Problem(p.spec.name, "write", f"cannot write {e.filename or p.rd.root}: {e.strerror or e}")]
        ) from None


def _write_files(p: Planned) -> RenderedRun:
    p.rd.root.mkdir(parents=True, exist_ok=True)
    p.rd.logs.mkdir(exist_ok=True)  # SLURM opens --output before the script runs: the directory must exist
    changed, existed = False, False
    for path, (text, mode) in p.files.items():
        if path.exists():
            existed = True
            same = _same_run_yaml(path, text) if path == p.rd.run_yaml else path.read_text() == text
            if same:
                if path.stat().st_mode & 0o777 != mode:
                    os.chmod(path, mode)
                continue
        changed = True
        _write_atomic(path, text, mode)
    sbatch_text = p.files[p.rd.sbatch_sh][0]
    status = "unchanged" if existed and not changed else ("updated" if existed else "new")
    return RenderedRun(
        run=p.spec,
        run_dir=p.rd.root,
        run_yaml=p.rd.run_yaml,
        launch_sh=p.rd.launch_sh,
        sbatch_sh=p.rd.sbatch_sh,
        sbatch_sha256=hashlib.sha256(sbatch_text.encode()).hexdigest(),
        status=status,
    )


def plan_runs(
    runs: list[RunSpec],
    runs_root: str | Path,
    templates_dir: str | Path | None = None,
    pet_rendezvous: bool = False,
    artefacts: Artefacts | None = None,
) -> list[Planned]:
    """Render `runs` in memory and check them (paths, setup lines, templates, `bash -n`); writes nothing.
    Raises RenderError with every problem found."""
    root = Path(runs_root).resolve()
    problems = path_problems(root)
    for cluster in {r.cluster.model_dump_json(): r.cluster for r in runs}.values():
        problems += setup_problems(cluster)
    problems += command_problems(runs, lambda s: RunDir.of(root, s.study, s.name, s.run_id))
    if problems:
        raise RenderError(problems)
    env = environment(templates_dir)
    prov = provenance()
    return [
        _plan_run(s, RunDir.of(root, s.study, s.name, s.run_id), env, prov, pet_rendezvous, artefacts)
        for s in runs
    ]


def render_runs(
    runs: list[RunSpec],
    runs_root: str | Path,
    templates_dir: str | Path | None = None,
    pet_rendezvous: bool = False,
    artefacts: Artefacts | None = None,
) -> list[RenderedRun]:
    """Render and write `runs` under runs_root/<study>/<run name>-<run id>/. Everything is checked before
    anything is written; raises RenderError (with every problem found) and writes nothing when a check
    fails."""
    return [_write(p) for p in plan_runs(runs, runs_root, templates_dir, pet_rendezvous, artefacts)]


def render_run(spec: RunSpec, runs_root: str | Path, templates_dir: str | Path | None = None) -> RenderedRun:
    """Render one run: runs_root/<study>/<run name>-<run id>/{run.yaml,launch.sh,sbatch.sh}."""
    return render_runs([spec], runs_root, templates_dir)[0]


def render_study(
    study: StudySpec,
    runs_root: str | Path,
    templates_dir: str | Path | None = None,
    only: list[str] | None = None,
    source: str = "<study>",
    pet_rendezvous: bool = False,
    artefacts: Artefacts | None = None,
) -> list[RenderedRun]:
    """Render every run of a study (or those named in `only`, by run name or run id), with what its executor
    adds (`pet_rendezvous`, `artefacts`: see plan_runs)."""
    runs = runs_of(study, source)
    if only:
        known = {r.name for r in runs} | {r.run_id for r in runs}
        missing = [o for o in only if o not in known]
        if missing:
            raise RenderError(
                [
                    Problem(
                        "--only",
                        "unknown-run",
                        f"no run named {m!r} in {study.name}",
                        "one of: " + ", ".join(r.name for r in runs),
                    )
                    for m in missing
                ]
            )
        runs = [r for r in runs if r.name in only or r.run_id in only]
    return render_runs(runs, runs_root, templates_dir, pet_rendezvous, artefacts)


def _encoder_sizes(lay) -> dict:
    """`encoder: {tp, pp, dp}` of the one encoder, or `encoders: {name: {tp, pp, dp}}` of several."""
    sizes = {m.name: {"tp": m.tp, "pp": m.pp, "dp": m.dp} for m in lay.encoders}
    return {"encoders": sizes} if lay.several else {"encoder": next(iter(sizes.values()))}

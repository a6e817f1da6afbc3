"""Study files: YAML -> typed, validated spec -> expanded runs.

A study is `name`, `description`, `cluster`, `trainer` and a `matrix` of points (explicit `points` and/or a
`product` of axes over `defaults`). Every expanded point becomes a RunSpec with a stable id (hash of its
resolved config) and a readable name. `run.yaml` (written by render) is a RunSpec dump: the trainer's
complete, self-contained input.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from . import topology
from .presets import PRESETS

# Values that end up in shell scripts or file names are restricted up front; free text is quoted later.
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
SLURM_WORD_RE = re.compile(r"^[A-Za-z0-9_.,:=+/-]{1,128}$")
ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
TIME_RE = re.compile(r"^(?:(\d+)-)?(\d{1,2}):(\d{2}):(\d{2})$|^(\d+)$")


class StudyError(ValueError):
    """Bad study input; `problems` are (yaml_path, message) pairs, all of them, not only the first."""

    def __init__(self, source: str, problems: list[tuple[str, str]]):
        self.source = source
        self.problems = problems
        lines = [f"{source}: {len(problems)} problem(s)"] + [f"  {p}: {m}" for p, m in problems]
        super().__init__("\n".join(lines))


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# ---------------------------------------------------------------- cluster


# Paths and image references reach srun flags (pyxis splits mounts on ',' and ':'), so they are
# restricted to characters that need no quoting and carry no separator.
PATH_WORD_RE = re.compile(r"^[A-Za-z0-9_./@+=~-]+$")
IMAGE_RE = re.compile(r"^[A-Za-z0-9_./@+=~#:-]+$")
MOUNT_RE = re.compile(r"^[A-Za-z0-9_./@+=~-]+(?::[A-Za-z0-9_./@+=~-]+(?::[a-z+]+)?)?$")
ARG_RE = re.compile(r"^--[a-z][a-z0-9-]*(=[A-Za-z0-9_.,:=+/@%-]+)?$")


class ContainerSpec(_Strict):
    image: str  # pyxis image reference or .sqsh path; apptainer .sif
    runtime: Literal["pyxis", "apptainer"] = "pyxis"
    mounts: list[str] = Field(default_factory=list)  # "src:dst[:flags]"
    workdir: str | None = None
    mount_home: bool = False

    @field_validator("image")
    @classmethod
    def _image(cls, v: str) -> str:
        if not IMAGE_RE.match(v):
            raise ValueError(f"{v!r} is not an image reference or path (letters, digits, _./@+=~#:- only, "
                             "e.g. nvcr.io#nvidia/pytorch:25.04-py3 or /images/mimo.sqsh)")
        return v

    @field_validator("mounts")
    @classmethod
    def _mounts(cls, v: list[str]) -> list[str]:
        for m in v:
            if not MOUNT_RE.match(m):
                raise ValueError(f"mount {m!r} must look like /src:/dst or /src:/dst:ro (no spaces, commas, "
                                 "quotes or shell characters)")
        return v

    @field_validator("workdir")
    @classmethod
    def _workdir(cls, v: str | None) -> str | None:
        if v is not None and not (PATH_WORD_RE.match(v) and v.startswith("/")):
            raise ValueError(f"workdir {v!r} must be an absolute path of letters, digits and _./@+=~-")
        return v


class ClusterSpec(_Strict):
    executor: Literal["slurm", "local"] = "slurm"
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time_limit: str = "01:00:00"
    gpus_per_node: int = Field(8, ge=1, le=64)
    accelerator: Literal["gpu", "cpu"] = "gpu"  # cpu: gpus_per_node means processes per node, gloo backend
    exclusive: bool = True
    container: ContainerSpec | None = None
    env: dict[str, str] = Field(default_factory=dict)
    setup: list[str] = Field(default_factory=list)  # shell lines run before the launch (trusted, checked by bash -n)
    sbatch_args: list[str] = Field(default_factory=list)  # extra "--key=value" headers
    srun_args: list[str] = Field(default_factory=list)
    signal: str = "USR2@120"  # preemption/time-limit warning signal: the trainer checkpoints and exits
    requeue: bool = True
    max_retries: int = Field(2, ge=0, le=20)  # retries for flaky failures (watchdog timeouts, node failure)
    python: str = "python3"

    @field_validator("partition", "account", "qos")
    @classmethod
    def _slurm_word(cls, v: str | None) -> str | None:
        if v is not None and not SLURM_WORD_RE.match(v):
            raise ValueError(f"{v!r} is not a valid SLURM name (letters, digits, _.,:=+/- only)")
        return v

    @field_validator("time_limit")
    @classmethod
    def _time(cls, v: str) -> str:
        if not TIME_RE.match(str(v)):
            raise ValueError(f"{v!r} is not a SLURM time (HH:MM:SS, D-HH:MM:SS or minutes)")
        return str(v)

    @field_validator("signal")
    @classmethod
    def _signal(cls, v: str) -> str:
        if not re.match(r"^(B:)?(USR1|USR2|TERM|INT)@\d{1,5}$", v):
            raise ValueError(f"{v!r} is not a signal spec like USR2@120 or B:USR1@90")
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        for k, x in v.items():
            if not ENV_KEY_RE.match(k):
                raise ValueError(f"environment variable name {k!r} is not a valid shell identifier")
            if "\0" in x:
                raise ValueError(f"environment variable {k}: a value cannot contain a NUL character")
        return {k: str(x) for k, x in v.items()}

    @field_validator("env", mode="before")
    @classmethod
    def _env_scalars(cls, v: Any) -> Any:
        # YAML turns `X: 1` into an int; numbers are fine as env values, booleans are ambiguous (1/true/True).
        if isinstance(v, dict):
            out = {}
            for k, x in v.items():
                if isinstance(x, bool):
                    raise ValueError(f"environment variable {k}: write the value as a quoted string "
                                     f"(\"1\" or \"true\"), not the YAML boolean {x}")
                out[k] = str(x) if isinstance(x, (int, float)) else x
            return out
        return v

    @field_validator("sbatch_args", "srun_args")
    @classmethod
    def _args(cls, v: list[str], info) -> list[str]:
        what = "sbatch" if info.field_name == "sbatch_args" else "srun"
        for a in v:
            if not ARG_RE.match(a):
                raise ValueError(f"{what} arg {a!r} must look like --key or --key=value (no spaces or quotes)")
        return v

    @field_validator("python")
    @classmethod
    def _python(cls, v: str) -> str:
        if not PATH_WORD_RE.match(v):
            raise ValueError(f"python {v!r} must be one command or path (e.g. python3 or /opt/venv/bin/python)")
        return v

    def time_limit_seconds(self) -> int:
        m = TIME_RE.match(self.time_limit)
        assert m
        if m.group(5) is not None:
            return int(m.group(5)) * 60
        d = int(m.group(1) or 0)
        return ((d * 24 + int(m.group(2))) * 60 + int(m.group(3))) * 60 + int(m.group(4))


# ---------------------------------------------------------------- trainer


class LRSpec(_Strict):
    schedule: Literal["constant", "cosine", "linear", "wsd"] = "cosine"
    max: float = Field(3e-4, gt=0)
    min: float = Field(0.0, ge=0)
    warmup_samples: int = Field(0, ge=0)
    decay_samples: int | None = Field(None, ge=1)  # default: the whole run
    wsd_decay_samples: int | None = Field(None, ge=1)  # length of WSD's final decay phase
    wsd_decay_style: Literal["minus_sqrt", "linear", "cosine", "exponential"] = "minus_sqrt"

    @model_validator(mode="after")
    def _check(self) -> LRSpec:
        if self.min > self.max:
            raise ValueError(f"lr.min={self.min} exceeds lr.max={self.max}")
        if self.schedule == "wsd" and self.wsd_decay_samples is None:
            raise ValueError("schedule 'wsd' needs lr.wsd_decay_samples")
        return self


class OptimizerSpec(_Strict):
    name: Literal["adam", "sgd"] = "adam"
    weight_decay: float = Field(0.0, ge=0)
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    clip_grad: float = Field(1.0, ge=0)  # 0 disables clipping


class DataSpec(_Strict):
    provider: Literal["mock", "energon"] = "mock"
    path: str | None = None  # energon dataset dir or blend yaml
    num_workers: int = Field(0, ge=0, le=64)
    text_only_fraction: float = Field(0.25, ge=0, le=1)  # mock provider: share of samples with no image
    image_sizes: list[int] = Field(default_factory=lambda: [8, 12, 16])  # mock: square sides in pixels
    tokenizer: str | None = None  # local HuggingFace tokenizer path (energon); built-in byte tokenizer if None
    # energon: a corrupt/incomplete/too-long sample stops the run naming shard and key, or is skipped and counted
    on_bad_sample: Literal["error", "skip"] = "error"
    truncate_text: bool = False  # energon: cut text that does not fit seq_length (counted); images never cut
    shuffle_buffer_size: int | None = Field(100, ge=1)  # energon sample shuffle buffer (None: no shuffle)
    max_samples_per_sequence: int | None = Field(100, ge=1)  # energon: samples read in a row from one shard

    @model_validator(mode="after")
    def _check(self) -> DataSpec:
        if self.provider == "energon" and not self.path:
            raise ValueError("provider 'energon' needs data.path (dataset dir or blend yaml)")
        return self


class FreezeSpec(_Strict):
    encoder: bool = False
    llm: bool = False


class TrainerSpec(_Strict):
    model: str = "tiny"
    seq_length: int = Field(64, ge=8)
    train_iters: int | None = Field(None, ge=1)
    train_samples: int | None = Field(None, ge=1)
    lr: LRSpec = Field(default_factory=LRSpec)
    optimizer: OptimizerSpec = Field(default_factory=OptimizerSpec)
    data: DataSpec = Field(default_factory=DataSpec)
    log_interval: int = Field(1, ge=1)
    save_interval: int | None = Field(None, ge=1)
    checkpoint_dir: str | None = None  # default: <run dir>/checkpoints
    keep_checkpoints: int = Field(2, ge=1)
    seed: int = 1234
    precision: Literal["fp32", "bf16"] = "fp32"
    freeze: FreezeSpec = Field(default_factory=FreezeSpec)
    use_distributed_optimizer: bool = False
    timeout_s: int = Field(300, ge=10)  # collective timeout; a dead peer ends the job instead of hanging

    @field_validator("model")
    @classmethod
    def _model(cls, v: str) -> str:
        if v not in PRESETS:
            raise ValueError(f"unknown model preset {v!r}; known: {', '.join(sorted(PRESETS))}")
        return v

    @model_validator(mode="after")
    def _check(self) -> TrainerSpec:
        if (self.train_iters is None) == (self.train_samples is None):
            raise ValueError("give exactly one of trainer.train_iters or trainer.train_samples")
        return self


# ---------------------------------------------------------------- matrix


class EncoderAxes(_Strict):
    tp: int = Field(1, ge=1)
    pp: int = Field(1, ge=1)
    dp: int = Field(1, ge=1)


class LLMAxes(_Strict):
    tp: int = Field(1, ge=1)
    pp: int = Field(1, ge=1)
    ep: int = Field(1, ge=1)
    etp: int = Field(1, ge=1)
    cp: int = Field(1, ge=1)
    dp: int | None = Field(None, ge=1)  # None: derived so that the world is tiled exactly


class PointSpec(_Strict):
    nodes: int = Field(ge=1)
    encoder: EncoderAxes = Field(default_factory=EncoderAxes)
    llm: LLMAxes = Field(default_factory=LLMAxes)
    gbs: int = Field(ge=1)
    mbs: int = Field(1, ge=1)
    repeats: int = Field(1, ge=1, le=100)
    time_limit: str | None = None  # overrides cluster.time_limit for this point

    @field_validator("time_limit")
    @classmethod
    def _time(cls, v: str | None) -> str | None:
        if v is not None and not TIME_RE.match(str(v)):
            raise ValueError(f"{v!r} is not a SLURM time (HH:MM:SS, D-HH:MM:SS or minutes)")
        return v


class MatrixSpec(_Strict):
    defaults: dict[str, Any] = Field(default_factory=dict)  # partial point merged under every point
    points: list[dict[str, Any]] = Field(default_factory=list)
    product: dict[str, list[Any]] = Field(default_factory=dict)  # dotted axis -> values, e.g. "llm.tp": [1, 2]


class StudySpec(_Strict):
    name: str
    description: str = ""
    scaling: Literal["strong", "weak"] = "strong"
    baseline_nodes: int | None = None
    cluster: ClusterSpec = Field(default_factory=ClusterSpec)
    trainer: TrainerSpec
    matrix: MatrixSpec

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME_RE.match(v):
            raise ValueError(f"{v!r}: study names use letters, digits, '.', '_' and '-' (max 64, no leading '-')")
        return v


# ---------------------------------------------------------------- expanded runs


@dataclass(frozen=True)
class RunSpec:
    """One expanded point of a study: everything needed to render, launch and train it."""

    study: str
    name: str
    run_id: str
    index: int  # position in the expanded matrix
    repeat: int
    point: PointSpec  # resolved (llm.dp filled in)
    layout: topology.Layout
    cluster: ClusterSpec
    trainer: TrainerSpec

    @property
    def time_limit(self) -> str:
        return self.point.time_limit or self.cluster.time_limit

    def to_dict(self) -> dict:
        from dataclasses import asdict

        return {
            "study": self.study, "name": self.name, "run_id": self.run_id, "index": self.index,
            "repeat": self.repeat, "point": self.point.model_dump(mode="json"), "layout": asdict(self.layout),
            "cluster": self.cluster.model_dump(mode="json"), "trainer": self.trainer.model_dump(mode="json"),
        }

    @classmethod
    def from_dict(cls, d: dict) -> RunSpec:
        return cls(
            study=d["study"], name=d["name"], run_id=d["run_id"], index=int(d["index"]), repeat=int(d["repeat"]),
            point=PointSpec.model_validate(d["point"]), layout=topology.Layout(**d["layout"]),
            cluster=ClusterSpec.model_validate(d["cluster"]), trainer=TrainerSpec.model_validate(d["trainer"]),
        )

    def plan(self) -> topology.Plan:
        return topology.plan(self.layout)


@dataclass
class PointResult:
    """A point after expansion: a run, or the rules it breaks (reported all together)."""

    index: int
    label: str  # yaml path of the point's origin, e.g. matrix.points[2]
    run: RunSpec | None
    violations: list[topology.Violation]


# ---------------------------------------------------------------- loading


_ENV_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-(.*?))?\}")


def _fmt_path(loc: tuple | list) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "<root>"


def _interpolate(node: Any, path: tuple, env: dict[str, str], problems: list[tuple[str, str]]) -> Any:
    """Replace ${VAR} / ${VAR:-default} in every string; an unset variable is a problem at its YAML path."""
    if isinstance(node, dict):
        return {k: _interpolate(v, path + (k,), env, problems) for k, v in node.items()}
    if isinstance(node, list):
        return [_interpolate(v, path + (i,), env, problems) for i, v in enumerate(node)]
    if isinstance(node, str) and "${" in node:
        def repl(m: re.Match) -> str:
            var, default = m.group(1), m.group(2)
            if var in env:
                return env[var]
            if default is not None:
                return default
            problems.append((_fmt_path(path), f"environment variable ${{{var}}} is not set "
                             f"(export {var}=... or write ${{{var}:-default}})"))
            return ""
        return _ENV_RE.sub(repl, node)
    return node


def _pydantic_problems(err: ValidationError, prefix: tuple = ()) -> list[tuple[str, str]]:
    out = []
    for e in err.errors():
        loc = prefix + tuple(x for x in e["loc"] if not (isinstance(x, str) and x.startswith("function-")))
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown key"
        elif msg.startswith("Value error, "):
            msg = msg[len("Value error, "):]
        out.append((_fmt_path(loc), msg))
    return out


def parse_study(data: Any, source: str = "<study>", env: dict[str, str] | None = None) -> StudySpec:
    if not isinstance(data, dict):
        raise StudyError(source, [("<root>", f"a study is a mapping, got {type(data).__name__}")])
    problems: list[tuple[str, str]] = []
    data = _interpolate(data, (), dict(os.environ) if env is None else env, problems)
    if problems:
        raise StudyError(source, problems)
    try:
        return StudySpec.model_validate(data)
    except ValidationError as e:
        raise StudyError(source, _pydantic_problems(e)) from None


def load_study(path: str | Path, env: dict[str, str] | None = None) -> StudySpec:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise StudyError(str(path), [("<file>", f"cannot read: {e.strerror}")]) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "<yaml>"
        raise StudyError(str(path), [(where, f"invalid YAML: {getattr(e, 'problem', e)}")]) from None
    return parse_study(data, str(path), env)


# ---------------------------------------------------------------- expansion


def _deep_merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def _set_dotted(d: dict, dotted: str, value: Any) -> dict:
    out = copy.deepcopy(d)
    cur = out
    parts = dotted.split(".")
    for p in parts[:-1]:
        cur = cur.setdefault(p, {})
        if not isinstance(cur, dict):
            raise ValueError(f"axis {dotted!r} goes through a non-mapping at {p!r}")
    cur[parts[-1]] = value
    return out


def run_name(p: PointSpec, repeat: int, repeats: int) -> str:
    """Readable name, e.g. 33n-e1x8-l2x8x128-g768 (encoder tp x dp, llm tp x ep x dp, gbs)."""
    e, l_ = p.encoder, p.llm
    enc = f"e{e.tp}x{e.dp}" + (f"p{e.pp}" if e.pp > 1 else "")
    llm = f"l{l_.tp}x{l_.ep}x{l_.dp}" + (f"p{l_.pp}" if l_.pp > 1 else "") + (f"t{l_.etp}" if l_.etp > 1 else "")
    name = f"{p.nodes}n-{enc}-{llm}-g{p.gbs}" + (f"-m{p.mbs}" if p.mbs > 1 else "")
    return name + (f"-r{repeat}" if repeats > 1 else "")


def run_id_of(study: StudySpec, point: PointSpec, repeat: int) -> str:
    """Stable id: a hash of the resolved config (study name, cluster, trainer, point, repeat)."""
    payload = {
        "study": study.name, "cluster": study.cluster.model_dump(mode="json"),
        "trainer": study.trainer.model_dump(mode="json"), "point": point.model_dump(mode="json"),
        "repeat": repeat,
    }
    blob = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def _raw_points(m: MatrixSpec, problems: list[tuple[str, str]]) -> list[tuple[str, dict]]:
    pts: list[tuple[str, dict]] = []
    for i, p in enumerate(m.points):
        pts.append((f"matrix.points[{i}]", _deep_merge(m.defaults, p)))
    if m.product:
        axes = list(m.product)
        for combo in itertools.product(*(m.product[a] for a in axes)):
            d = m.defaults
            label = "matrix.product{" + ", ".join(f"{a}={v}" for a, v in zip(axes, combo)) + "}"
            try:
                for a, val in zip(axes, combo):
                    d = _set_dotted(d, a, val)
            except ValueError as e:
                problems.append((f"matrix.product.{a}", str(e)))
                break
            pts.append((label, d))
    if not pts and m.defaults:
        pts.append(("matrix.defaults", copy.deepcopy(m.defaults)))
    return pts


def _expand(matrix: MatrixSpec, gpus_per_node: int, num_experts: int,
            study: StudySpec | None) -> tuple[list[PointResult], list[tuple[str, str]]]:
    """Expand the matrix; schema problems are returned, not raised, so every problem can be reported at once.
    Without a valid `study` (diagnosis of a broken file) points are only checked, no RunSpec is built."""
    problems: list[tuple[str, str]] = []
    results: list[PointResult] = []
    raw = _raw_points(matrix, problems)
    if not raw and not problems:
        problems.append(("matrix", "no points: give matrix.points and/or matrix.product"))
    index = 0
    seen: dict[str, str] = {}
    for label, d in raw:
        try:
            p = PointSpec.model_validate(d)
        except ValidationError as e:
            # Explicit points map back to their YAML path; product points to their axis combination.
            for path, msg in _pydantic_problems(e):
                problems.append((f"{label}.{path}", msg))
            continue
        gpn = gpus_per_node
        dp = p.llm.dp
        if dp is None:
            dp = topology.derive_llm_dp(p.nodes, gpn, p.encoder.tp, p.encoder.pp, p.encoder.dp,
                                        p.llm.tp, p.llm.pp, p.llm.cp)
        lay = topology.Layout(
            nodes=p.nodes, gpus_per_node=gpn, enc_tp=p.encoder.tp, enc_pp=p.encoder.pp, enc_dp=p.encoder.dp,
            llm_tp=p.llm.tp, llm_pp=p.llm.pp, llm_dp=dp if dp is not None else 0, llm_ep=p.llm.ep,
            llm_etp=p.llm.etp, llm_cp=p.llm.cp, num_experts=num_experts, gbs=p.gbs, mbs=p.mbs)
        if dp is None:
            viol = [topology.Violation(
                "tiling", f"llm.dp cannot be derived: {p.nodes}x{gpn} GPUs minus encoder "
                f"{p.encoder.tp * p.encoder.pp * p.encoder.dp} is not a multiple of llm.tp*cp*pp="
                f"{p.llm.tp * p.llm.cp * p.llm.pp}", None)]
        else:
            viol = topology.check(lay)
        p = p.model_copy(update={"llm": p.llm.model_copy(update={"dp": dp})})
        for r in range(p.repeats):
            if viol:
                results.append(PointResult(index, label, None, viol))
                index += 1
                break
            name = run_name(p, r, p.repeats)
            if name in seen:
                problems.append((label, f"duplicate run {name!r} (also {seen[name]})"))
                continue
            seen[name] = label
            spec = None
            if study is not None:
                spec = RunSpec(study=study.name, name=name, run_id=run_id_of(study, p, r), index=index, repeat=r,
                               point=p, layout=lay, cluster=study.cluster, trainer=study.trainer)
            results.append(PointResult(index, label, spec, []))
            index += 1
    return results, problems


def expand(study: StudySpec, source: str = "<study>") -> list[PointResult]:
    """All points of the matrix, each with its RunSpec or its violations. Raises StudyError for malformed
    points (unknown keys, wrong types) and duplicate run names; topology violations are returned per point."""
    results, problems = _expand(study.matrix, study.cluster.gpus_per_node,
                                PRESETS[study.trainer.model].llm.num_experts, study)
    if problems:
        raise StudyError(source, problems)
    return results


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a study: where (YAML path or point label), which rule, what, and what would fit."""

    path: str
    rule: str  # "yaml", "env", "schema" or a topology rule id (topology.Violation.rule)
    message: str
    fit: str | None = None

    def __str__(self) -> str:
        return f"{self.path}: [{self.rule}] {self.message}" + (f"; {self.fit}" if self.fit else "")


@dataclass
class Diagnosis:
    """Everything `validate` reports: the spec when it parsed, every point, and every problem found."""

    source: str
    study: StudySpec | None
    points: list[PointResult]
    problems: list[Problem]

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def runs(self) -> list[RunSpec]:
        return [p.run for p in self.points if p.run is not None]


def _partial(model: type[BaseModel], data: Any) -> Any:
    try:
        return model.model_validate(data if data is not None else {})
    except ValidationError:
        return None


def diagnose_data(data: Any, source: str = "<study>", env: dict[str, str] | None = None) -> Diagnosis:
    """Check a study document and report ALL its problems at once: unset ${ENV}, schema errors with their
    YAML paths, and the topology rules every point breaks. When the top level does not validate, the matrix
    is still checked against whatever cluster/trainer parts did (gpus_per_node, the model's experts)."""
    if not isinstance(data, dict):
        return Diagnosis(source, None, [], [Problem("<root>", "schema",
                                                    f"a study is a mapping, got {type(data).__name__}")])
    env_problems: list[tuple[str, str]] = []
    data = _interpolate(data, (), dict(os.environ) if env is None else env, env_problems)
    problems = [Problem(p, "env", m) for p, m in env_problems]
    study: StudySpec | None = None
    try:
        study = StudySpec.model_validate(data)
    except ValidationError as e:
        problems += [Problem(p, "schema", m) for p, m in _pydantic_problems(e)]
    if problems and study is not None:
        study = None  # an unset variable was replaced by "": the spec is not what the user meant
    if study is not None:
        matrix, gpn, experts = study.matrix, study.cluster.gpus_per_node, PRESETS[study.trainer.model].llm.num_experts
    else:
        # Only the two facts the topology needs are taken from the raw cluster/trainer sections.
        matrix = _partial(MatrixSpec, data.get("matrix"))
        cluster = data.get("cluster") if isinstance(data.get("cluster"), dict) else {}
        trainer = data.get("trainer") if isinstance(data.get("trainer"), dict) else {}
        gpn = cluster.get("gpus_per_node", ClusterSpec.model_fields["gpus_per_node"].default)
        gpn = gpn if isinstance(gpn, int) and not isinstance(gpn, bool) and 1 <= gpn <= 64 else None
        model = trainer.get("model", TrainerSpec.model_fields["model"].default)
        experts = PRESETS[model].llm.num_experts if isinstance(model, str) and model in PRESETS else None
        if matrix is None or gpn is None or experts is None:
            return Diagnosis(source, None, [], problems)
    points, point_problems = _expand(matrix, gpn, experts, study)
    problems += [Problem(p, "schema", m) for p, m in point_problems]
    for pr in points:
        problems += [Problem(pr.label, v.rule, v.message, v.fit) for v in pr.violations]
    return Diagnosis(source, study, points, problems)


def diagnose(path: str | Path, env: dict[str, str] | None = None) -> Diagnosis:
    """diagnose_data for a study file; unreadable files and YAML syntax errors are problems too."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        return Diagnosis(str(path), None, [], [Problem("<file>", "file", f"cannot read: {e.strerror}")])
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "<yaml>"
        return Diagnosis(str(path), None, [], [Problem(where, "yaml", f"invalid YAML: {getattr(e, 'problem', e)}")])
    return diagnose_data(data, str(path), env)


def runs_of(study: StudySpec, source: str = "<study>") -> list[RunSpec]:
    """Expanded runs; raises StudyError naming every infeasible point and every rule it breaks."""
    results = expand(study, source)
    bad = [(r.label, str(v)) for r in results if r.violations for v in r.violations]
    if bad:
        raise StudyError(source, bad)
    return [r.run for r in results if r.run is not None]


def load_run_yaml(path: str | Path) -> tuple[RunSpec, dict]:
    """Read a rendered run.yaml: the RunSpec plus the whole document (paths, provenance)."""
    doc = yaml.safe_load(Path(path).read_text())
    return RunSpec.from_dict(doc["run"]), doc


def run_yaml_doc(spec: RunSpec, run_dir: str | Path, provenance: dict | None = None) -> dict:
    """The document render writes to <run dir>/run.yaml (the trainer's whole input)."""
    from .rundir import RunDir

    rd = RunDir(Path(run_dir).resolve())
    ckpt = spec.trainer.checkpoint_dir or str(rd.checkpoints)
    return {
        "run": spec.to_dict(),
        "plan": spec.plan().to_dict(),
        "paths": {"run_dir": str(rd.root), "metrics": str(rd.metrics), "logs": str(rd.logs),
                  "checkpoints": ckpt},
        "provenance": provenance or {},
    }

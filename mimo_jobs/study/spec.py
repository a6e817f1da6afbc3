"""The study file's schema: typed, validated sections (pydantic), and the naming rules values must obey.

A study is `name`, `description`, `cluster`, `trainer` and a `matrix` of points (explicit `points` and/or a
`product` of axes over `defaults`). `load` reads a file into a `StudySpec`, `expand` turns its matrix into
runs (`runspec.RunSpec`), `diagnose` reports every problem of a file at once.
"""

from __future__ import annotations

import re
import typing
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationInfo,
    create_model,
    field_validator,
    model_validator,
)

import mimo_jobs.study.slurm_time as slurm_time
from mimo_jobs.errors import MimoJobsError
from mimo_jobs.model.arch import ArchError, module_name_problem
from mimo_jobs.model.attention import Attention
from mimo_jobs.model.resolve import resolved_field
from mimo_jobs.submit.executors import registry

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
# Sizes beyond any real cluster or run: a value past them is a typo (or hostile), and planning it would
# only spend memory and time. The largest machines have about 10^4 nodes and 10^5 GPUs.
MAX_NODES = 100_000
MAX_AXIS = 65_536  # one parallel axis (TP, PP, EP, CP, encoder DP)
MAX_DP = MAX_NODES * 64
MAX_BATCH = 100_000_000  # samples in one global batch
MAX_SEQ = 16_777_216
MAX_COUNT = 10**12  # iterations, samples


class StudyError(MimoJobsError, ValueError):
    """Bad study input; `problems` are (yaml_path, message) pairs, all of them, not only the first."""

    def __init__(self, source: str, problems: list[tuple[str, str]]):
        self.source = source
        self.problems = problems
        lines = [f"{source}: {len(problems)} problem(s)"] + [f"  {p}: {m}" for p, m in problems]
        super().__init__("\n".join(lines))


class _Strict(BaseModel):
    # inf and nan are never meant (a learning rate of .inf validates nothing and trains nothing)
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    # Fields added after run ids were first computed: left out of the id while at their default, so a run
    # of an older study keeps its id (and a completed run is not run again) after an upgrade
    # (study/expand.py id_payload).
    ID_LATER: ClassVar[frozenset[str]] = frozenset()

    @field_validator("*", mode="before")
    @classmethod
    def _no_booleans_as_numbers(cls, v: Any, info) -> Any:
        # pydantic reads YAML's true/false as 1/0 for a number field: `nodes: true` would be one node
        if isinstance(v, bool) and _is_number(cls.model_fields[info.field_name].annotation):
            raise ValueError(f"{v} is a YAML boolean (true/false/yes/no), not a number")
        return v


def _is_number(annotation: Any) -> bool:
    import typing

    args = typing.get_args(annotation)
    kinds = [a for a in (args or (annotation,)) if a is not type(None)]
    return bool(kinds) and all(a in (int, float) or a in ("int", "float") for a in kinds)


# ---------------------------------------------------------------- cluster


# Paths and image references reach srun flags (pyxis splits mounts on ',' and ':'), so they are
# restricted to characters that need no quoting and carry no separator.
PATH_WORD_RE = re.compile(r"^[A-Za-z0-9_./@+=~-]+\Z")
IMAGE_RE = re.compile(r"^[A-Za-z0-9_./@+=~#:-]+\Z")
MOUNT_RE = re.compile(r"^[A-Za-z0-9_./@+=~-]+(?::[A-Za-z0-9_./@+=~-]+(?::[a-z+]+)?)?\Z")


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
            raise ValueError(
                f"{v!r} is not an image reference or path (letters, digits, _./@+=~#:- only, "
                "e.g. nvcr.io#nvidia/pytorch:25.04-py3 or /images/mimo.sqsh)"
            )
        return v

    @field_validator("mounts")
    @classmethod
    def _mounts(cls, v: list[str]) -> list[str]:
        for m in v:
            if not MOUNT_RE.match(m):
                raise ValueError(
                    f"mount {m!r} must look like /src:/dst or /src:/dst:ro (no spaces, commas, "
                    "quotes or shell characters)"
                )
        return v

    @field_validator("workdir")
    @classmethod
    def _workdir(cls, v: str | None) -> str | None:
        if v is not None and not (PATH_WORD_RE.match(v) and v.startswith("/")):
            raise ValueError(f"workdir {v!r} must be an absolute path of letters, digits and _./@+=~-")
        return v


class HardwareSpec(_Strict):
    """What the capacity planner (predict, plan, validate's memory line) prices the runs on: a known GPU
    model, and the figures of this cluster that differ from its datasheet. Planning only: it is not part of
    a run's id and changes nothing that runs."""

    # Lower bounds: a thousandth of the slowest part anyone trains on (a laptop CPU: ~0.1 TFLOP/s, ~1 GB/s);
    # below them the planner's times overflow to infinity and its ratios to NaN.
    gpu: Literal["H100", "H200", "GH200", "B200", "GB200", "A100"] = "H100"
    memory_gib: float | None = Field(None, ge=0.001, le=4096)  # usable GPU memory
    peak_tflops: float | None = Field(None, ge=0.0001, le=100_000)  # dense BF16 per GPU
    nvlink_gbps: float | None = Field(None, ge=0.001, le=100_000)  # GB/s per GPU, one direction
    ib_gbps: float | None = Field(None, ge=0.001, le=100_000)  # GB/s per GPU across nodes, one direction
    # the layers the runs are priced for: Transformer Engine's (te) or megatron-core's local ones (local, what
    # the trainer builds where Transformer Engine is not installed): attention memory and compute speed
    layers: Literal["te", "local"] = "te"
    # the step-time model: `operators` (predict/operators.py: every GEMM, attention, element-wise kernel and
    # collective from published figures, the LLM's and every encoder module's; Transformer Engine layers) or
    # `flops` (the model's FLOPs at fitted per-generation efficiencies, predict/steptime.py; what prices the
    # rest)
    time_model: Literal["operators", "flops"] = "operators"
    # a measured operator table (benchmarks/gpu/ops.py's YAML; relative paths from the study file): the
    # operator model prices GEMMs and attention from this device's own times (predict/optable.py)
    ops: str | None = Field(None, min_length=1, max_length=4096)

    @field_validator("ops")
    @classmethod
    def _ops(cls, v: str | None, info: ValidationInfo) -> str | None:
        # read and checked where a study is read (its context), as data; run.yaml keeps the resolved path
        # unread: the table is for planning, and the trainer's nodes need not hold it
        if v is None or info.context is None:
            return v
        from mimo_jobs.study.opsfile import read_ops

        p = absolute_path(v, (info.context or {}).get("base_dir"))
        read_ops(p)  # a missing or malformed table fails here, naming the field it came from
        return p


class _ClusterCommon(_Strict):
    """What every executor reads of the cluster; ClusterSpec adds one section per executor."""

    executor: str = "slurm"  # a name of the executor registry
    time_limit: str = "01:00:00"
    gpus_per_node: int = Field(8, ge=1, le=64)
    accelerator: Literal["gpu", "cpu"] = "gpu"  # cpu: gpus_per_node means processes per node, gloo backend
    container: ContainerSpec | None = None
    env: dict[str, str] = Field(default_factory=dict)
    setup: list[str] = Field(
        default_factory=list
    )  # shell lines run before the launch (trusted, checked by bash -n)
    signal: str = "USR2@120"  # preemption/time-limit warning signal: the trainer checkpoints and exits
    requeue: bool = True
    max_retries: int = Field(2, ge=0, le=20)  # retries for flaky failures (watchdog timeouts, node failure)
    python: str = "python3"
    hardware: HardwareSpec | None = None  # the planner's GPU and its overrides

    @model_validator(mode="before")
    @classmethod
    def _flat_keys(cls, data: Any) -> Any:
        return registry.nest_flat_keys(data)

    @field_validator("executor")
    @classmethod
    def _executor(cls, v: str) -> str:
        if v not in registry.REGISTRY:
            raise ValueError(f"{v!r} is not an executor (one of: {', '.join(registry.REGISTRY)})")
        return v

    @model_validator(mode="after")
    def _section_of_executor(self) -> _ClusterCommon:
        entry = registry.REGISTRY[self.executor]
        if entry.section_required and getattr(self, self.executor) is None:
            raise ValueError(
                f"executor {self.executor!r} needs its section cluster.{self.executor} (docs/{entry.doc})"
            )
        return self

    def id_payload(self) -> dict:
        """The cluster as a run id hashes it (study/expand.py): planning-only `hardware` left out, SLURM's
        keys flat as studies wrote them before executors had sections, and a section of another executor
        only where it is set, so every run of an older study keeps its id."""
        return registry.flat_payload(self.model_dump(mode="json", exclude={"hardware"}))

    def section(self, name: str):
        """An executor's section as given, or its defaults."""
        return getattr(self, name) or registry.REGISTRY[name].section()

    @field_validator("time_limit")
    @classmethod
    def _time(cls, v: str) -> str:
        slurm_time.seconds(v)
        return str(v)

    @field_validator("signal")
    @classmethod
    def _signal(cls, v: str) -> str:
        if not re.match(r"^(B:)?(USR1|USR2|TERM|INT)@\d{1,5}\Z", v):
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
                    raise ValueError(
                        f"environment variable {k}: write the value as a quoted string "
                        f'("1" or "true"), not the YAML boolean {x}'
                    )
                out[k] = str(x) if isinstance(x, (int, float)) else x
            return out
        return v

    @field_validator("python")
    @classmethod
    def _python(cls, v: str) -> str:
        if not PATH_WORD_RE.match(v):
            raise ValueError(
                f"python {v!r} must be one command or path (e.g. python3 or /opt/venv/bin/python)"
            )
        return v

    def time_limit_seconds(self) -> int:
        return slurm_time.seconds(self.time_limit)


# The cluster: the common keys, plus one section per executor of the registry (`cluster.slurm`,
# `cluster.kubernetes`, ...), so a new executor's section needs no edit here. Studies written before the
# sections give SLURM's keys flat under `cluster:`; they are read into `cluster.slurm`.
ClusterSpec = create_model(
    "ClusterSpec",
    __base__=_ClusterCommon,
    __module__=__name__,
    __doc__="The study's `cluster:` section (docs/study-file.md).",
    **registry.section_fields(),
)


# ---------------------------------------------------------------- trainer


class LRSpec(_Strict):
    schedule: Literal["constant", "cosine", "linear", "wsd"] = "cosine"
    max: float = Field(3e-4, gt=0)
    min: float = Field(0.0, ge=0)
    warmup_samples: int = Field(0, ge=0, le=MAX_COUNT)
    decay_samples: int | None = Field(None, ge=1, le=MAX_COUNT)  # default: the whole run
    wsd_decay_samples: int | None = Field(None, ge=1, le=MAX_COUNT)  # length of WSD's final decay phase
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
    ID_LATER: ClassVar[frozenset[str]] = frozenset(
        {
            "packing",
            "packing_buffer_size",
            "max_tiles",
            "thumbnail",
            "stats",
            "audio_fraction",
            "audio_frames",
            "video_fraction",
            "video_frames",
            "trust_dataset_code",
        }
    )
    provider: Literal["mock", "energon"] = "mock"
    path: str | None = None  # energon dataset dir or blend yaml (relative: to the study file)
    num_workers: int = Field(0, ge=0, le=64)
    text_only_fraction: float = Field(0.25, ge=0, le=1)  # mock provider: share of samples with no image
    image_sizes: list[int] = Field(default_factory=lambda: [8, 12, 16])  # mock: square sides in pixels
    # local HuggingFace tokenizer directory (energon; relative: to the study file); built-in if None
    tokenizer: str | None = None
    # energon: a corrupt/incomplete/too-long sample stops the run naming shard and key, or is skipped and counted
    on_bad_sample: Literal["error", "skip"] = "error"
    # energon: a dataset whose .nv-meta loader is not this package's own is code; read it only when true
    trust_dataset_code: bool = False
    truncate_text: bool = False  # energon: cut text that does not fit seq_length (counted); images never cut
    shuffle_buffer_size: int | None = Field(100, ge=1)  # energon sample shuffle buffer (None: no shuffle)
    max_samples_per_sequence: int | None = Field(100, ge=1)  # energon: samples read in a row from one shard
    # energon: several samples share one seq_length row (attention and positions stay within each sample);
    # the packer chooses among packing_buffer_size samples at a time
    packing: bool = False
    packing_buffer_size: int = Field(32, ge=1, le=100_000)
    # an image larger than the encoder's image size becomes up to max_tiles tiles of that size (the grid of
    # the closest aspect ratio), plus the whole image at tile size when thumbnail (model/tiling.py)
    max_tiles: int = Field(1, ge=1, le=64)
    thumbnail: bool = False
    # `mimo-jobs data stats` JSON (relative: to the study file): predict and plan price its image and text
    # tokens; unset, they look beside data.path, else price one full-size image per sample
    stats: str | None = None
    # mock provider, for a model with an audio encoder: the share of samples that also carry one clip, and the
    # clip lengths in mel frames drawn from (data/mock.py)
    audio_fraction: float = Field(0.0, ge=0, le=1)
    audio_frames: list[int] = Field(default_factory=list, max_length=64)
    # mock provider: the share of image samples whose picture is a video instead, and its frame counts drawn
    # from (each image module embeds a video in groups of its temporal_patch_size frames)
    video_fraction: float = Field(0.0, ge=0, le=1)
    video_frames: list[Annotated[int, Field(ge=1, le=4096)]] = Field(default_factory=list, max_length=64)

    @field_validator("path", "tokenizer")
    @classmethod
    def _inputs(cls, v: str | None, info: ValidationInfo) -> str | None:
        # the one path rule (study/paths.py): taken from the study file's directory where a study is read;
        # run.yaml records them absolute, so the trainer finds them from any working directory. Links are
        # kept: data often lives inside a container's mounts, and an absolute path keeps its run id
        if v is None or info.context is None:
            return v
        return _beside_study(v, info, follow_links=False)

    @field_validator("stats")
    @classmethod
    def _stats(cls, v: str | None, info: ValidationInfo) -> str | None:
        # checked where a study is read (its context); run.yaml keeps the resolved path unread: the file is
        # for planning, and the trainer's nodes need not hold it
        if v is None or info.context is None:
            return v
        from pathlib import Path

        from mimo_jobs.contract.datastats import read_stats

        p = Path(absolute_path(v, (info.context or {}).get("base_dir")))
        read_stats(p)  # a missing or malformed file fails here, naming the field it came from
        return str(p)

    @model_validator(mode="after")
    def _check(self) -> DataSpec:
        if self.provider == "energon" and not self.path:
            raise ValueError("provider 'energon' needs data.path (dataset dir or blend yaml)")
        if self.packing and self.provider != "energon":
            raise ValueError("data.packing needs provider 'energon' (the mock provider does not pack)")
        return self


class FreezeSpec(_Strict):
    """Which modules keep their weights: `encoder: true` freezes every encoder module, `encoders: {audio:
    true}` the named ones (module names of trainer.model.encoders; `vision` is the one of `encoder:`)."""

    ID_LATER: ClassVar[frozenset[str]] = frozenset({"encoders"})
    encoder: bool = False
    llm: bool = False
    encoders: dict[str, bool] = Field(default_factory=dict)

    def frozen(self, module: str) -> bool:
        """Whether the encoder module of this name is frozen (the one rule the trainer reads)."""
        return self.encoder or self.encoders.get(module, False)

    def every_encoder(self, model) -> bool:
        """Whether every encoder module of trainer.model (a resolved field) is frozen."""
        if self.encoder or not self.encoders:
            return self.encoder
        from mimo_jobs.model.resolve import arch_of

        return all(self.frozen(n) for n in arch_of(model).encoders)


Recompute = Literal["none", "selective", "full"]


class RecomputeSpec(_Strict):
    """megatron-core's activation recompute per module: the encoder may recompute while the LLM does not."""

    encoder: Recompute = "none"
    llm: Recompute = "none"

    @classmethod
    def of(cls, value: str | RecomputeSpec) -> RecomputeSpec:
        """trainer.recompute as per-module settings (the one owner): one value holds for both modules."""
        return value if isinstance(value, RecomputeSpec) else cls(encoder=value, llm=value)

    def compact(self) -> str | dict[str, str]:
        """As a study file writes it: one value when both modules agree, else the mapping."""
        return self.encoder if self.encoder == self.llm else {"encoder": self.encoder, "llm": self.llm}


class WandbSpec(_Strict):
    """Weights & Biases logging of the same scalars as metrics.jsonl (needs `pip install wandb`)."""

    project: str = Field(min_length=1, max_length=128)
    mode: Literal["online", "offline", "disabled"] = "offline"  # offline: sync later with `wandb sync`
    entity: str | None = None
    group: str | None = None  # default: the study name


def validation_context(source: str | None) -> dict:
    """What validating a study needs beyond its data: the directory its relative paths (a model's
    hf_config) start from, the study file's own."""
    from pathlib import Path

    p = Path(source) if source and not source.startswith("<") else None
    return {"base_dir": p.parent if p is not None else None}


class MegatronCheckpoint(_Strict):
    # a Megatron-LM distributed (torch_dist) checkpoint of the LLM: the iter_N directory or its parent
    megatron: str = Field(min_length=1, max_length=4096)


def absolute_path(path: str, base_dir=None, follow_links: bool = True) -> str:
    """`path` made absolute: `~` expanded, a relative one taken from `base_dir` (when given), links resolved
    (or, without `follow_links`, only `.` and `..` taken out: a path the trainer reads inside a container
    must not become what a link on this machine points to). ValueError (which pydantic reports against the
    field) for a `~user` with no home or a symlink loop."""
    import os
    from pathlib import Path

    try:
        p = Path(path).expanduser()
        if not p.is_absolute() and base_dir is not None:
            p = Path(base_dir) / p
        return str(p.resolve()) if follow_links else os.path.normpath(os.path.abspath(p))
    except RuntimeError as e:  # pathlib: "Could not determine home directory.", "Symlink loop from ..."
        raise ValueError(f"{path!r}: {str(e).rstrip('.')}") from None
    except OSError as e:
        raise ValueError(f"{path!r}: {e.strerror or e}") from None


def _beside_study(path: str, info: ValidationInfo, follow_links: bool = True) -> str:
    """An absolute path: a relative one is taken from the study file's directory (when validating one)."""
    return absolute_path(path, (info.context or {}).get("base_dir"), follow_links)


class InitSpec(_Strict):
    """Where the run's weights start (docs/weights.md). Unset: every parameter from (seed, name, shape)."""

    ID_LATER: ClassVar[frozenset[str]] = frozenset({"encoders"})
    # a HuggingFace directory (config.json + *.safetensors, with or without an index), or a Megatron checkpoint
    llm: str | MegatronCheckpoint | None = None
    # a HuggingFace directory of the vision model, or of a full CLIP/SigLIP model (its vision tower is read):
    # the encoder module `vision`
    encoder: str | None = None
    # module name -> its HuggingFace directory (a vision model, or a Whisper model or encoder for an audio
    # module); which names the model has is model/hf_check.py's `encoder_sources` (it needs the model)
    encoders: dict[str, str] | None = None
    # any mimo-jobs checkpoint (a checkpoints directory or one iter_N in it), of any layout: continue from it
    checkpoint: str | None = Field(None, min_length=1, max_length=4096)
    # iteration 0, a fresh optimizer and scheduler (Megatron's --finetune); HF and Megatron sources always are
    weights_only: bool = False

    @field_validator("llm", "encoder")
    @classmethod
    def _source_dir(cls, v, info: ValidationInfo):
        # weights relative to the study file, like a model's hf_config: run.yaml records them absolute, so
        # the trainer finds them from any working directory
        if isinstance(v, MegatronCheckpoint):
            return MegatronCheckpoint(megatron=_beside_study(v.megatron, info))
        return v if v is None else _beside_study(v, info)

    @field_validator("encoders")
    @classmethod
    def _module_dirs(cls, v: dict[str, str] | None, info: ValidationInfo) -> dict[str, str] | None:
        return v if v is None else {n: _beside_study(d, info) for n, d in v.items()}

    @field_validator("checkpoint")
    @classmethod
    def _checkpoint_dir(cls, v: str | None, info: ValidationInfo) -> str | None:
        return v if v is None else _beside_study(v, info)

    @model_validator(mode="after")
    def _one_source(self) -> InitSpec:
        hf = self.llm is not None or self.encoder is not None or bool(self.encoders)
        if self.checkpoint is not None and hf:
            raise ValueError(
                "give trainer.init.checkpoint (every module from a mimo-jobs checkpoint) or trainer.init.llm/"
                "encoder/encoders (weights from HuggingFace or Megatron), not both"
            )
        if self.checkpoint is None and not hf:
            raise ValueError(
                "trainer.init names no source: give llm, encoder, encoders or checkpoint (or leave init out)"
            )
        return self


class TrainerSpec(_Strict):
    ID_LATER: ClassVar[frozenset[str]] = frozenset(
        {
            "command",
            "init",
            "attention",
            "overlap_grad_reduce",
            "overlap_param_gather",
            "grad_reduce_dtype",
            "tp_comm_overlap",
            "account_for_embedding_in_pipeline_split",
            "account_for_loss_in_pipeline_split",
        }
    )
    # a preset's name, or {encoder, llm} described by presets, inline fields or HF configs (model/resolve.py);
    # validation replaces a description by its resolved inline fields, so the spec never depends on a file
    model: str | dict[str, Any] = "tiny"
    seq_length: int = Field(64, ge=8, le=MAX_SEQ)
    # 0 only with trainer.init: load, save iteration 0 in this run's layout and exit (a conversion)
    train_iters: int | None = Field(None, ge=0, le=MAX_COUNT)
    train_samples: int | None = Field(None, ge=1, le=MAX_COUNT)
    lr: LRSpec = Field(default_factory=LRSpec)
    optimizer: OptimizerSpec = Field(default_factory=OptimizerSpec)
    data: DataSpec = Field(default_factory=DataSpec)
    log_interval: int = Field(1, ge=1, le=MAX_COUNT)
    save_interval: int | None = Field(None, ge=1, le=MAX_COUNT)
    checkpoint_dir: str | None = None  # default: <run dir>/checkpoints
    keep_checkpoints: int = Field(2, ge=1, le=1000)
    seed: int = Field(1234, ge=0, lt=2**63)
    # fp8: Transformer Engine's fp8 GEMMs over bf16 parameters (Megatron's --fp8-format); predict and plan
    # price it, the packaged trainer runs fp32 or bf16 (study/runtime_rules.py)
    precision: Literal["fp32", "bf16", "fp8"] = "fp32"
    freeze: FreezeSpec = Field(default_factory=FreezeSpec)
    use_distributed_optimizer: bool = False
    # megatron-core DDP's overlaps (DistributedDataParallelConfig): the gradient reduce starts bucket by
    # bucket during the last microbatch's backward instead of after it; the distributed optimizer's parameter
    # all-gather runs under the next iteration's forward instead of after the optimizer step. The packaged
    # trainer's default is neither (trainer/build.py).
    overlap_grad_reduce: bool = False
    overlap_param_gather: bool = False
    # the dtype gradients are accumulated and reduced in: fp32 (megatron-core's grad_reduce_in_fp32, the
    # packaged trainer's default) or bf16, the parameters' dtype (half the gradient buffer and its traffic)
    grad_reduce_dtype: Literal["fp32", "bf16"] = "fp32"
    # Transformer Engine's tensor-parallel communication overlap (userbuffers, Megatron's --tp-comm-overlap):
    # priced by the planner; the packaged trainer builds no userbuffers, so only false runs it
    tp_comm_overlap: bool = False
    # megatron-core's TransformerConfig flags that count the embedding and the loss as layers when the LLM's
    # layers are split over pipeline stages and model chunks (predict/pipesplit.py): predict and plan price
    # the split; the packaged trainer splits evenly, so only a study's own command may set them
    account_for_embedding_in_pipeline_split: bool = False
    account_for_loss_in_pipeline_split: bool = False
    timeout_s: int = Field(
        300, ge=10, le=7 * 24 * 3600
    )  # collective timeout; a dead peer ends the job instead of hanging
    tensorboard: bool = True  # event files under <run dir>/tensorboard/ (Megatron's tag names)
    # microbatches an encoder rank keeps ahead of their backward (1F1B across the bridge): bounds its saved
    # activations to this many microbatches whatever the iteration's count; 2 lets the encoder compute the
    # next microbatch while the LLM works on the last one
    encoder_inflight: int = Field(2, ge=1, le=64)
    # megatron-core's activation recompute: one value for both modules, or {encoder: full, llm: none};
    # RecomputeSpec.of gives the per-module settings
    recompute: Recompute | RecomputeSpec = "none"
    # the core attention of megatron-core's local layers (model/attention.py): torch's fused SDPA, or
    # megatron-core's DotProductAttention, which keeps every s x s score matrix; TE's layers run their own
    attention: Attention = "sdpa"
    wandb: WandbSpec | None = None
    init: InitSpec | None = None  # pretrained or earlier weights to start from (docs/weights.md)
    # Another training program (study/command.py renders it): a Jinja template of the run's values, run by
    # torchrun on every node instead of the packaged trainer. None: the packaged trainer.
    command: str | None = Field(None, min_length=1, max_length=16_384)

    @field_validator("command")
    @classmethod
    def _command(cls, v: str | None) -> str | None:
        return _command_text(v)

    @property
    def pipeline_split_layers(self) -> int:
        """Layers the two pipeline-split flags add to what megatron-core divides over the stages."""
        return int(self.account_for_embedding_in_pipeline_split) + int(
            self.account_for_loss_in_pipeline_split
        )

    @field_validator("recompute", mode="before")
    @classmethod
    def _recompute(cls, v: Any) -> Any:
        # one clear message instead of the union's two; a mapping whose modules agree is the one value, so
        # the same run has the same id however it is written
        modes = typing.get_args(Recompute)
        fit = f"use one of {', '.join(modes)}, or a mapping like {{encoder: full, llm: none}}"
        if isinstance(v, dict):
            bad = [k for k in v if k not in ("encoder", "llm")]
            if bad:
                raise ValueError(f"unknown module {bad[0]!r} (the modules are encoder and llm); {fit}")
            for k, x in v.items():
                if x not in modes:
                    raise ValueError(f"{k}: {x!r} is not a recompute setting; {fit}")
            spec = RecomputeSpec(**v)
            return spec.encoder if spec.encoder == spec.llm else spec
        if not isinstance(v, (str, RecomputeSpec)) or (isinstance(v, str) and v not in modes):
            raise ValueError(f"{v!r} is not a recompute setting; {fit}")
        return v

    @field_validator("data")
    @classmethod
    def _data_stats(cls, v: DataSpec, info: ValidationInfo) -> DataSpec:
        model = info.data.get("model")  # absent when the model itself is invalid (reported there)
        # counts made for another encoder or tiling misprice every run (checked where a study is read)
        if v.stats and model is not None and info.context is not None:
            from mimo_jobs.contract.datastats import read_stats
            from mimo_jobs.model.resolve import arch_of
            from mimo_jobs.model.tiling import ImageGeometry

            arch = arch_of(model)
            if arch.text_only:
                raise ValueError(
                    "stats: dataset statistics count image tokens, and trainer.model is text-only (no "
                    "encoder); remove trainer.data.stats"
                )
            # each image encoder's geometry (several encoders: the audio ones count clips, not pixels)
            for _, enc in arch.named_encoders:
                if enc.modality != "image":
                    continue
                geom = ImageGeometry.of(enc, v.max_tiles, v.thumbnail)
                problem = read_stats(v.stats).geometry_problem(geom)
                if problem:
                    raise ValueError(f"stats: {problem}")
        return v

    @field_validator("model")
    @classmethod
    def _model(cls, v: str | dict, info: ValidationInfo) -> str | dict:
        base_dir = (info.context or {}).get("base_dir")
        try:
            return resolved_field(v, base_dir)
        except ArchError as e:
            raise ValueError(e.describe()) from None

    @model_validator(mode="after")
    def _check(self) -> TrainerSpec:
        if self.freeze.encoders:
            from mimo_jobs.model.resolve import arch_of

            names = list(arch_of(self.model).encoders)
            bad = [n for n in self.freeze.encoders if n not in names]
            if bad:
                raise ValueError(
                    f"freeze.encoders: {bad[0]!r} is not an encoder module of trainer.model; its modules are "
                    f"{', '.join(names) or 'none (text-only)'}"
                )
        if (self.train_iters is None) == (self.train_samples is None):
            raise ValueError("give exactly one of trainer.train_iters or trainer.train_samples")
        why = ddp_setting_problem(self)
        if why:
            raise ValueError(why)
        if self.train_iters == 0 and self.init is None:
            raise ValueError(
                "trainer.train_iters: 0 trains nothing; it converts weights, so it needs trainer.init "
                "(or give train_iters >= 1)"
            )
        return self

    @property
    def model_given(self) -> bool:
        """trainer.model was written (not the default preset): a run of its own command is priced only then
        (study/priced.py). run.yaml leaves an unwritten model out, so this survives the round trip."""
        return "model" in self.model_fields_set


def ddp_setting_problem(t: TrainerSpec) -> str | None:
    """What megatron-core's DDP cannot do of a trainer section's settings: a parameter all-gather to overlap
    exists only with the distributed optimizer; gradients are accumulated in the parameters' dtype unless
    reduced in fp32, so a bf16 reduce needs bf16 parameters."""
    if t.overlap_param_gather and not t.use_distributed_optimizer:
        return (
            "overlap_param_gather overlaps the distributed optimizer's parameter all-gather, and "
            "use_distributed_optimizer is false: set use_distributed_optimizer: true, or "
            "overlap_param_gather: false"
        )
    if t.grad_reduce_dtype == "bf16" and t.precision == "fp32":
        return (
            "grad_reduce_dtype: bf16 reduces gradients in the parameters' dtype, and precision fp32 keeps "
            "fp32 parameters: use precision bf16 (or fp8), or grad_reduce_dtype: fp32"
        )
    return None


def _command_text(v: str | None) -> str | None:
    """A command template is text a shell reads: no NUL, and not blank."""
    if v is None:
        return v
    if "\0" in v:
        raise ValueError("a command cannot contain a NUL character")
    if not v.strip():
        raise ValueError("a command cannot be blank (leave it out to run the packaged trainer)")
    return v


# ---------------------------------------------------------------- matrix


class EncoderAxes(_Strict):
    tp: int = Field(1, ge=1, le=MAX_AXIS)
    pp: int = Field(1, ge=1, le=MAX_AXIS)
    dp: int = Field(1, ge=1, le=MAX_AXIS)


class LLMAxes(_Strict):
    ID_LATER: ClassVar[frozenset[str]] = frozenset({"vp"})
    tp: int = Field(1, ge=1, le=MAX_AXIS)
    pp: int = Field(1, ge=1, le=MAX_AXIS)
    vp: int = Field(1, ge=1, le=MAX_AXIS)  # virtual pipeline stages per rank (interleaved 1F1B)
    ep: int = Field(1, ge=1, le=MAX_AXIS)
    etp: int = Field(1, ge=1, le=MAX_AXIS)
    cp: int = Field(1, ge=1, le=MAX_AXIS)
    dp: int | None = Field(None, ge=1, le=MAX_DP)  # None: derived so that the world is tiled exactly


class PointSpec(_Strict):
    ID_LATER: ClassVar[frozenset[str]] = frozenset({"command", "encoders"})
    nodes: int = Field(ge=1, le=MAX_NODES)
    encoder: EncoderAxes = Field(default_factory=EncoderAxes)  # the one encoder's sizes (module `vision`)
    # each encoder module's sizes by its name in trainer.model.encoders (study/modules.py reads them)
    encoders: dict[str, EncoderAxes] | None = None
    llm: LLMAxes = Field(default_factory=LLMAxes)
    gbs: int = Field(ge=1, le=MAX_BATCH)
    mbs: int = Field(1, ge=1, le=MAX_BATCH)
    repeats: int = Field(1, ge=1, le=100)
    time_limit: str | None = None  # overrides cluster.time_limit for this point
    colocated: bool = False  # every GPU runs both modules (the baseline): the encoder takes the LLM's TP/DP
    command: str | None = Field(None, min_length=1, max_length=16_384)  # this point's own trainer.command

    @field_validator("command")
    @classmethod
    def _command(cls, v: str | None) -> str | None:
        return _command_text(v)

    @field_validator("encoders")
    @classmethod
    def _module_names(cls, v: dict[str, EncoderAxes] | None) -> dict[str, EncoderAxes] | None:
        for name in v or {}:
            bad = module_name_problem(name)
            if bad:
                raise ValueError(bad)
        if v is not None and not v:
            raise ValueError("names no module: give {name: {tp, dp}} for each encoder, or leave encoders out")
        return v

    @model_validator(mode="after")
    def _colocated_has_no_encoder(self) -> PointSpec:
        if self.colocated and self.encoder != EncoderAxes():
            raise ValueError(
                "a colocated point runs the encoder on every rank with the LLM's TP and DP: remove its "
                f"encoder sizes ({self.encoder.model_dump()}), or set colocated: false"
            )
        if self.colocated and self.encoders:
            raise ValueError(
                "a colocated point runs every encoder on every rank with the LLM's TP and DP: remove its "
                f"encoders sizes ({', '.join(self.encoders)}), or set colocated: false"
            )
        if self.encoders is not None and "encoder" in self.model_fields_set:
            raise ValueError(
                "give encoder (the one encoder, module vision) or encoders (sizes by module name), not both; "
                f"e.g. encoders: {{vision: {self.encoder.model_dump()}, ...}}"
            )
        return self

    @field_validator("time_limit")
    @classmethod
    def _time(cls, v: str | None) -> str | None:
        if v is not None:
            slurm_time.seconds(v)
        return v


class MatrixSpec(_Strict):
    defaults: dict[str, Any] = Field(default_factory=dict)  # partial point merged under every point
    points: list[dict[str, Any]] = Field(default_factory=list)
    product: dict[str, list[Any]] = Field(
        default_factory=dict
    )  # dotted axis -> values, e.g. "llm.tp": [1, 2]


class StudySpec(_Strict):
    name: str
    description: str = ""
    scaling: Literal["strong", "weak"] = "strong"
    baseline_nodes: int | None = Field(None, ge=1, le=MAX_NODES)
    cluster: ClusterSpec = Field(default_factory=ClusterSpec)
    trainer: TrainerSpec
    matrix: MatrixSpec
    # The directory of the study file this spec was read from (None: not read from a file). Not a field: it
    # says where the study is, not what it runs; run ids name the study's paths relative to it
    # (study/paths.py), and a command template reads it as {{ study_dir }}.
    _study_dir: str | None = PrivateAttr(None)

    @model_validator(mode="after")
    def _where(self, info: ValidationInfo) -> StudySpec:
        base = (info.context or {}).get("base_dir")
        if base is not None:
            self._study_dir = absolute_path(str(base), follow_links=False)
        return self

    @property
    def study_dir(self) -> str | None:
        return self._study_dir

    def catalog_fields(self) -> dict:
        """The study as the store's `studies` row keeps it (store.catalog.StudyRecord's fields)."""
        return {
            "name": self.name,
            "description": self.description,
            "scaling": self.scaling,
            "baseline_nodes": self.baseline_nodes,
            "spec": self.model_dump(mode="json"),
        }

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME_RE.match(v):
            raise ValueError(
                f"{v!r}: study names use letters, digits, '.', '_' and '-' (max 64, no leading '-')"
            )
        return v

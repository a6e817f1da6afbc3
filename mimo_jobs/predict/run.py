"""What the planner needs to know about one run, from its RunSpec (or a layout and a study's trainer): the
model, the layout, the batch, the precision and the images a sample carries."""

from __future__ import annotations

from dataclasses import dataclass, replace

from mimo_jobs.model.arch import EncoderArch, ModelArch
from mimo_jobs.model.attention import SDPA
from mimo_jobs.model.resolve import arch_of
from mimo_jobs.study.spec import RecomputeSpec
from mimo_jobs.study.topology import Layout, Trainer, rank_layout

from .datastats import DataMix, data_mix
from .flops import SampleFlops
from .modmix import module_mixes, sample_flops_by_module
from .pipesplit import EVEN, PipelineSplit


@dataclass(frozen=True)
class RunShape:
    layout: Layout
    preset: ModelArch
    seq_length: int
    microbatches: int  # of the layout: topology's rank_layout (one owner of the layout arithmetic)
    bf16: bool
    distributed_optimizer: bool
    optimizer: str  # adam | sgd
    encoder_inflight: int
    recompute: RecomputeSpec  # per module: none | selective | full
    # each encoder module's tokens per sample (modmix.ModuleMix), in rank order: one for a one-encoder
    # model, none for a text-only one; every figure of the plan is priced from them
    modules: tuple = ()
    frozen_encoder: bool = False
    frozen_llm: bool = False
    data_source: str = ""  # where the encoder tokens come from (modmix.ModuleMix.source, by module)
    # tokens a row of the batch carries (text + image, not padding) when the data says; None: a full row
    text_tokens_mean: float | None = None
    train_iters: int | None = None  # the study's length: iterations, or samples (one of the two)
    train_samples: int | None = None
    attention: str = SDPA  # trainer.attention: the local layers' core attention (model/attention.py)

    @property
    def image_tokens_mean(self) -> float:
        """Encoder tokens per sample, on average, every module's together (what the LLM receives)."""
        return sum((m.tokens_mean for m in self.modules), 0.0)

    @property
    def image_tokens_max(self) -> int:
        """Encoder tokens per sample at most, every module's together."""
        return sum(m.tokens_max for m in self.modules)

    @property
    def tokens_per_image(self) -> float:
        """E[n^2] / E[n] over the images of a model of one image module (0 otherwise): each module prices
        the attention core of its own mix."""
        return self.modules[0].tokens_per_item if len(self.modules) == 1 else 0.0

    @property
    def carried_tokens_per_sample(self) -> float:
        """The tokens one row really holds (the report's carried tokens): the data's text + image tokens per
        sample, capped at seq_length, when dataset statistics give the text; else a full row."""
        if self.text_tokens_mean is None:
            return float(self.seq_length)
        return min(float(self.seq_length), self.text_tokens_mean + self.image_tokens_mean)

    @property
    def carried_source(self) -> str:
        return "dataset statistics" if self.text_tokens_mean is not None else "assumed full rows"

    @property
    def image_assumed(self) -> bool:
        """The stated prior priced some module's image tokens (no dataset statistics): the verdicts that
        depend on it are checked at its low and high ends (assumed.py)."""
        return any(m.ends for m in self.modules)

    def at_end(self, end: int) -> RunShape:
        """This shape with every module the prior priced at the prior's low (0) or high (1) end."""
        return replace(self, modules=tuple(m.ends[end] if m.ends else m for m in self.modules))

    @property
    def image_range(self) -> tuple[float, float] | None:
        """Encoder tokens per sample at the prior's low and high ends (None: not assumed)."""
        if not self.image_assumed:
            return None
        return (self.at_end(0).image_tokens_mean, self.at_end(1).image_tokens_mean)

    def settings_json(self, model: str = "flops") -> dict:
        """The run's settings as priced by the time `model` (StepTime.model): what predict names for each run.
        The operator model prices fp8 GEMMs at the FP8 rate; the FLOPs model at bf16's."""
        return {
            "precision": "fp8" if self.fp8 else "bf16" if self.bf16 else "fp32",
            "grad_reduce_bytes": self.grad_reduce_bytes,
            "distributed_optimizer": self.distributed_optimizer,
            "overlap_dp": self.overlap_dp,
            "fsdp": self.fsdp,
            "virtual_stages": self.virtual_stages,
            "pipeline_split": self.pipeline_split.words(),
            "not_priced": [n for n, on in (("fp8 GEMM rate (priced as bf16)", self.fp8 and model == "flops"),
                                            ("tp_comm_overlap (the FLOPs model prices TP communication exposed)",
                                             self.tp_comm_overlap and model == "flops")) if on],
        }  # fmt: skip

    def settings_words(self, model: str = "flops") -> str:
        """settings_json in a line."""
        s = self.settings_json(model)
        words = [
            f"precision {s['precision']}",
            f"gradients reduced in {'fp32' if s['grad_reduce_bytes'] == 4 else 'bf16'}",
            "FSDP" if s["fsdp"] else "distributed optimizer" if s["distributed_optimizer"] else "DDP",
            "DP transfers overlapped" if s["overlap_dp"] else "DP transfers exposed",
        ]
        if s["virtual_stages"] > 1:
            words.append(f"{s['virtual_stages']} virtual stages")
        if self.pipeline_split.extra:
            words.append(s["pipeline_split"])
        out = ", ".join(words)
        return out + ("; not priced: " + ", ".join(s["not_priced"]) if s["not_priced"] else "")

    @property
    def dtype_bytes(self) -> int:
        return 2 if self.bf16 else 4

    @property
    def sequence_parallel(self) -> bool:
        """The run's own setting where it states one (`sp`); on with TP > 1 where it states tp_comm_overlap
        (Megatron-LM's validate_args refuses --tp-comm-overlap without --sequence-parallel); else what the
        packaged trainer does: models.py turns sequence parallelism on for MoE with TP > 1 only."""
        if self.sp is not None:
            return self.sp and self.layout.llm_tp > 1
        if self.tp_comm_overlap:
            return self.layout.llm_tp > 1
        return bool(self.preset.llm.num_experts) and self.layout.llm_tp > 1

    # bytes per element of the DDP gradient buffer: 4 with grad_reduce_in_fp32 (the packaged trainer,
    # trainer/build.py), 2 where a run reduces in bf16 (Megatron-Bridge's performance recipes turn
    # grad_reduce_in_fp32 off: scripts/performance/utils/helpers.py, set_basic_perf_overrides)
    grad_reduce_bytes: int = 4  # memory.GRAD_BYTES
    # FSDP with parameters, gradients and optimizer state sharded over DP (torch's FSDP2 as torchtitan runs
    # it, ZeRO-3), where a run says so; the packaged trainer runs megatron's DDP
    fsdp: bool = False
    # sequence parallelism as a run states it (a published run, a study's own command); None: as the
    # packaged trainer runs it
    sp: bool | None = None

    # model chunks per LLM pipeline stage (Megatron's interleaved 1F1B, --num-layers-per-virtual-pipeline-stage):
    # the layout's llm.vp (on_layout); the packaged trainer runs 1, a study's own command may run more
    virtual_stages: int = 1
    # megatron-core's account_for_embedding/loss_in_pipeline_split (pipesplit.py), where a run states it:
    # which layers each stage and model chunk holds; the packaged trainer splits evenly
    pipeline_split: PipelineSplit = EVEN
    # megatron-core's bias_activation_fusion on a gated SiLU MLP (activations.fuses_swiglu), which megatron-core
    # runs on GPUs turn on (the packaged trainer's trainer/model/kernels.py); false for a run of another
    # framework's layers (torchtitan's FSDP2 rows of benchmarks/published/runs.yaml)
    fused_swiglu: bool = True
    # the packaged trainer trains it (its limits apply to the layouts priced), or a command of the study's own
    packaged: bool = True
    # megatron-core's overlap_grad_reduce + overlap_param_gather (or FSDP's prefetch): the DP transfers run
    # under the backward of the last microbatch and the forward of the first; the packaged trainer runs
    # without (trainer/build.py)
    overlap_dp: bool = False
    # what the study states and the FLOPs model does not price, named in predict's output (settings_json):
    # fp8 is priced as bf16 by the FLOPs model (its GEMM rates are bf16's; the operator model prices the FP8
    # rate); tp_comm_overlap (Transformer Engine's userbuffers) exposes the TP communication there, and
    # overlaps it with its GEMMs in the operator model (operators.tp_block_overlap)
    fp8: bool = False
    tp_comm_overlap: bool = False


TEXT_ONLY = "no images (a text-only model)"


def model_mix(data, enc: EncoderArch | None, seq_length: int | None = None) -> DataMix:
    """datastats.data_mix's rule for a model's encoder (packed rows of `seq_length`); a text-only model (no
    encoder) sees no images, whatever its data says."""
    return DataMix(0.0, 0.0, 0, TEXT_ONLY) if enc is None else data_mix(data, enc, seq_length)


def image_mix(data, enc: EncoderArch | None, seq_length: int | None = None) -> tuple[float, float, int]:
    """(mean image tokens per sample, E[n^2]/E[n] per encoder sample, most tokens per sample) of a study's
    data, in the tokens the LLM receives: model_mix's rule (mock mix, dataset statistics, the stated prior,
    or none for a text-only model; per packed row of `seq_length` when the data packs)."""
    m = model_mix(data, enc, seq_length)
    return m.image_tokens_mean, m.tokens_per_image, m.image_tokens_max


def sample_flops(preset: ModelArch, seq_length: int, data) -> SampleFlops:
    """Training FLOPs of one sample (row) of a study's data (None: data unknown, the stated prior; none for a
    text-only model): each encoder module's by its mix (modmix), and the LLM's."""
    return sample_flops_by_module(preset, module_mixes(data, preset, seq_length), seq_length)[1]


def shape_of(layout: Layout, trainer, point_command: str | None = None, checked: bool = True) -> RunShape:
    """A RunShape from a layout and a spec.TrainerSpec (and the point's own command, if any): every encoder
    module's mix, in rank order. `checked` False: the layout is only where the model, cluster and batch are
    read (a plan's start), not checked."""
    preset = arch_of(trainer.model)
    mixes = module_mixes(trainer.data, preset, trainer.seq_length)
    shape = RunShape(
        **_run_fields(layout, trainer, preset, point_command),
        modules=mixes,
        data_source=data_source(mixes),
        text_tokens_mean=next((m.text_tokens_mean for m in mixes if m.text_tokens_mean is not None), None),
    )
    return on_layout(shape, layout) if checked else shape


def data_source(mixes: tuple) -> str:
    """Where the encoder tokens come from, in words: the one module's source, each module's by its name
    when there are several; none for a text-only model."""
    if not mixes:
        return TEXT_ONLY
    if len(mixes) == 1:
        return mixes[0].source
    return "; ".join(f"{m.name}: {m.source}" for m in mixes)


def _run_fields(layout: Layout, trainer, preset: ModelArch, point_command) -> dict:
    """The RunShape fields the trainer section gives, whatever the model's data mix."""
    return dict(
        layout=layout,
        preset=preset,
        seq_length=trainer.seq_length,
        microbatches=0,
        **study_settings(trainer),
        distributed_optimizer=trainer.use_distributed_optimizer,
        optimizer=trainer.optimizer.name,
        encoder_inflight=trainer.encoder_inflight,
        recompute=RecomputeSpec.of(trainer.recompute),
        attention=trainer.attention,
        frozen_encoder=trainer.freeze.encoder,
        frozen_llm=trainer.freeze.llm,
        train_iters=trainer.train_iters,
        train_samples=trainer.train_samples,
        packaged=not (point_command or trainer.command),
    )


def study_settings(trainer) -> dict:
    """The RunShape fields of a trainer section's precision and DDP settings (spec.TrainerSpec). fp8 keeps
    bf16 parameters (Transformer Engine casts to fp8 inside its GEMMs); a bf16 reduce needs them. The time
    model covers the DP transfers as one (steptime: the gradient reduce under the last backward, the
    parameter gather under the first forward), so it counts them overlapped where every one of them is."""
    gathered = trainer.use_distributed_optimizer
    return dict(
        bf16=trainer.precision != "fp32",
        fp8=trainer.precision == "fp8",
        grad_reduce_bytes=2 if trainer.grad_reduce_dtype == "bf16" else 4,
        overlap_dp=trainer.overlap_grad_reduce and (trainer.overlap_param_gather or not gathered),
        tp_comm_overlap=trainer.tp_comm_overlap,
        pipeline_split=PipelineSplit(
            trainer.account_for_embedding_in_pipeline_split, trainer.account_for_loss_in_pipeline_split
        ),
    )


def trainer_of(shape: RunShape) -> Trainer:
    """What topology's rules need of a shape: its model is text-only, the packaged trainer trains it."""
    return Trainer(
        text_only=shape.preset.text_only, packaged=shape.packaged, split_layers=shape.pipeline_split.extra
    )


def on_layout(shape: RunShape, layout: Layout) -> RunShape:
    """`shape` on another (feasible) layout, with what topology derives from it; raises TopologyError for
    an infeasible one."""
    plan = rank_layout(layout, trainer_of(shape))
    return replace(
        shape,
        layout=layout,
        microbatches=plan.num_microbatches,
        virtual_stages=layout.llm_vp,
    )

"""What the planner needs to know about one run, from its RunSpec (or a layout and a study's trainer): the
model, the layout, the batch, the precision and the images a sample carries."""

from __future__ import annotations

from dataclasses import dataclass

from mimo_jobs.study.presets import ModelPreset, get_preset
from mimo_jobs.study.topology import Layout


@dataclass(frozen=True)
class RunShape:
    layout: Layout
    preset: ModelPreset
    seq_length: int
    microbatches: int
    bf16: bool
    distributed_optimizer: bool
    optimizer: str  # adam | sgd
    encoder_inflight: int
    recompute: str  # none | selective | full
    image_tokens_mean: float  # encoder tokens per sample, on average (FLOPs, time)
    tokens_per_image: float  # E[n^2] / E[n] over images: prices the attention core of the mix exactly
    image_tokens_max: int  # encoder tokens per sample at most (memory: one full-size image)
    frozen_encoder: bool = False
    frozen_llm: bool = False

    @property
    def dtype_bytes(self) -> int:
        return 2 if self.bf16 else 4

    @property
    def sequence_parallel(self) -> bool:
        """models.py turns sequence parallelism on for MoE with TP > 1 only."""
        return bool(self.preset.llm.num_experts) and self.layout.llm_tp > 1

    @property
    def encoder_samples_per_microbatch(self) -> int:
        lay = self.layout
        return lay.mbs if lay.colocated else lay.mbs * lay.llm_dp // lay.enc_dp


def image_mix(data, patch: int, image_size: int) -> tuple[float, float, int]:
    """(mean tokens per sample, E[n^2]/E[n] per image, most tokens per sample) of a study's data: the mock
    provider's mix exactly, other data one full-size image per sample."""
    full = (image_size // patch) ** 2
    if data is None or getattr(data, "provider", "mock") != "mock":
        return float(full), float(full), full
    sizes = list(data.image_sizes) or [image_size]
    ns = [(s // patch) ** 2 for s in sizes]
    mean_n = sum(ns) / len(ns)
    per_image = sum(n * n for n in ns) / sum(ns) if sum(ns) else 0.0
    return (1 - data.text_only_fraction) * mean_n, per_image, max(ns)


def shape_of(layout: Layout, trainer) -> RunShape:
    """A RunShape from a layout and a spec.TrainerSpec."""
    preset = get_preset(trainer.model)
    mean, per_image, most = image_mix(trainer.data, preset.encoder.patch_size, preset.encoder.image_size)
    return RunShape(
        layout=layout,
        preset=preset,
        seq_length=trainer.seq_length,
        microbatches=layout.gbs // (layout.mbs * layout.llm_dp),
        bf16=trainer.precision == "bf16",
        distributed_optimizer=trainer.use_distributed_optimizer,
        optimizer=trainer.optimizer.name,
        encoder_inflight=trainer.encoder_inflight,
        recompute=trainer.recompute,
        image_tokens_mean=mean,
        tokens_per_image=per_image,
        image_tokens_max=most,
        frozen_encoder=trainer.freeze.encoder,
        frozen_llm=trainer.freeze.llm,
    )

"""Live curves where people look: TensorBoard event files and Weights & Biases, from the same records as
metrics.jsonl.

Tag names are Megatron-LM's (`training_log` in megatron/training/training.py: "lm loss", "learning-rate",
"grad-norm", "iteration-time" in seconds, "throughput" in TFLOP/s/GPU, "load_balancing_loss", "batch-size",
"loss-scale", the "... vs samples" twins), so a dashboard built for Megatron runs reads these too. The
heterogeneous step's phases are written as "<phase>-time" (seconds), like Megatron's timers.

`tensorboard --logdir runs/<study>` overlays every run of a study: each run writes under
`<run dir>/tensorboard/`. Only the rank that writes metrics.jsonl writes here.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from mimo_jobs.contract.iteration import IterationRecord

# Megatron logs these against the iteration and again against consumed samples
_VS_SAMPLES = ("lm loss", "learning-rate", "batch-size", "loss-scale", "grad-norm")


def scalars_of(rec: IterationRecord) -> dict[str, float]:
    """The scalars one iteration record is logged as, by Megatron's tag names (missing values left out)."""
    values = {
        "lm loss": rec.loss,
        "learning-rate": rec.lr,
        "batch-size": rec.gbs,
        "loss-scale": rec.loss_scale,
        "grad-norm": rec.grad_norm,
        "iteration-time": rec.elapsed_ms / 1e3,
        "throughput": rec.tflops_per_gpu,
        "load_balancing_loss": rec.moe_aux_loss,
        "tokens-per-second-per-gpu": rec.tokens_per_s_per_gpu,
        "samples-per-second": rec.samples_per_s,
    }
    for phase, ms in (rec.phases_ms or {}).items():
        values[f"{phase}-time"] = ms / 1e3
    for key, v in (rec.extras or {}).get("memory", {}).items():
        values[key] = v
    return {k: float(v) for k, v in values.items() if v is not None}


def samples_twins(scalars: dict[str, float]) -> dict[str, float]:
    return {f"{k} vs samples": scalars[k] for k in _VS_SAMPLES if k in scalars}


class Tracker(Protocol):
    def log(self, rec: IterationRecord) -> None: ...

    def close(self) -> None: ...


class TensorBoardTracker:
    """Event files under `<run dir>/tensorboard/` (torch.utils.tensorboard's SummaryWriter)."""

    def __init__(self, logdir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        logdir.mkdir(parents=True, exist_ok=True)
        self.writer = SummaryWriter(log_dir=str(logdir))

    def log(self, rec: IterationRecord) -> None:
        scalars = scalars_of(rec)
        for tag, v in scalars.items():
            self.writer.add_scalar(tag, v, rec.iteration)
        for tag, v in samples_twins(scalars).items():
            self.writer.add_scalar(tag, v, rec.consumed_samples)
        self.writer.flush()  # live: a reader sees each iteration as it ends

    def close(self) -> None:
        self.writer.close()


@dataclass(frozen=True)
class WandbSettings:
    project: str
    mode: str  # online | offline | disabled
    entity: str | None
    group: str  # the study: runs of one study compare in one W&B group
    name: str  # the run
    run_id: str  # stable across requeues: a resumed job continues the same W&B run
    dir: Path
    config: dict


class WandbTracker:
    """The same scalars through wandb (offline runs sync later with `wandb sync <dir>`)."""

    def __init__(self, s: WandbSettings) -> None:
        import wandb

        s.dir.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(
            project=s.project,
            entity=s.entity,
            group=s.group,
            name=s.name,
            id=s.run_id,
            resume="allow",
            mode=s.mode,
            dir=str(s.dir),
            config=s.config,
            settings=wandb.Settings(silent=True, console="off", x_disable_stats=True),
        )

    def log(self, rec: IterationRecord) -> None:
        scalars = scalars_of(rec)
        self.run.log({**scalars, "consumed-samples": rec.consumed_samples}, step=rec.iteration)

    def close(self) -> None:
        self.run.finish()


class Trackers:
    """Every tracker of a run, logged to and closed together; one that fails is closed and dropped with a
    message, so a dashboard never stops training."""

    def __init__(self, trackers: Iterable[Tracker] = ()) -> None:
        self.items = list(trackers)

    def log(self, rec: IterationRecord) -> None:
        for t in list(self.items):
            try:
                t.log(rec)
            except Exception as e:  # noqa: BLE001 - a full disk or a network error must not end the run
                print(f"mimo-jobs trainer: {type(t).__name__} stopped: {type(e).__name__}: {e}", flush=True)
                self.items.remove(t)

    def close(self) -> None:
        for t in self.items:
            t.close()
        self.items = []


def trackers_for(run, run_dir: Path | None) -> Trackers:
    """The trackers `run.trainer` asks for (none without a run dir: the reference run writes none)."""
    if run_dir is None:
        return Trackers()
    out: list[Tracker] = []
    cfg = run.trainer
    if cfg.tensorboard:
        from mimo_jobs.contract.rundir import RunDir

        out.append(TensorBoardTracker(RunDir(run_dir).tensorboard))
    if cfg.wandb is not None and cfg.wandb.mode != "disabled":
        out.append(WandbTracker(wandb_settings(run, run_dir)))
    return Trackers(out)


def wandb_settings(run, run_dir: Path) -> WandbSettings:
    w = run.trainer.wandb
    lay = run.layout
    return WandbSettings(
        project=w.project,
        mode=w.mode,
        entity=w.entity,
        group=w.group or run.study,
        name=run.name,
        run_id=run.run_id,
        dir=run_dir,
        config={
            "study": run.study,
            "run": run.name,
            "nodes": lay.nodes,
            "gpus_per_node": lay.gpus_per_node,
            "gbs": lay.gbs,
            "model": run.trainer.model,
        },
    )

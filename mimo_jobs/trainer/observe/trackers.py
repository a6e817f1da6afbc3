"""Live curves where people look: TensorBoard event files and Weights & Biases, from the same records as
metrics.jsonl.

Tag names are Megatron-LM's (`training_log` in megatron/training/training.py: "lm loss", "learning-rate",
"grad-norm", "iteration-time" in seconds, "throughput" in TFLOP/s/GPU, "load_balancing_loss", "batch-size",
"loss-scale", the "... vs samples" twins), so a dashboard built for Megatron runs reads these too. The
heterogeneous step's phases are written as "<phase>-time" (seconds), like Megatron's timers.

`tensorboard --logdir runs/<study>` overlays every run of a study: each run writes under
`<run dir>/tensorboard/`. Only the rank that writes metrics.jsonl writes here.

A dashboard never stops training: one that cannot start, log or close is left out with one warning line.
W&B online without an API key runs offline (sync later); with a key, its start is bounded by
WANDB_INIT_TIMEOUT_S and falls back to offline when the server cannot be reached in time.
"""

from __future__ import annotations

import netrc
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol
from urllib.parse import urlparse

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


WANDB_INIT_TIMEOUT_S = 20.0  # wandb's own default is 90 s, then the job fails
_WANDB_HOST = "https://api.wandb.ai"


def wandb_has_api_key(environ=os.environ, netrc_path: Path | None = None) -> bool:
    """An API key as wandb looks for one: WANDB_API_KEY, else a ~/.netrc (NETRC) entry for its host."""
    if environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(environ.get("WANDB_BASE_URL") or _WANDB_HOST).hostname or ""
    path = netrc_path or Path(environ.get("NETRC") or Path.home() / ".netrc")
    try:
        return netrc.netrc(str(path)).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def wandb_mode(requested: str, has_key: bool) -> str:
    """online needs an API key; without one wandb would stop the run, so it runs offline instead."""
    return "offline" if requested == "online" and not has_key else requested


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
            settings=wandb.Settings(
                silent=True, console="off", x_disable_stats=True, init_timeout=WANDB_INIT_TIMEOUT_S
            ),
        )

    def log(self, rec: IterationRecord) -> None:
        scalars = scalars_of(rec)
        self.run.log({**scalars, "consumed-samples": rec.consumed_samples}, step=rec.iteration)

    def close(self) -> None:
        self.run.finish()


def _warn(what: str, e: BaseException) -> None:
    print(f"mimo-jobs trainer: warning: {what}: {type(e).__name__}: {e}; training goes on", flush=True)


def start_tracker(name: str, make: Callable[[], Tracker]) -> Tracker | None:
    """`make()`, or None with one warning line when the dashboard cannot start."""
    try:
        return make()
    except Exception as e:  # noqa: BLE001 - a bad log directory or an unreachable server must not end the run
        _warn(f"{name} left out", e)
        return None


def start_wandb(s: WandbSettings, make: Callable[[WandbSettings], Tracker] = WandbTracker) -> Tracker | None:
    """W&B in the mode it can run in (see wandb_mode); an online start that fails retries offline."""
    s = replace(s, mode=wandb_mode(s.mode, wandb_has_api_key()))
    if s.mode != "online":
        return start_tracker("W&B", lambda: make(s))
    try:
        return make(s)
    except Exception as e:  # noqa: BLE001 - no network, a wrong key, a server timeout
        _warn("W&B online failed, running offline", e)
        return start_tracker("W&B", lambda: make(replace(s, mode="offline")))


class Trackers:
    """Every tracker of a run, logged to and closed together; one that fails is dropped with one warning
    line, so a dashboard never stops training."""

    def __init__(self, trackers: Iterable[Tracker | None] = ()) -> None:
        self.items = [t for t in trackers if t is not None]

    def log(self, rec: IterationRecord) -> None:
        for t in list(self.items):
            try:
                t.log(rec)
            except Exception as e:  # noqa: BLE001 - a full disk or a network error must not end the run
                _warn(f"{type(t).__name__} stopped", e)
                self.items.remove(t)

    def close(self) -> None:
        items, self.items = self.items, []
        for t in items:
            try:
                t.close()
            except Exception as e:  # noqa: BLE001 - the run has finished; its dashboard must not fail it
                _warn(f"{type(t).__name__} did not close", e)


def trackers_for(run, run_dir: Path | None) -> Trackers:
    """The trackers `run.trainer` asks for (none without a run dir: the reference run writes none)."""
    if run_dir is None:
        return Trackers()
    out: list[Tracker | None] = []
    cfg = run.trainer
    if cfg.tensorboard:
        from mimo_jobs.contract.rundir import RunDir

        logdir = RunDir(run_dir).tensorboard
        out.append(start_tracker("TensorBoard", lambda: TensorBoardTracker(logdir)))
    if cfg.wandb is not None and cfg.wandb.mode != "disabled":
        out.append(start_wandb(wandb_settings(run, run_dir)))
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

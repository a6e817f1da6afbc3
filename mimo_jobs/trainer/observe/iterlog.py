"""What the trainer prints and records (on the last LLM rank only).

- One Megatron-format iteration line per log interval (the fields and format of Megatron-LM's
  training_log), averaged over the interval like Megatron does.
- One mimo_jobs.contract.iteration.IterationRecord JSON line per iteration appended to paths.metrics, plus a
  "start" record carrying the resolved layout and an "end" record with the exit reason.
The first printed line states the full resolved layout.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from mimo_jobs.contract.iteration import IterationRecord
from mimo_jobs.predict.flops import flops_per_sample, one_module_per_kind


def layout_line(run, plan, mode: str, backend: str, kernels: str = "", notes=()) -> str:
    """The run's first line: the resolved layout, the communication backend, (`kernels`, from
    model/kernels.py) the layer backend and fused kernels, and `notes` (what loading trainer.init changed)."""
    lay = plan.layout
    if plan.fan == "modules":  # several encoder modules, each on ranks of its own: a bridge each
        bridge = "per module " + ", ".join(
            f"{m.name} {_fan(m.fan, m.lanes_per_encoder, m.encoders_per_lane)}, "
            f"{m.samples_per_encoder_microbatch} samples per encoder microbatch"
            for m in plan.encoders
        )
    else:
        bridge = (
            f"{_fan(plan.fan, plan.lanes_per_encoder, plan.encoders_per_lane)}, "
            f"{plan.samples_per_encoder_microbatch} samples per encoder microbatch"
        )
    moe = (
        f" ep={lay.llm_ep} etp={lay.llm_etp} experts={lay.num_experts} expert-dp={plan.expert_dp}"
        if lay.num_experts
        else ""
    )
    return (
        f"mimo-jobs trainer: run {run.name} ({run.run_id}) study {run.study} | mode {mode} | backend {backend} "
        f"{'| ' + kernels + ' ' if kernels else ''}| world {plan.world} = {lay.nodes} nodes x {lay.gpus_per_node} | encoder ranks "
        f"[{plan.enc_rank_start},{plan.enc_rank_end}) {_encoder_sizes(lay)} | "
        f"llm ranks [{plan.llm_rank_start},{plan.llm_rank_end}) tp={lay.llm_tp} pp={lay.llm_pp} "
        f"dp={lay.llm_dp}{moe} | bridge {bridge} | gbs={lay.gbs} mbs={lay.mbs} microbatches={plan.num_microbatches} | model "
        f"{model_summary(run.trainer.model)} seq={run.trainer.seq_length} precision={run.trainer.precision} "
        f"freeze(encoder={run.trainer.freeze.encoder}, llm={run.trainer.freeze.llm}"
        + "".join(f", {n}={v}" for n, v in run.trainer.freeze.encoders.items())
        + ")"
        + "".join(f" | {n}" for n in notes)
    )


def model_summary(model) -> str:
    """trainer.model in a few words: a preset's name, or a description's name and each side's preset (or
    `hf_config` file, or `inline`); the whole description is in run.yaml."""
    if not isinstance(model, dict):
        return str(model)

    def side(v) -> str:
        if isinstance(v, dict):
            if v.get("preset"):
                return str(v["preset"])
            return Path(str(v["hf_config"])).name if v.get("hf_config") else "inline"
        return str(v)

    parts = [f"encoder {side(model['encoder'])}"] if model.get("encoder") is not None else []
    parts += [f"{n} {side(v)}" for n, v in (model.get("encoders") or {}).items()]
    if model.get("llm") is not None:
        parts.append(f"llm {side(model['llm'])}")
    return f"{model.get('name') or 'custom'} ({', '.join(parts)})"


def init_lines(init, arch) -> list[str]:
    """One line per module: where its weights start (trainer.init), before any resume from this run's own
    checkpoint (said apart when it happens)."""
    from mimo_jobs.model.hf_check import encoder_sources

    if init is not None and init.checkpoint:
        how = "weights only" if init.weights_only else "weights, optimizer and position"
        return [f"every module: from the checkpoint {init.checkpoint} ({how})"]
    found = encoder_sources(init, arch) if init is not None else {}
    out = [
        f"{n}: " + (f"loaded from {found[n][0]}" if n in found else "random init")
        for n, _ in arch.named_encoders
    ]
    llm = init.llm if init is not None else None
    if llm is None:
        out.append("llm: random init")
    elif isinstance(llm, str):
        out.append(f"llm: loaded from {llm}")
    else:
        out.append(f"llm: loaded from the Megatron checkpoint {llm.megatron}")
    return out


def _fan(fan: str, lanes_per_encoder: int, encoders_per_lane: int) -> str:
    return {
        "out": f"fan-out 1->{lanes_per_encoder} (each encoder replica serves {lanes_per_encoder} LLM lanes)",
        "in": f"fan-in {encoders_per_lane}->1 ({encoders_per_lane} encoder replicas per LLM lane)",
        "1:1": "1:1",
        "colocated": "none (colocated: every rank runs the encoder and the LLM)",
    }[fan]


def _encoder_sizes(lay) -> str:
    """`tp=1 pp=1 dp=2` of a model's one encoder module (the banner's older form, which log readers know);
    each module's by name when there are several."""
    if not lay.several:
        m = lay.encoders[0]
        return f"tp={m.tp} pp={m.pp} dp={m.dp}"
    return " ".join(f"{m.name}:tp={m.tp},pp={m.pp},dp={m.dp}" for m in lay.encoders)


def megatron_line(
    it: int,
    iters: int,
    consumed: int,
    elapsed_ms: float,
    tflops: float | None,
    lr: float,
    gbs: int,
    loss: float,
    aux: float | None,
    grad_norm: float | None,
    skipped: int,
    nan: int,
    rates: TokenRates | None = None,
    now: _dt.datetime | None = None,
) -> str:
    ts = (now or _dt.datetime.now()).strftime("%Y-%m-%d %H:%M:%S.%f")
    s = f" [{ts}] iteration {it:8d}/{iters:8d} | consumed samples: {consumed:12d} |"
    s += f" elapsed time per iteration (ms): {elapsed_ms:.1f} |"
    if tflops is not None:
        s += f" throughput per GPU (TFLOP/s/GPU): {tflops:.1f} |"
    s += f" learning rate: {lr:.6E} | global batch size: {gbs:5d} | lm loss: {loss:.6E} |"
    if aux is not None:
        s += f" load_balancing_loss: {aux:.6E} |"
    s += " loss scale: 1.0 |"
    if grad_norm is not None:
        s += f" grad norm: {grad_norm:.3f} |"
    s += f" number of skipped iterations: {skipped:3d} | number of nan iterations: {nan:3d} |"
    if rates is not None:
        s += (
            f" carried tokens/s/GPU: {rates.carried_per_gpu:.1f} | loss-bearing tokens/s/GPU: "
            f"{rates.loss_per_gpu:.1f} | padded slots: {rates.padded:.1%} |"
        )
    return s


@dataclass
class TokenRates:
    """Per GPU over a log interval: the tokens carried and those bearing loss per second, and the share of
    the batch's slots (gbs * seq_length) that held padding."""

    carried_per_gpu: float
    loss_per_gpu: float
    padded: float


def token_rates(recs: list, world: int, slots: int) -> TokenRates | None:
    """The interval's token rates from its records (None when the carried tokens were not counted)."""
    secs = sum(r.elapsed_ms for r in recs) / 1e3
    if secs <= 0 or not slots or any(r.carried_tokens is None for r in recs):
        return None
    carried = sum(r.carried_tokens for r in recs)
    return TokenRates(
        carried / secs / world, sum(r.tokens for r in recs) / secs / world, 1 - carried / (slots * len(recs))
    )


def _environment(run_provenance: dict | None = None) -> dict:
    """What the report needs beyond the layout: the GPU model (for MFU) and where the code came from (the
    image's recorded commit inside the container, else the checkout's, recorded in run.yaml by render)."""
    from mimo_jobs.image import image_provenance

    try:
        prov = image_provenance() or {}
    except (RuntimeError, TypeError, ValueError):  # a damaged provenance file must not stop training
        prov = {}
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    return {
        "gpu": gpu,
        "torch": torch.__version__,
        "image": prov or None,
        "git_sha": prov.get("git_sha")
        or os.environ.get("MIMO_JOBS_GIT_SHA")
        or (run_provenance or {}).get("git_sha"),
    }


def memory_facts() -> dict[str, int]:
    """This rank's memory now, by Megatron's tag names (bytes): the CUDA allocator's figures on a GPU, the
    process's peak resident set on CPU."""
    import resource

    if torch.cuda.is_available():
        return {
            "mem-allocated-bytes": torch.cuda.memory_allocated(),
            "mem-max-allocated-bytes": torch.cuda.max_memory_allocated(),
            "mem-reserved-bytes": torch.cuda.memory_reserved(),
        }
    return {"mem-max-rss-bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


@dataclass
class IterLogger:
    run: object
    plan: object
    metrics_path: Path | None
    train_iters: int
    active: bool  # only the last LLM rank (or the reference process) writes
    echo: bool = True
    provenance: dict | None = None  # run.yaml's provenance (render: version, git sha)
    trackers: object = None  # trackers.Trackers: TensorBoard / W&B, fed the same records
    _acc: list = field(default_factory=list)

    def __post_init__(self):
        self.job_id = os.environ.get("MIMO_JOBS_JOB_ID") or os.environ.get("SLURM_JOB_ID") or "local"
        self.attempt = int(os.environ.get("MIMO_JOBS_ATTEMPT") or os.environ.get("SLURM_RESTART_COUNT") or 0)
        if self.active and self.metrics_path is not None:
            self.metrics_path.parent.mkdir(parents=True, exist_ok=True)

    def _clip_frames(self, preset) -> int | None:
        """The mel frames of the clips an audio module's tokens are priced in: the run's data as the planner
        reads it (modmix.audio_mix: the mock provider's clips, dataset statistics, else full-length clips);
        None without an audio module. Read once."""
        if not hasattr(self, "_frames"):
            from mimo_jobs.predict.modmix import audio_mix

            audio = [(n, a) for n, a in preset.named_encoders if a.modality == "audio"]
            self._frames = audio_mix(*audio[0], self.run.trainer.data).frames if audio else None
        return self._frames

    def _write(self, rec: IterationRecord) -> None:
        if self.active and self.metrics_path is not None:
            with open(self.metrics_path, "a") as f:
                f.write(json.dumps(rec.to_json()) + "\n")

    def _rec(self, kind: str, **kw) -> IterationRecord:
        base = {
            "kind": kind,
            "run_id": self.run.run_id,
            "job_id": self.job_id,
            "attempt": self.attempt,
            "time": _dt.datetime.now(_dt.timezone.utc).isoformat(),
            "iteration": 0,
            "train_iters": self.train_iters,
            "consumed_samples": 0,
            "elapsed_ms": 0.0,
            "lr": 0.0,
            "gbs": self.plan.layout.gbs,
            "loss": 0.0,
            "grad_norm": None,
        }
        base.update(kw)
        return IterationRecord(**base)

    def start(self, line: str, mode: str, backend: str, sources: list[str] = ()) -> None:
        """The first line (`line`: layout_line) and one line per module of `sources` (init_lines)."""
        if not self.active:
            return
        env = _environment(self.provenance)
        print(
            f"{line} | provenance git {env['git_sha'] or 'unknown'} image "
            f"{(env['image'] or {}).get('base_image', 'none')} torch {env['torch']} gpu {env['gpu'] or 'none'}",
            flush=True,
        )
        for s in sources:
            print(f"mimo-jobs trainer: {s}", flush=True)
        self._write(
            self._rec(
                "start",
                extras={"layout": line, "mode": mode, "backend": backend, "plan": self.plan.to_dict(), **env},
            )
        )

    def end(self, reason: str, iteration: int, consumed: int) -> None:
        if self.trackers is not None:
            self.trackers.close()
        if not self.active:
            return
        self._write(
            self._rec("end", iteration=iteration, consumed_samples=consumed, extras={"reason": reason})
        )
        print(f"mimo-jobs trainer: finished ({reason}) after iteration {iteration}", flush=True)

    def iteration(self, stats, consumed: int, preset, seq_length: int) -> IterationRecord | None:
        if not self.active:
            return None
        lay = self.plan.layout
        world = self.plan.world
        el = max(stats.elapsed_s, 1e-9)
        img_per_sample = stats.image_tokens / max(lay.gbs, 1)
        tflops = None  # two modules of one kind: the counts do not say whose tokens, so no figure is claimed
        if one_module_per_kind(preset):
            audio = stats.audio_tokens / max(lay.gbs, 1)
            fps = flops_per_sample(
                preset,
                seq_length,
                round(img_per_sample),
                audio_tokens=audio,
                clip_frames=self._clip_frames(preset),
            )
            tflops = fps.total * lay.gbs / el / world / 1e12
        # the headline: tokens the batch carries (not its padded slots; padding is counted apart)
        carried = stats.carried_tokens or lay.gbs * seq_length
        tok_s = carried / el
        rec = self._rec(
            "iteration",
            iteration=stats.iteration,
            consumed_samples=consumed,
            elapsed_ms=el * 1e3,
            lr=stats.lr,
            loss=stats.loss,
            grad_norm=stats.grad_norm,
            skipped=int(stats.skipped),
            nan=int(stats.nan),
            tokens=stats.tokens,
            carried_tokens=stats.carried_tokens or None,
            image_tokens=stats.image_tokens,
            samples_per_s=lay.gbs / el,
            tokens_per_s=tok_s,
            tokens_per_s_per_gpu=tok_s / world,
            tflops_per_gpu=tflops,
            moe_aux_loss=stats.moe_aux_loss,
            phases_ms={k: v * 1e3 for k, v in stats.phases_s.items()},
            extras={
                "image_tokens": stats.image_tokens,
                # a model with an audio encoder: the audio embeddings the LLM consumed
                **(
                    {"audio_tokens": stats.audio_tokens}
                    if any(e.modality == "audio" for e in preset.encoders.values())
                    else {}
                ),
                "world": world,
                "memory": {**memory_facts(), "saved-activation-peak-bytes": stats.saved_peak_bytes},
            },
        )
        self._write(rec)
        if self.trackers is not None:
            self.trackers.log(rec)
        self._acc.append(rec)
        it = stats.iteration
        interval = self.run.trainer.log_interval
        if it % interval == 0 or it == 1 or it == self.train_iters:
            acc, self._acc = self._acc, []
            n = len(acc)
            line = megatron_line(
                it,
                self.train_iters,
                consumed,
                sum(r.elapsed_ms for r in acc) / n,
                None if rec.tflops_per_gpu is None else sum(r.tflops_per_gpu for r in acc) / n,
                rec.lr,
                lay.gbs,
                sum(r.loss for r in acc) / n,
                (sum(r.moe_aux_loss for r in acc) / n) if rec.moe_aux_loss is not None else None,
                rec.grad_norm,
                sum(r.skipped for r in acc),
                sum(r.nan for r in acc),
                token_rates(acc, world, lay.gbs * seq_length),
            )
            if self.echo:
                print(line, flush=True)
        return rec

"""Preemption and time limits: every rank stops at the same step, saves together and exits for a requeue.

A handler for SIGTERM / SIGUSR1 / SIGUSR2 only sets a flag (nothing else is async-signal-safe). Once per
step every rank contributes its flag (signal seen, deadline near) to one MAX all-reduce over the world, so
all ranks decide identically even when the signal reached only some of them (SLURM's `--signal` goes to the
step's tasks; torchrun forwards SIGTERM to its workers). Then the loop saves a checkpoint and exits.

The requeue contract (exit code, marker file, log line) is `mimo_jobs.contract.requeue`'s.
Time limit: the trainer stops on its own when the deadline is near. The deadline is MIMO_JOB_DEADLINE
    (epoch seconds, exported by the sbatch script, e.g. job start + time limit) or SLURM_JOB_END_TIME.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from mimo_jobs.contract.requeue import REQUEUE_MARKER

STOP_SIGNALS = ("SIGTERM", "SIGUSR1", "SIGUSR2")
DEADLINE_ENV = "MIMO_JOB_DEADLINE"
# Seconds kept free before the deadline besides one step + one save (default 30; large checkpoints need more).
MARGIN_ENV = "MIMO_JOB_DEADLINE_MARGIN_S"


def margin_from_env(env: dict | None = None, default: float = 30.0) -> float:
    env = os.environ if env is None else env
    v = env.get(MARGIN_ENV)
    if not v:
        return default
    try:
        return float(v)
    except ValueError:
        raise ValueError(f"environment variable {MARGIN_ENV}={v!r} is not a number of seconds") from None


def deadline_from_env(env: dict | None = None) -> float | None:
    """The job's end (epoch seconds) if the launch told us: MIMO_JOB_DEADLINE, else SLURM_JOB_END_TIME."""
    env = os.environ if env is None else env
    for k in (DEADLINE_ENV, "SLURM_JOB_END_TIME"):
        v = env.get(k)
        if v:
            try:
                return float(v)
            except ValueError:
                raise ValueError(f"environment variable {k}={v!r} is not epoch seconds") from None
    return None


@dataclass(frozen=True)
class StopDecision:
    reason: str  # "signal:SIGUSR2", "time_limit", or both joined with "+"
    signal_name: str | None  # the signal this rank saw (None if only other ranks saw one)


class PreemptionWatch:
    """Install once after init_process_group; call `should_stop()` once per step on every rank."""

    def __init__(
        self,
        deadline: float | None = None,
        margin_s: float = 30.0,
        signals: tuple[str, ...] = STOP_SIGNALS,
        term_grace_s: float | None = None,
    ):
        self.deadline = deadline
        self.term_grace_s = term_grace_s  # None: 5 s + 2 x (longest step + save), see _arm_term_deadline
        self.margin_s = margin_s
        self.signals = signals
        self.received: str | None = None
        self._timer = None
        self._previous: dict = {}
        self._step_s = 0.0  # longest recent step and save: the time the last step before the limit needs
        self._save_s = 0.0

    # -- local state
    def _handler(self, signum, frame) -> None:
        if self.received is None:
            self.received = signal.Signals(signum).name
            if signum == signal.SIGTERM:
                self._arm_term_deadline()

    def _arm_term_deadline(self) -> None:
        """torchrun also sends SIGTERM when a sibling worker died; then this rank sits in a collective that
        never returns and would only die by torchrun's SIGKILL 30 s later. A healthy world stops and saves
        within one step + one save, so a rank still alive well after that exits by itself."""
        import threading

        grace = (
            self.term_grace_s if self.term_grace_s is not None else 5.0 + 2.0 * (self._step_s + self._save_s)
        )

        def expire() -> None:
            print(
                f"mimo-jobs trainer: no world-wide stop within {grace:.0f} s of SIGTERM (a peer is gone?): "
                "exiting",
                file=sys.stderr,
                flush=True,
            )
            os._exit(128 + signal.SIGTERM)

        self._timer = threading.Timer(grace, expire)
        self._timer.daemon = True
        self._timer.start()

    def install(self) -> PreemptionWatch:
        for name in self.signals:
            sig = getattr(signal, name)
            self._previous[sig] = signal.signal(sig, self._handler)
        return self

    def settle(self) -> None:
        """The run has decided how it ends (completed, or stopped with its checkpoint saved): a stop signal
        from now on changes nothing. It is ignored, not left to the interpreter's exit, which gives the
        signals it handled their default action back (terminate): a job whose scheduler sends its warning
        signal just as the last iteration finished would otherwise end killed by it, counted as failed."""
        for name in self.signals:
            signal.signal(getattr(signal, name), signal.SIG_IGN)

    def uninstall(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        for sig, h in self._previous.items():
            signal.signal(sig, h)
        self._previous.clear()

    def note_step(self, seconds: float) -> None:
        self._step_s = max(seconds, 0.9 * self._step_s)

    def note_save(self, seconds: float) -> None:
        self._save_s = max(seconds, self._save_s)

    def time_needed(self) -> float:
        """Seconds that must remain to run one more step and save after it."""
        return self.margin_s + 1.5 * (self._step_s + self._save_s)

    def local_state(self, now: float | None = None) -> tuple[int, bool]:
        """(number of the signal this rank received or 0, deadline near)."""
        sig = int(getattr(signal, self.received)) if self.received else 0
        near = False
        if self.deadline is not None:
            now = time.time() if now is None else now
            near = self.deadline - now <= self.time_needed()
        return sig, near

    # -- the world-wide decision
    def should_stop(self) -> StopDecision | None:
        """Collective (every rank, every step): the same answer on every rank, naming the signal even on
        ranks that did not receive it (MAX of the signal numbers)."""
        sig, near = self.local_state()
        if dist.is_initialized() and dist.get_world_size() > 1:
            dev = "cuda" if dist.get_backend() == "nccl" else "cpu"
            t = torch.tensor([sig, int(near)], dtype=torch.int32, device=dev)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            sig, near = int(t[0].item()), bool(t[1].item())
        if not sig and not near:
            return None
        parts = []
        if sig:
            parts.append(f"signal:{signal.Signals(sig).name}")
        if near:
            parts.append("time_limit")
        return StopDecision("+".join(parts), self.received)


def write_requeue_marker(
    checkpoint_dir: str | Path, iteration: int, reason: str, job_id: str | None = None
) -> Path:
    """Rank 0, after the checkpoint is complete: tell the launch script to requeue (see module doc)."""
    d = Path(checkpoint_dir)
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / (REQUEUE_MARKER + ".tmp")
    tmp.write_text(
        json.dumps(
            {
                "iteration": iteration,
                "reason": reason,
                "job_id": job_id,
                "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            }
        )
        + "\n"
    )
    os.replace(tmp, d / REQUEUE_MARKER)
    return d / REQUEUE_MARKER


def read_requeue_marker(checkpoint_dir: str | Path) -> dict | None:
    p = Path(checkpoint_dir) / REQUEUE_MARKER
    try:
        return json.loads(p.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None

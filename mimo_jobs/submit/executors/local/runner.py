"""The local executor's job process: `python -m mimo_jobs.submit.executors.local.runner STATE_FILE ...`.

Started detached (own session) by `LocalExecutor.submit`, so the submitting CLI may exit while it runs. It
records the same facts SLURM does in STATE_FILE (JSON, replaced atomically): PENDING while it waits for a
machine slot, RUNNING with start time, then COMPLETED / FAILED (exit code) / CANCELLED (SIGTERM from
`mimo-jobs cancel`) / TIMEOUT (time limit). Like SLURM it sends the warning signal `signal_s` seconds before
the limit (but not before half of it), then TERM at the limit and KILL `KILL_WAIT_S` later, to launch.sh's
process group; the warning signal and the final KILL also go to every descendant (torchrun starts its
workers in their own sessions, so the group alone would miss the trainer). Like sbatch.sh it exports
MIMO_JOB_DEADLINE (start + limit) so the trainer stops and saves before the limit by itself; launch.sh
exiting 75 (the trainer's requeue request) is recorded as FAILED exit 75, which the policy requeues.

The job's processes belong to the job, not to the runner: every one of them carries JOB_MARK=<job id> in its
environment (inherited across torchrun's new sessions and reparenting), and the state file records the
mark and launch.sh's process group. So a runner killed with -9 leaves processes that `job_processes` still
finds: the executor reports the job RUNNING while they live, `cancel` stops them, no retry starts before they
are gone, and the machine slot stays taken (`_acquire_slot` checks the slot's last owner).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from mimo_jobs.contract import jobstates
from mimo_jobs.contract.requeue import REQUEUE_EXIT_CODE

KILL_WAIT_S = 5.0  # like SLURM's KillWait
POLL_S = 0.1
JOB_MARK = "MIMO_JOBS_LOCAL_JOB"  # in the environment of every process of a local job: its job id


def _now() -> str:
    return datetime.now(timezone.utc).replace(tzinfo=None).isoformat(timespec="milliseconds")


class State:
    def __init__(self, path: Path, **facts):
        self.path = path
        self.facts = facts

    def set(self, **kw) -> None:
        self.facts.update(kw)
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.facts))
        os.replace(tmp, self.path)  # readers never see a half-written file


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (from /proc), children first."""
    kids: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        kids.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        for c in kids.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _ancestors() -> set[int]:
    """This process and its ancestors (never signalled as a job's processes, whatever their environment)."""
    out, pid = set(), os.getpid()
    while pid > 1 and pid not in out:
        out.add(pid)
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            break
    return out


def job_processes(job_id: str) -> list[int]:
    """The live processes of local job `job_id`: those whose environment holds JOB_MARK=<job id> (from /proc;
    zombies and processes of other users, whose environment cannot be read, are not counted)."""
    mark = f"{JOB_MARK}={job_id}".encode()
    skip = _ancestors()
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) in skip:
            continue
        try:
            if (d / "stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                continue
            if mark in (d / "environ").read_bytes().split(b"\0"):
                out.append(int(d.name))
        except (OSError, IndexError):
            continue
    return out


def signal_processes(pids: list[int], sig: int, pgid: int | None = None) -> None:
    """`sig` to launch.sh's process group `pgid` (when one of `pids` is still in it) and to each of `pids`."""
    if pgid:
        try:
            if any(os.getpgid(p) == pgid for p in pids):
                os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _slot_owner(lock: Path) -> Path:
    return lock.with_suffix(".owner")


def _acquire_slot(slots_dir: Path, slots: int, stop, job_id: str = "") -> object | None:
    """Hold one of `slots` machine-wide flock slots (released by the kernel when this process dies). A slot
    whose last holder's job still has processes (its runner was killed, its job runs on) is not free."""
    slots_dir.mkdir(parents=True, exist_ok=True)
    while not stop():
        for i in range(slots):
            lock = slots_dir / f"slot-{i}.lock"
            fh = open(lock, "a+")  # noqa: SIM115 (held for the job's life)
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                fh.close()
                continue
            try:
                owner = _slot_owner(lock).read_text().strip()
            except OSError:
                owner = ""
            if owner and owner != job_id and job_processes(owner):
                fh.close()
                continue
            tmp = lock.with_suffix(".owner.tmp")
            tmp.write_text(job_id)
            os.replace(tmp, _slot_owner(lock))
            return fh
        time.sleep(0.2)
    return None


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("state_file")
    ap.add_argument("--launch", required=True)
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--job-id", required=True)
    ap.add_argument("--attempt", type=int, default=0)
    ap.add_argument("--time-limit-s", type=float, required=True)
    ap.add_argument("--signal", default="USR2")
    ap.add_argument("--signal-s", type=float, default=0)
    ap.add_argument("--slots-dir", required=True)
    ap.add_argument("--slots", type=int, default=1)
    return ap.parse_args(argv)


class Signals:
    """What reached the runner: TERM/INT cancel the job; USR1/USR2 (LocalExecutor.signal, like `scancel
    --signal=USR2`) go on to the job's processes, so the trainer checkpoints and asks for a requeue."""

    def __init__(self) -> None:
        self.cancelled = False
        self.forward: list[int] = []
        signal.signal(signal.SIGTERM, self._cancel)
        signal.signal(signal.SIGINT, self._cancel)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        signal.signal(signal.SIGUSR1, self._pass_on)
        signal.signal(signal.SIGUSR2, self._pass_on)

    def _cancel(self, signum, frame) -> None:
        self.cancelled = True

    def _pass_on(self, signum, frame) -> None:
        self.forward.append(signum)


def _job_environment(a: argparse.Namespace) -> dict[str, str]:
    env = dict(os.environ)
    for k in [k for k in env if k.startswith("SLURM_")]:
        del env[k]  # a local job must not think it is inside a SLURM allocation
    env.update(
        MIMO_JOBS_JOB_ID=a.job_id,
        MIMO_JOBS_ATTEMPT=str(a.attempt),
        MIMO_JOBS_RUN_DIR=a.run_dir,
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(_free_port()),
        MIMO_JOBS_EXECUTOR="local",
        MIMO_JOB_DEADLINE=str(int(time.time() + a.time_limit_s)),
    )
    env[JOB_MARK] = a.job_id  # what finds the job's processes when this runner is gone (job_processes)
    # launch.sh's `python3` is the environment mimo-jobs runs in (a venv called by path, not activated)
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
    return env


class Job:
    """launch.sh running in its own process group, and the signals the runner sends it."""

    def __init__(self, a: argparse.Namespace, out) -> None:
        self.start = time.monotonic()
        self.job_id = a.job_id
        self.proc = subprocess.Popen(
            ["bash", a.launch],
            cwd=a.run_dir,
            env=_job_environment(a),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    def group(self, sig: int, tree: bool = False) -> None:
        """`sig` to launch.sh's process group; with `tree`, also to every process of the job (torchrun's
        workers live in their own sessions, and a worker whose torchrun died is no descendant any more)."""
        pids = sorted(set(descendants(self.proc.pid)) | set(job_processes(self.job_id))) if tree else []
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def stop(self, first: int) -> int:
        """`first` to the group, KILL after KILL_WAIT_S if it is still there; the exit status."""
        self.group(first)
        deadline = time.monotonic() + KILL_WAIT_S
        while self.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(POLL_S)
        if self.proc.poll() is None:
            self.group(signal.SIGKILL)
        return self.proc.wait()

    def watch(self, a: argparse.Namespace, signals: Signals) -> tuple[int, str | None]:
        """Wait for the job's end: (exit status, None) or (status, "CANCELLED" | "TIMEOUT")."""
        warn_sig = getattr(signal, "SIG" + a.signal.split(":")[-1])
        warned = False
        while True:
            rc = self.proc.poll()
            if rc is not None:
                return rc, None
            elapsed = time.monotonic() - self.start
            if signals.cancelled:
                return self.stop(signal.SIGTERM), "CANCELLED"
            while signals.forward:
                self.group(signals.forward.pop(0), tree=True)
            if elapsed >= a.time_limit_s:
                return self.stop(signal.SIGTERM), "TIMEOUT"
            # Never before half the limit: a warning at t=0 (signal_s >= limit) would hit launch.sh before it
            # could install its handler, and a job that short has nothing to save yet.
            if (
                not warned
                and a.signal_s > 0
                and elapsed >= max(a.time_limit_s - a.signal_s, a.time_limit_s / 2)
            ):
                self.group(warn_sig, tree=True)
                warned = True
            time.sleep(POLL_S)


def _record_end(a: argparse.Namespace, state: State, out, rc: int, ended: str | None) -> None:
    code = 128 - rc if rc < 0 else rc  # killed by signal N -> 128+N, as a shell reports it
    msg = {"CANCELLED": "cancelled", "TIMEOUT": f"time limit {a.time_limit_s:.0f}s reached"}.get(ended or "")
    if ended is None and code == REQUEUE_EXIT_CODE:
        msg = f"the trainer saved a checkpoint and asked for a requeue (exit {REQUEUE_EXIT_CODE})"
    final = ended or (jobstates.COMPLETED if code == 0 else jobstates.FAILED)
    out.write(f"mimo-jobs: local job {a.job_id} ended {final} exit {code} at {_now()}Z\n".encode())
    if ended == "TIMEOUT":
        # SLURM's wording, so log scanners read a local timeout like a cluster one.
        stamp = datetime.now().strftime("%Y-%m-%dT%H:%M:%S")
        out.write(
            f"mimo-jobs: *** JOB {a.job_id} ON {socket.gethostname()} CANCELLED AT {stamp} "
            f"DUE TO TIME LIMIT ***\n".encode()
        )
    state.set(state=final, exit_code=code, end_time=_now(), reason=msg)


def main(argv: list[str] | None = None) -> int:
    a = _parse_args(argv)
    state = State(
        Path(a.state_file),
        job_id=a.job_id,
        runner_pid=os.getpid(),
        state="PENDING",
        submit_time=_now(),
        start_time=None,
        end_time=None,
        exit_code=None,
        reason=None,
        node_list=socket.gethostname(),
        job_mark=JOB_MARK,
        time_limit_s=a.time_limit_s,
    )
    state.set()
    signals = Signals()
    slot = _acquire_slot(Path(a.slots_dir), a.slots, lambda: signals.cancelled, a.job_id)
    if slot is None:
        state.set(state="CANCELLED", end_time=_now(), reason="cancelled while pending")
        return 0
    out = open(a.out, "ab", buffering=0)  # noqa: SIM115 (the job's output, open until it ends)
    out.write(f"mimo-jobs: local job {a.job_id} attempt {a.attempt} starts {_now()}Z\n".encode())
    job = Job(a, out)
    # launch.sh leads its own session and process group (start_new_session): its id is the group's
    state.set(state="RUNNING", start_time=_now(), child_pid=job.proc.pid, job_pgid=job.proc.pid)
    rc, ended = job.watch(a, signals)
    job.group(
        signal.SIGKILL, tree=True
    )  # stray descendants of launch.sh (a torchrun worker left behind) die too
    _record_end(a, state, out, rc, ended)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Local executor: one detached runner process per job (see runner.py) runs the run's launch.sh.

Why not submitit's LocalExecutor: its job handle lives in the submitting process (a Popen), so a later
`mimo-jobs status` or `cancel` from another process could not follow the job, and it records no exit code or
times for a command. The runner records the same facts SLURM would in logs/local-<job id>.json, and jobs
queue for machine-wide slots (MIMO_JOBS_LOCAL_SLOTS, default 1) the way jobs queue for nodes.

A job's processes outlive its runner (runner.job_processes finds them by the mark in their
environment). When the runner is gone but they still run, the job is RUNNING (orphaned): `cancel` stops
them (launch.sh's recorded process group and every marked process), its time limit is still enforced at
each poll, and only once none is left is it NODE_FAIL (or TIMEOUT), so no retry starts beside it.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from mimo_jobs.contract import jobstates
from mimo_jobs.contract.rundir import RunDir
from mimo_jobs.submit.jobs_table import JobFacts

from ..base import SubmitError
from .runner import KILL_WAIT_S, job_processes, signal_processes

ORPHANED = (
    "local runner process disappeared; the job's processes still run (orphaned): "
    "`mimo-jobs cancel` stops them"
)


def slots_dir() -> Path:
    d = os.environ.get("MIMO_JOBS_LOCAL_SLOTS_DIR")
    return Path(d) if d else Path.home() / ".cache" / "mimo-jobs" / "local-slots"


def slots() -> int:
    return max(1, int(os.environ.get("MIMO_JOBS_LOCAL_SLOTS", "1")))


def _dt(s: str | None) -> datetime | None:
    return datetime.fromisoformat(s) if s else None


def _utcnow() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


def _write(sf: Path, d: dict) -> None:
    """Replace a state file whose runner is gone (atomically, like the runner does)."""
    tmp = sf.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(d))
    os.replace(tmp, sf)


def _wait_gone(job_id: str, timeout_s: float) -> list[int]:
    """The job's processes still there after waiting up to `timeout_s` for them to exit."""
    deadline = time.monotonic() + timeout_s
    while (left := job_processes(job_id)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def _alive(pid: int | None, job_id: str) -> bool:
    """Our runner still runs (not a zombie, and the pid was not reused by another program)."""
    if not pid:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z" and job_id.encode() in cmd


class LocalExecutor:
    name = "local"
    pet_rendezvous = False

    def launch_file(self, rd: RunDir) -> Path:
        return rd.launch_sh

    def artefacts(self, spec, rd: RunDir) -> dict[Path, str]:
        return {}

    def problems(self, runs: list) -> list[str]:
        """The local executor runs one node (launch.sh alone)."""
        multi = [f"{r.name} ({r.layout.nodes} nodes)" for r in runs if r.layout.nodes > 1]
        if not multi:
            return []
        return [
            "--executor local runs one node; these runs need more: "
            + ", ".join(multi)
            + " (submit them to SLURM, or pick 1-node runs with --only)"
        ]

    def state_file(self, rd: RunDir, job_id: str) -> Path:
        return rd.local_state(job_id)

    def runner_err(self, rd: RunDir, job_id: str) -> Path:
        return rd.runner_err(job_id)

    def new_job_id(self) -> str:
        return f"local-{int(time.time() * 1000)}{secrets.randbelow(100):02d}"

    def submit_command(
        self,
        rd: RunDir,
        job_id: str | None = None,
        attempt: int = 0,
        time_limit_s: int = 0,
        signal_spec: str = "USR2@0",
    ) -> list[str]:
        job_id = job_id or "local-<id>"
        sig, _, secs = signal_spec.partition("@")
        return [
            sys.executable,
            "-m",
            "mimo_jobs.submit.executors.local.runner",
            str(self.state_file(rd, job_id)),
            "--launch",
            str(rd.launch_sh),
            "--run-dir",
            str(rd.root),
            "--out",
            self.log_path(rd, job_id),
            "--job-id",
            job_id,
            "--attempt",
            str(attempt),
            "--time-limit-s",
            str(time_limit_s),
            "--signal",
            sig,
            "--signal-s",
            secs or "0",
            "--slots-dir",
            str(slots_dir()),
            "--slots",
            str(slots()),
        ]

    def submit(
        self, rd: RunDir, attempt: int, time_limit_s: int, signal: str, job_id: str | None = None
    ) -> str:
        if not rd.launch_sh.is_file():
            raise SubmitError(f"{rd.launch_sh} does not exist (render the run first)")
        job_id = job_id or self.new_job_id()
        rd.logs.mkdir(parents=True, exist_ok=True)
        sf = self.state_file(rd, job_id)
        cmd = self.submit_command(rd, job_id, attempt, time_limit_s, signal)
        try:
            # Own session: the job survives the CLI and a terminal's Ctrl-C; cancel goes through `cancel`.
            subprocess.Popen(
                cmd,
                cwd=rd.root,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=open(self.runner_err(rd, job_id), "ab"),
                start_new_session=True,  # noqa: SIM115
                close_fds=True,
            )
        except OSError as e:
            raise SubmitError(f"cannot start the local runner: {e}") from None
        # The runner's first act is writing its state file: wait for it so the job is real when we return.
        deadline = time.monotonic() + 30
        while not sf.exists():
            if time.monotonic() > deadline:
                raise SubmitError(
                    f"local runner for {rd.root} did not start within 30 s "
                    f"(see {self.runner_err(rd, job_id)})"
                )
            time.sleep(0.02)
        return job_id

    def _read(self, sf: Path) -> dict | None:
        try:
            return json.loads(sf.read_text())
        except (OSError, ValueError):
            return None

    def facts(self, rd: RunDir, job_id: str) -> JobFacts:
        sf = self.state_file(rd, job_id)
        d = self._read(sf)
        if d is None:
            return self._no_state(sf, job_id)
        if jobstates.is_active(d["state"]) and not _alive(d.get("runner_pid"), job_id):
            d = self._read(sf) or d  # it may have written its end state just now
            if jobstates.is_active(d["state"]) and not _alive(d.get("runner_pid"), job_id):
                d = self._runner_gone(sf, d, job_id)
        return JobFacts(
            job_id,
            d["state"],
            d.get("exit_code"),
            _dt(d.get("submit_time")),
            _dt(d.get("start_time")),
            _dt(d.get("end_time")),
            d.get("node_list"),
            d.get("reason"),
        )

    def _no_state(self, sf: Path, job_id: str) -> JobFacts:
        """No readable state file (deleted with the logs, or garbage). The runner writes it before `submit`
        returns, so there is no lag to wait out: the job runs while its processes do, else it is lost."""
        if job_processes(job_id):
            return JobFacts(
                job_id,
                "RUNNING",
                reason=f"state file {sf} is missing or unreadable; the job's "
                "processes still run (`mimo-jobs cancel` stops them)",
            )
        if sf.exists() and time.time() - sf.stat().st_mtime < 5:
            return JobFacts(job_id, "UNKNOWN", reason=f"state file {sf} unreadable")  # a torn write, perhaps
        return JobFacts(
            job_id,
            "NODE_FAIL",
            end_time=_utcnow(),
            reason=f"state file {sf} is missing or unreadable and no process of the job runs",
        )

    def _runner_gone(self, sf: Path, d: dict, job_id: str) -> dict:
        """The runner died without writing an end state (kill -9, OOM killer, reboot). While the job's
        processes run on it is RUNNING (orphaned; the time limit still applies); once none is left it ended
        like a node failure (or at its time limit), written to the state file so that it stays so."""
        pids = job_processes(job_id)
        now = _utcnow()
        if pids:
            d = {
                **d,
                "state": "RUNNING",
                "reason": ORPHANED,
                "orphaned_since": d.get("orphaned_since") or now.isoformat(timespec="milliseconds"),
            }
            start, limit = _dt(d.get("start_time")), d.get("time_limit_s")
            if start and limit and (now - start).total_seconds() >= limit:
                late = (now - start).total_seconds() - limit
                signal_processes(
                    pids, signal.SIGKILL if late >= KILL_WAIT_S else signal.SIGTERM, d.get("job_pgid")
                )
                d["orphan_end"] = "TIMEOUT"
            if d != self._read(sf):
                _write(sf, d)
            return d
        end = (
            now
            if d.get("orphaned_since")
            else datetime.fromtimestamp(sf.stat().st_mtime, timezone.utc).replace(tzinfo=None)
        )
        if d.get("orphan_end") == "TIMEOUT":
            state, reason = (
                "TIMEOUT",
                (
                    f"time limit {d.get('time_limit_s', 0):.0f}s reached (the local runner had "
                    "disappeared; its orphaned processes were stopped)"
                ),
            )
        else:
            state, reason = (
                "NODE_FAIL",
                "local runner process disappeared"
                + (
                    " (its orphaned processes ran on until then; their exit status is unknown)"
                    if d.get("orphaned_since")
                    else ""
                ),
            )
        d = {
            **d,
            "state": state,
            "reason": reason,
            "end_time": d.get("end_time") or end.isoformat(timespec="milliseconds"),
        }
        _write(sf, d)
        return d

    def poll(self, rds: dict[str, RunDir]) -> dict[str, JobFacts]:
        return {i: self.facts(rd, i) for i, rd in rds.items()}

    def cancel(self, job_id: str, rd: RunDir) -> None:
        sf = self.state_file(rd, job_id)
        d = self._read(sf)
        if d is None:
            d = {"state": jobstates.RUNNING}  # no state file: whatever of the job runs is found by its mark
        if not jobstates.is_active(str(d.get("state"))):
            return
        pid = d.get("runner_pid")
        if _alive(pid, job_id):
            os.kill(pid, signal.SIGTERM)  # the runner stops launch.sh's process group and records CANCELLED
            return
        # The runner is gone: stop its orphaned processes here, as the runner would (TERM, KILL after
        # KILL_WAIT_S), then record the end it could not.
        pids = job_processes(job_id)
        if not pids:
            return  # nothing left: the next poll records the runner's disappearance
        signal_processes(pids, signal.SIGTERM, d.get("job_pgid"))
        left = _wait_gone(job_id, KILL_WAIT_S)
        if left:
            signal_processes(left, signal.SIGKILL, d.get("job_pgid"))
            left = _wait_gone(job_id, KILL_WAIT_S)
        if not left and sf.parent.is_dir():
            _write(
                sf,
                {
                    **d,
                    "state": "CANCELLED",
                    "end_time": _utcnow().isoformat(timespec="milliseconds"),
                    "reason": "cancelled (its runner had disappeared: the orphaned processes were stopped)",
                },
            )

    def reap(self, job_id: str, rd: RunDir) -> bool:
        """Before a retry of an ended job: kill what is left of its processes (the runner kills them all when
        the job ends; a stray may have escaped it). True once none is left."""
        pids = job_processes(job_id)
        if pids:
            signal_processes(pids, signal.SIGKILL)
            pids = _wait_gone(job_id, 2.0)
        return not pids

    def signal(self, job_id: str, rd: RunDir, sig: int = signal.SIGUSR2) -> bool:
        """Send a running job's processes USR1/USR2 through its runner (like `scancel --signal=USR2 <job>`):
        the trainer saves a checkpoint and asks for a requeue. False if the job is not running."""
        if sig not in (signal.SIGUSR1, signal.SIGUSR2):
            raise ValueError(f"signal {sig}: only USR1/USR2 are forwarded (use cancel to stop a job)")
        try:
            d = json.loads(self.state_file(rd, job_id).read_text())
        except (OSError, ValueError):
            return False
        pid = d.get("runner_pid")
        if d.get("state") != "RUNNING":
            return False
        if _alive(pid, job_id):
            os.kill(pid, sig)
            return True
        pids = job_processes(job_id)  # orphaned: to the job's processes directly, as the runner would
        signal_processes(pids, sig, d.get("job_pgid"))
        return bool(pids)

    def find(self, rd: RunDir, since_epoch: float) -> list[JobFacts]:
        """The contract (base.Executor.find): recent jobs, ended or not, and live ones however old."""
        out = []
        for sf in sorted(rd.logs.glob("local-*.json")):
            recent = sf.stat().st_mtime >= since_epoch - 60
            facts = self.facts(rd, sf.stem[len("local-") :])
            if recent or facts.active:
                out.append(facts)
        return out

    def log_path(self, rd: RunDir, job_id: str) -> str:
        return str(rd.local_out(job_id))

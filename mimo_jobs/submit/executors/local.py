"""Local executor: one detached runner process per job (see local_runner.py) runs the run's launch.sh.

Why not submitit's LocalExecutor: its job handle lives in the submitting process (a Popen), so a later
`mimo-jobs status` or `cancel` from another process could not follow the job, and it records no exit code or
times for a command. The runner records the same facts SLURM would in logs/local-<job id>.json, and jobs
queue for machine-wide slots (MIMO_JOBS_LOCAL_SLOTS, default 1) the way jobs queue for nodes.
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

from mimo_jobs.submit.jobs_table import JobFacts
from mimo_jobs.plan.rundir import RunDir
from . import SubmitError


def slots_dir() -> Path:
    d = os.environ.get("MIMO_JOBS_LOCAL_SLOTS_DIR")
    return Path(d) if d else Path.home() / ".cache" / "mimo-jobs" / "local-slots"


def slots() -> int:
    return max(1, int(os.environ.get("MIMO_JOBS_LOCAL_SLOTS", "1")))


def _dt(s: str | None) -> datetime | None:
    return datetime.fromisoformat(s) if s else None


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

    def state_file(self, rd: RunDir, job_id: str) -> Path:
        return rd.logs / f"local-{job_id}.json"

    def runner_err(self, rd: RunDir, job_id: str) -> Path:
        return rd.logs / f"runner-{job_id}.stderr"  # not *.out/.err/.log/.txt: ingest reads those as job logs

    def new_job_id(self) -> str:
        return f"local-{int(time.time() * 1000)}{secrets.randbelow(100):02d}"

    def submit_command(self, rd: RunDir, job_id: str | None = None, attempt: int = 0, time_limit_s: int = 0,
                       signal_spec: str = "USR2@0") -> list[str]:
        job_id = job_id or "local-<id>"
        sig, _, secs = signal_spec.partition("@")
        return [sys.executable, "-m", "mimo_jobs.submit.executors.local_runner", str(self.state_file(rd, job_id)),
                "--launch", str(rd.launch_sh), "--run-dir", str(rd.root), "--out", self.log_path(rd, job_id),
                "--job-id", job_id, "--attempt", str(attempt), "--time-limit-s", str(time_limit_s),
                "--signal", sig, "--signal-s", secs or "0", "--slots-dir", str(slots_dir()),
                "--slots", str(slots())]

    def submit(self, rd: RunDir, attempt: int, time_limit_s: int, signal: str, job_id: str | None = None) -> str:
        if not rd.launch_sh.is_file():
            raise SubmitError(f"{rd.launch_sh} does not exist (render the run first)")
        job_id = job_id or self.new_job_id()
        rd.logs.mkdir(parents=True, exist_ok=True)
        sf = self.state_file(rd, job_id)
        cmd = self.submit_command(rd, job_id, attempt, time_limit_s, signal)
        try:
            # Own session: the job survives the CLI and a terminal's Ctrl-C; cancel goes through `cancel`.
            subprocess.Popen(cmd, cwd=rd.root, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=open(self.runner_err(rd, job_id), "ab"), start_new_session=True,  # noqa: SIM115
                             close_fds=True)
        except OSError as e:
            raise SubmitError(f"cannot start the local runner: {e}") from None
        # The runner's first act is writing its state file: wait for it so the job is real when we return.
        deadline = time.monotonic() + 30
        while not sf.exists():
            if time.monotonic() > deadline:
                raise SubmitError(f"local runner for {rd.root} did not start within 30 s "
                                  f"(see {self.runner_err(rd, job_id)})")
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
            return JobFacts(job_id, "UNKNOWN", reason=f"no state file {sf}")
        if d["state"] in ("PENDING", "RUNNING") and not _alive(d.get("runner_pid"), job_id):
            d = self._read(sf) or d  # it may have written its end state just now
        f = JobFacts(job_id, d["state"], d.get("exit_code"), _dt(d.get("submit_time")), _dt(d.get("start_time")),
                     _dt(d.get("end_time")), d.get("node_list"), d.get("reason"))
        if f.state in ("PENDING", "RUNNING") and not _alive(d.get("runner_pid"), job_id):
            # The runner died without writing an end state (kill -9, machine reboot): like a node failure.
            f.state, f.reason = "NODE_FAIL", "local runner process disappeared"
            f.end_time = f.end_time or datetime.fromtimestamp(sf.stat().st_mtime, timezone.utc).replace(tzinfo=None)
        return f

    def poll(self, rds: dict[str, RunDir]) -> dict[str, JobFacts]:
        return {i: self.facts(rd, i) for i, rd in rds.items()}

    def cancel(self, job_id: str, rd: RunDir) -> None:
        try:
            d = json.loads(self.state_file(rd, job_id).read_text())
        except (OSError, ValueError):
            return
        pid = d.get("runner_pid")
        if d.get("state") in ("PENDING", "RUNNING") and _alive(pid, job_id):
            os.kill(pid, signal.SIGTERM)  # the runner stops launch.sh's process group and records CANCELLED

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
        if d.get("state") != "RUNNING" or not _alive(pid, job_id):
            return False
        os.kill(pid, sig)
        return True

    def find(self, rd: RunDir, since_epoch: float) -> list[JobFacts]:
        out = []
        for sf in sorted(rd.logs.glob("local-*.json")):
            if sf.stat().st_mtime >= since_epoch - 60:
                out.append(self.facts(rd, sf.stem[len("local-"):]))
        return out

    def log_path(self, rd: RunDir, job_id: str) -> str:
        return str(rd.local_out(job_id))

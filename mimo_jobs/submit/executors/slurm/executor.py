"""SLURM executor: the rendered sbatch.sh is submitted as is; submitit provides the job handles.

How the rendered script and submitit fit together: submitit's own submission path writes its own batch
script around a pickled callable, which would be a second script generator. So submission is one
`sbatch --parsable --chdir=<run dir> <run dir>/sbatch.sh` on the rendered file (exactly what SLURM runs;
its sha256 is recorded), and the returned id becomes a `submitit.SlurmJob` handle, through which jobs are
cancelled. State comes from sacct (slurmdbd), like submitit's watcher, but in one batched call per poll
for all jobs and with the columns submitit does not read (exit code, times, reason); jobs too new for
sacct are looked up in squeue.
"""

from __future__ import annotations

import subprocess
import time
from datetime import datetime
from pathlib import Path

from mimo_jobs.contract import jobstates
from mimo_jobs.contract.rundir import RunDir
from mimo_jobs.submit.jobs_table import JobFacts

from ..base import SubmitError
from . import sacct

SACCT_FIELDS = ",".join(sacct.POLL_COLUMNS)
SQUEUE_FORMAT = "%i|%T|%V|%S|%N|%r|%Z"


def jobs_from_sacct(text: str) -> dict[str, tuple[JobFacts, str]]:
    """`sacct -X -n -P -o SACCT_FIELDS` (parsed by executors/sacct.py) -> job id -> (facts, work dir). With
    requeues sacct may list a job id twice; the last line is the newest."""
    return {
        r.job_id: (
            JobFacts(r.job_id, r.state, r.exit_code, r.submit, r.start, r.end, r.node_list, r.reason),
            r.work_dir,
        )
        for r in sacct.parse_poll(text)
    }


def parse_squeue(text: str) -> dict[str, tuple[JobFacts, str]]:
    """`squeue -h -o SQUEUE_FORMAT` -> job id -> (facts, work dir)."""
    out: dict[str, tuple[JobFacts, str]] = {}
    for line in text.splitlines():
        f = line.split("|")
        if len(f) < 7 or not f[0]:
            continue
        reason = f[5].strip() if f[5].strip() not in ("", "None") else None
        submitted, started = sacct.controller_time(f[2]), sacct.controller_time(f[3])
        facts = JobFacts(
            f[0], f[1].strip() or "UNKNOWN", None, submitted, started, None, f[4].strip() or None, reason
        )
        out[f[0]] = (facts, f[6].strip())
    return out


def _run(cmd: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise SubmitError(
            f"{cmd[0]} not found: is this a SLURM login node? (or use --executor local)"
        ) from None


class SlurmExecutor:
    name = "slurm"
    pet_rendezvous = False

    def launch_file(self, rd: RunDir) -> Path:
        return rd.sbatch_sh

    def artefacts(self, spec, rd: RunDir) -> dict[Path, str]:
        return {}  # sbatch.sh is rendered for every run (mimo_jobs/study/render.py)

    def problems(self, runs: list) -> list[str]:
        return []

    def __init__(self) -> None:
        self.sacct_s = 0.0  # time spent in sacct/squeue (the benchmark reports it apart)
        self.sacct_calls = 0

    def submit_command(self, rd: RunDir, job_id: str | None = None) -> list[str]:
        return ["sbatch", "--parsable", f"--chdir={rd.root}", str(rd.sbatch_sh)]

    def new_job_id(self) -> None:
        return None  # SLURM names the job

    def submit(
        self, rd: RunDir, attempt: int, time_limit_s: int, signal: str, job_id: str | None = None
    ) -> str:
        rd.logs.mkdir(parents=True, exist_ok=True)  # sbatch does not create the --output directory
        p = _run(self.submit_command(rd))
        if p.returncode != 0:
            raise SubmitError(f"sbatch {rd.sbatch_sh} failed (exit {p.returncode}): {p.stderr.strip()}")
        job_id = p.stdout.strip().split(";")[0]  # --parsable prints "id" or "id;cluster"
        if not job_id.isdigit():
            raise SubmitError(f"sbatch {rd.sbatch_sh} printed no job id: {p.stdout.strip()!r}")
        return job_id

    def _query(self, ids: list[str]) -> dict[str, tuple[JobFacts, str]]:
        t0 = time.perf_counter()
        try:
            found: dict[str, tuple[JobFacts, str]] = {}
            if ids:
                p = _run(["sacct", "-X", "-n", "-P", "-o", SACCT_FIELDS, "-j", ",".join(ids)])
                if p.returncode == 0:
                    found.update(jobs_from_sacct(p.stdout))
                missing = [i for i in ids if i not in found]
                if missing:  # sacct lags sbatch by 1-5 s; squeue knows the job at once
                    p = _run(["squeue", "-h", "-o", SQUEUE_FORMAT, "-j", ",".join(missing)])
                    if p.returncode == 0:
                        found.update(parse_squeue(p.stdout))
            return found
        finally:
            self.sacct_s += time.perf_counter() - t0
            self.sacct_calls += 1

    def poll(self, rds: dict[str, RunDir]) -> dict[str, JobFacts]:
        found = self._query(sorted(rds))
        out = {i: found[i][0] if i in found else JobFacts(i, "UNKNOWN") for i in rds}
        # A job sbatch'ed with --requeue that SLURM itself requeued (a retryable end: preemption, node failure) keeps its id and
        # is queued again: squeue knows it. It is still active; mimo-jobs must not resubmit it.
        again = [i for i, f in out.items() if jobstates.is_retryable(f.state)]
        if again:
            p = _run(["squeue", "-h", "-o", SQUEUE_FORMAT, "-j", ",".join(again)])
            for i, (f, _) in (parse_squeue(p.stdout) if p.returncode == 0 else {}).items():
                if i in out:
                    f.reason = f"requeued by SLURM after {out[i].state}"
                    out[i] = f
        return out

    def cancel(self, job_id: str, rd: RunDir) -> None:
        import submitit

        submitit.SlurmJob(folder=rd.logs / "submitit", job_id=job_id).cancel(check=False)

    def reap(self, job_id: str, rd: RunDir) -> bool:
        return True  # a job sacct reports ended has no processes left: slurmd ended its steps

    def find(self, rd: RunDir, since_epoch: float) -> list[JobFacts]:
        since = datetime.fromtimestamp(since_epoch - 60).strftime("%Y-%m-%dT%H:%M:%S")
        t0 = time.perf_counter()
        found = parse_squeue(_run(["squeue", "-h", "-o", SQUEUE_FORMAT]).stdout)
        p = _run(["sacct", "-X", "-n", "-P", "-o", SACCT_FIELDS, "-S", since])
        self.sacct_s += time.perf_counter() - t0
        if p.returncode == 0:
            found.update(jobs_from_sacct(p.stdout))
        root = str(rd.root)
        return [f for f, wd in found.values() if wd.rstrip("/") == root]

    def log_path(self, rd: RunDir, job_id: str) -> str:
        return str(rd.slurm_out(job_id))

"""The local executor's `find` keeps the executors' contract (submit/executors/base.py): a run's jobs since a
time, ended or not, and its live jobs however old; never an old ended one. A lost store write of an old
submission whose job still runs is recovered, as with SLURM's queue."""

import json
import os
import subprocess
import sys
import time

from mimo_jobs.contract.rundir import RunDir
from mimo_jobs.submit.executors.local.executor import LocalExecutor


def _state(rd: RunDir, job_id: str, state: str, age_s: float, pid: int | None = None) -> None:
    sf = rd.local_state(job_id)
    sf.parent.mkdir(parents=True, exist_ok=True)
    sf.write_text(json.dumps({"state": state, "runner_pid": pid, "submit_time": None}))
    then = time.time() - age_s
    os.utime(sf, (then, then))


def test_find_returns_recent_jobs_and_live_ones_however_old(tmp_path):
    rd = RunDir.of(tmp_path / "runs", "s", "r", "abc123")
    live_id, old_done, recent_failed = "local-1000", "local-2000", "local-3000"
    # a runner process of the old live job: its command line names the job (as the real runner's does)
    runner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", live_id])
    try:
        _state(rd, live_id, "RUNNING", age_s=3600, pid=runner.pid)
        _state(rd, old_done, "COMPLETED", age_s=3600)
        _state(rd, recent_failed, "FAILED", age_s=5)
        found = {f.job_id: f.state for f in LocalExecutor().find(rd, time.time() - 30)}
        assert found == {live_id: "RUNNING", recent_failed: "FAILED"}
    finally:
        runner.kill()
        runner.wait()

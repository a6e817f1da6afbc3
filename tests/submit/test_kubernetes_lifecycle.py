"""The Kubernetes executor end to end against a FAKE API server (tests/helpers/fake_kube.py: no
kube-apiserver can be installed here), with the real CLI (`mimo-jobs submit`/`status`/`cancel` in their own
processes, the official `kubernetes` client through a kubeconfig context) and the REAL trainer in the "pods".

The test plays the cluster's controllers through the same REST API: Kueue (holding the TrainJobs
suspended, then admitting them), JobSet (creating one pod per node with its labels) and the kubelet
(running the container's command with the PET_* variables the Trainer's torch plugin sets, sending
SIGTERM to the container's main process on preemption, recording how containers ended, serving their
logs). Two runs of one study:

- run A: admitted, running (the trainer saves every 2 iterations), preempted by the scheduler -> PREEMPTED,
  requeued by the policy as a new TrainJob (attempt 1) that resumes from the checkpoint the trainer saved on
  SIGTERM and completes: ONE curve, iterations 1..N once each;
- run B: admitted, its container OOMKilled -> OUT_OF_MEMORY, not retried;
- run C: cancelled while running -> its TrainJob and pods are deleted, CANCELLED.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from helpers.fake_kube import KUEUE_NO_QUOTA, FakeApiServer, FakeCluster, now
from helpers.launch import free_port, worker_env
from helpers.submit import cli, query, write_study

pytest.importorskip("kubernetes")
pytest.importorskip("kubeflow_trainer_api")
pytestmark = pytest.mark.slow

NS = "ml"
ITERS = 30  # at 0.5 s a step (the test hook), far longer than the steps before the preemption


class Cluster(FakeCluster):
    """The controllers' side, done by the test through the REST API."""

    def __init__(self, server: FakeApiServer, kubeconfig: Path) -> None:
        super().__init__(kubeconfig, NS)
        self.server = server
        self.procs: dict[str, subprocess.Popen] = {}
        self.outs: dict[str, Path] = {}

    def pod(self, tj: str) -> str:
        """JobSet's pod for node rank 0 of the TrainJob, scheduled and running."""
        name = f"{tj}-node-0-0-x7k2p"
        labels = {
            "jobset.sigs.k8s.io/jobset-name": tj,
            "jobset.sigs.k8s.io/replicatedjob-name": "node",
            "jobset.sigs.k8s.io/restart-attempt": "0",
            "batch.kubernetes.io/job-completion-index": "0",
        }
        self.core.create_namespaced_pod(NS, {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels},
            "spec": {"nodeName": "gpu-node-17", "containers": [{"name": "node", "image": "mimo-jobs:latest"}]},
        })  # fmt: skip
        self.core.patch_namespaced_pod_status(name, NS, {"status": {
            "phase": "Running", "startTime": now(),
            "containerStatuses": [{"name": "node", "ready": True, "restartCount": 0, "image": "mimo-jobs:latest",
                                   "imageID": "", "state": {"running": {"startedAt": now()}}}]}})  # fmt: skip
        return name

    def run_container(self, tj: str, pod: str, tmp: Path) -> None:
        """The kubelet: the TrainJob's command and env, plus the torch plugin's PET_* variables."""
        trainer = self.trainjobs()[tj]["spec"]["trainer"]
        base = worker_env(zygote=False)  # this checkout's code, one thread a rank, as every test process
        env = {k: v for k, v in base.items() if not k.startswith(("SLURM", "MIMO_JOBS_", "PET_"))}
        env.update({e["name"]: e["value"] for e in trainer["env"]})
        env.update(PET_NNODES=str(trainer["numNodes"]), PET_NPROC_PER_NODE=str(trainer["numProcPerNode"]),
                   PET_NODE_RANK="0", PET_MASTER_ADDR="127.0.0.1", PET_MASTER_PORT=str(free_port()))  # fmt: skip
        out = tmp / f"{pod}.log"
        self.outs[pod] = out
        with open(out, "wb") as f:
            self.procs[pod] = subprocess.Popen(
                trainer["command"], env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True
            )

    def end_pod(self, pod: str, code: int, reason: str, disruption: str | None = None) -> None:
        phase = "Succeeded" if code == 0 else "Failed"
        status = {
            "phase": phase,
            "containerStatuses": [{"name": "node", "ready": False, "restartCount": 0, "image": "mimo-jobs:latest",
                                   "imageID": "", "state": {"terminated": {"exitCode": code, "reason": reason,
                                                                           "finishedAt": now()}}}],
        }  # fmt: skip
        if disruption:
            status["conditions"] = [{"type": "DisruptionTarget", "status": "True", "reason": disruption,
                                     "message": "preempted to admit a higher-priority pod"}]  # fmt: skip
        self.core.patch_namespaced_pod_status(pod, NS, {"status": status})
        self.server.set_log(NS, pod, self.outs[pod].read_text() if pod in self.outs else "")

    def wait_process(self, pod: str) -> int:
        return self.procs[pod].wait(timeout=600)  # a hang guard only


def metrics_iteration(run_dir: Path) -> int:
    try:
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return 0
    return max((json.loads(ln).get("iteration", 0) for ln in lines if ln.strip()), default=0)


def jobs(db: Path) -> dict[str, list[dict]]:
    cols = [
        "name",
        "job_id",
        "attempt",
        "state",
        "exit_code",
        "reason",
        "action",
        "next_job_id",
        "log_path",
        "run_dir",
    ]
    rows = query(db, f"SELECT r.name, {', '.join('j.' + c for c in cols[1:-1])}, r.run_dir FROM jobs j "
                 "JOIN runs r USING (run_id) ORDER BY r.name, j.attempt")  # fmt: skip
    out: dict[str, list[dict]] = {}
    for r in rows:
        d = dict(zip(cols, r))
        out.setdefault(d["name"], []).append(d)
    return out


def test_trainjob_lifecycle_on_a_fake_api_server(tmp_path):
    with FakeApiServer() as server:
        kubeconfig = server.kubeconfig(tmp_path / "kubeconfig", namespace=NS)
        env = {"KUBECONFIG": str(kubeconfig)}
        db, runs = tmp_path / "store.duckdb", tmp_path / "runs"
        study = write_study(
            tmp_path / "k8s.yaml", "k8s_life", [{"nodes": 1}, {"nodes": 1, "gbs": 4}, {"nodes": 1, "gbs": 2}],
            executor="kubernetes", train_iters=ITERS, env={"OMP_NUM_THREADS": 1, "MIMO_CKPT_TEST_STEP_DELAY_S": 0.5},
        )  # fmt: skip
        doc = yaml.safe_load(study.read_text())
        doc["cluster"].update(python=sys.executable, kubernetes={"pvc": "runs", "namespace": NS, "context": "fake",
                                                                  "queue": "team-a"})  # fmt: skip
        doc["trainer"].update(seq_length=32, save_interval=2, log_interval=1, seed=1234, precision="fp32")
        study.write_text(yaml.safe_dump(doc, sort_keys=False))

        def status() -> dict[str, list[dict]]:
            cli("status", "k8s_life", "--db", db, env=env, check=True)
            return jobs(db)

        out = cli("submit", study, "--db", db, "--runs-dir", runs, env=env, check=True).stdout
        assert out.count("as kubernetes job mj-") == 3, out
        k = Cluster(server, kubeconfig)
        tjs = k.trainjobs()
        by_run = {t["metadata"]["annotations"]["mimo-jobs.io/run"]: n for n, t in tjs.items()}
        a, b, c = (by_run[n] for n in sorted(by_run, key=lambda n: -int(n.rsplit("-g", 1)[1])))  # g6, g4, g2
        # what was submitted is the rendered manifest, attempt 0, queued on the study's LocalQueue
        rd_a = Path(tjs[a]["metadata"]["annotations"]["mimo-jobs.io/run-dir"])
        rendered = yaml.safe_load((rd_a / "trainjob.yaml").read_text())
        assert rendered["spec"] == tjs[a]["spec"] and rendered["metadata"]["name"] == a
        assert tjs[a]["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"

        # Kueue holds them until there is quota
        for tj in (a, b, c):
            k.suspend(tj)
            k.workload(tj, [{"type": "QuotaReserved", "status": "False", "reason": "Pending",
                             "message": KUEUE_NO_QUOTA}])  # fmt: skip
        st = status()
        assert {r[0]["state"] for r in st.values()} == {"PENDING"}
        assert all(r[0]["reason"] == f"suspended by Kueue: {KUEUE_NO_QUOTA}" for r in st.values()), st

        # admitted: JobSet makes the pods, the kubelet runs A's container (the real trainer)
        pods = {}
        for tj in (a, b, c):
            k.condition(tj, "Suspended", "False", "Resumed")
            pods[tj] = k.pod(tj)
        st = status()
        assert {r[0]["state"] for r in st.values()} == {"RUNNING"}

        # B: its container is OOMKilled; the TrainJob fails
        k.end_pod(pods[b], 137, "OOMKilled")
        k.condition(b, "Failed", "True", "FailedJobs", "jobset k8s failed: node job failed")
        # C: cancelled while it runs
        cli("cancel", "k8s_life", "--run", next(n for n, t in by_run.items() if t == c), "--db", db, env=env,
            check=True)  # fmt: skip
        assert c not in k.trainjobs() and not k.core.list_namespaced_pod(
            NS, label_selector=f"jobset.sigs.k8s.io/jobset-name={c}").items  # fmt: skip

        # A: its container runs the real trainer; preempted by the scheduler once it has saved a checkpoint,
        # the kubelet's SIGTERM reaches the trainer
        k.run_container(a, pods[a], tmp_path)
        deadline = time.monotonic() + 600
        while metrics_iteration(rd_a) < 3:
            assert time.monotonic() < deadline and k.procs[pods[a]].poll() is None, k.outs[
                pods[a]
            ].read_text()[-3000:]
            time.sleep(0.5)
        k.procs[pods[a]].send_signal(
            signal.SIGTERM
        )  # to the container's main process only, as the kubelet does
        code = k.wait_process(pods[a])
        log0 = k.outs[pods[a]].read_text()
        assert code == 75, log0[-3000:]  # the trainer saved a checkpoint and asked for a requeue
        k.end_pod(pods[a], code, "Error", disruption="PreemptionByScheduler")
        k.condition(a, "Failed", "True", "FailedJobs", "jobset k8s failed: node job failed")

        st = status()
        (ra0, ra1), (rb,), (rc,) = (st[n] for n in sorted(st, key=lambda n: -int(n.rsplit("-g", 1)[1])))
        assert (rb["state"], rb["exit_code"], rb["action"]) == ("OUT_OF_MEMORY", 137, "final"), rb
        assert "OOMKilled" in rb["reason"]
        assert (rc["state"], rc["action"]) == ("CANCELLED", "final"), rc
        assert (ra0["state"], ra0["action"], ra0["next_job_id"]) == ("PREEMPTED", "requeue", ra1["job_id"]), (
            ra0
        )
        assert ra1["job_id"] == a.replace("-a0", "-a1") and ra1["attempt"] == 1
        # the preempted attempt's pod log is in the run directory, per node rank, for ingest
        saved = Path(ra0["log_path"])
        assert saved.name == f"k8s-{a}.node-0.out" and "asks for a requeue" in saved.read_text()
        assert set(k.trainjobs()) == {
            b,
            ra1["job_id"],
        }  # the preempted TrainJob was deleted before the requeue
        assert {e["name"]: e["value"] for e in k.trainjobs()[ra1["job_id"]]["spec"]["trainer"]["env"]}[
            "MIMO_JOBS_ATTEMPT"] == "1"  # fmt: skip

        # attempt 1 is admitted, runs, resumes from the checkpoint and completes
        a1 = ra1["job_id"]
        p1 = k.pod(a1)
        k.run_container(a1, p1, tmp_path)
        assert k.wait_process(p1) == 0, k.outs[p1].read_text()[-3000:]
        k.end_pod(p1, 0, "Completed")
        k.condition(a1, "Complete", "True", "JobsCompleted", "jobset completed")
        st = status()
        last = next(r for r in st.values() if len(r) == 2)[1]
        assert (last["state"], last["exit_code"], last["action"]) == ("COMPLETED", 0, "done"), last
        log1 = Path(last["log_path"]).read_text()
        assert "resumed from checkpoint" in log1, log1[-3000:]
        got = query(db, "SELECT iteration FROM iterations WHERE NOT coalesce(superseded, false) AND run_id = "
                    "(SELECT run_id FROM runs WHERE run_dir = ?) ORDER BY iteration", [str(rd_a)])  # fmt: skip
        assert [i for (i,) in got] == list(range(1, ITERS + 1))

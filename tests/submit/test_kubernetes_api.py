"""The Kubernetes executor's API side against a FAKE API server (tests/helpers/fake_kube.py: no
kube-apiserver can be installed here), with no trainer run: Debian's `kubectl` applying a `--dry-run`
manifest, `find` recovering a run's jobs, and why an active job waits (Kueue's quota, an image pull, a
crash loop) in `status`. The test plays the controllers (Kueue, JobSet, the kubelet) through the same REST
API, with the official `kubernetes` client.
"""

from __future__ import annotations

import copy
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from helpers import STUDIES
from helpers.fake_kube import (
    KUEUE_NO_QUOTA,
    KUEUE_PREEMPTED,
    TRAINJOB_SUSPENDED,
    FakeApiServer,
    FakeCluster,
    now,
)
from helpers.submit import write_study
from mimo_jobs.cli.app import app
from mimo_jobs.contract.rundir import RunDir
from mimo_jobs.study.expand import runs_of
from mimo_jobs.study.load import parse_study, read_yaml
from mimo_jobs.study.render import render_runs
from mimo_jobs.submit.executors.kubernetes.executor import KubernetesExecutor

pytest.importorskip("kubernetes")
pytest.importorskip("kubeflow_trainer_api")

NS = "ml"
SECTION = {"pvc": "mimo-runs", "namespace": NS, "context": "fake", "queue": "team-a"}


class Controllers(FakeCluster):
    """What Kueue, JobSet and the kubelet do, done by the test through the REST API."""

    def __init__(self, kubeconfig: Path, kueue: str | None = "v1beta2") -> None:
        super().__init__(kubeconfig, NS, kueue)

    def pod(self, tj: str, phase: str, container: dict) -> str:
        """JobSet's pod for node rank 0 of the TrainJob, with its `node` container in this state."""
        name = f"{tj}-node-0-0-x7k2p"
        labels = {"jobset.sigs.k8s.io/jobset-name": tj, "jobset.sigs.k8s.io/restart-attempt": "0",
                  "batch.kubernetes.io/job-completion-index": "0"}  # fmt: skip
        if name not in {p.metadata.name for p in self.core.list_namespaced_pod(NS).items}:
            self.core.create_namespaced_pod(NS, {
                "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels},
                "spec": {"nodeName": "cpu-node-3", "containers": [{"name": "node", "image": "mimo-jobs:latest"}]},
            })  # fmt: skip
        status = {"phase": phase, "startTime": now(), "containerStatuses": [
            {"name": "node", "ready": phase == "Running", "restartCount": 0, "image": "mimo-jobs:latest",
             "imageID": "", **container}]}  # fmt: skip
        self.core.patch_namespaced_pod_status(name, NS, {"status": status})
        return name


def cpu_study(tmp_path: Path, n_runs: int) -> Path:
    """The CPU study (its first `n_runs` points) for the Kubernetes executor, on the fake's context."""
    doc = read_yaml(STUDIES / "cpu_local.yaml")
    doc["cluster"].update(executor="kubernetes", kubernetes=copy.deepcopy(SECTION))
    doc["matrix"]["points"] = doc["matrix"]["points"][:n_runs]
    path = tmp_path / "k8s.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def invoke(*args, env: dict | None = None):
    """The command line in this process (typer's test runner): the same commands, no process start."""
    return CliRunner().invoke(app, [str(a) for a in args], env=env)


def kubectl(kubeconfig: Path, cache: Path, *args: str) -> subprocess.CompletedProcess:
    exe = shutil.which("kubectl")
    if exe is None:
        pytest.skip("kubectl is not installed (tests/run.sh installs Debian's package `kubernetes-client`)")
    return subprocess.run(
        [exe, "--kubeconfig", str(kubeconfig), "--cache-dir", str(cache), *args],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_kubectl_applies_the_dry_run_manifest(tmp_path):
    """`submit --dry-run` writes trainjob.yaml; `kubectl apply -f` on it creates that TrainJob and `kubectl
    get trainjobs` lists it (`--validate=false`: the fake serves no OpenAPI document to validate against)."""
    runs = tmp_path / "runs"
    res = invoke("submit", cpu_study(tmp_path, 1), "--dry-run", "--runs-dir", runs, "--db", tmp_path / "db")
    assert res.exit_code == 0, res.output
    (manifest,) = runs.rglob("trainjob.yaml")
    rendered = yaml.safe_load(manifest.read_text())
    name = rendered["metadata"]["name"]
    with FakeApiServer() as server:
        kc = server.kubeconfig(tmp_path / "kubeconfig", namespace=NS)
        p = kubectl(kc, tmp_path / "cache", "apply", "--validate=false", "-f", str(manifest))
        assert p.returncode == 0, p.stdout + p.stderr
        assert f"trainjob.trainer.kubeflow.org/{name} created" in p.stdout
        p = kubectl(kc, tmp_path / "cache", "get", "trainjobs", "-n", NS)
        assert p.returncode == 0, p.stdout + p.stderr
        assert [ln.split()[0] for ln in p.stdout.splitlines()] == ["NAME", name]
        # what kubectl created is the manifest as rendered, as the executor's client reads it back
        got = Controllers(kc).trainjobs()[name]
        assert got["spec"] == rendered["spec"] and got["metadata"]["labels"] == rendered["metadata"]["labels"]


def render(tmp_path: Path, n_runs: int) -> list:
    """The study's runs rendered (run.yaml, launch.sh, trainjob.yaml) as `submit` renders them."""
    ex = KubernetesExecutor()
    runs = runs_of(parse_study(read_yaml(cpu_study(tmp_path, n_runs)), env={}))
    return [
        RunDir(r.run_dir) for r in render_runs(runs, tmp_path / "runs", None, ex.pet_rendezvous, ex.artefacts)
    ]


def test_find_returns_the_runs_live_trainjobs_and_those_since_never_another_runs(tmp_path, monkeypatch):
    """`find` (the recovery of a submission whose store write was lost), as SLURM's: the run's jobs submitted
    since the given time, ended or not, and its live ones however old; never an old ended one or another
    run's."""
    rd_a, rd_b = render(tmp_path, 2)
    with FakeApiServer() as server:
        kc = server.kubeconfig(tmp_path / "kubeconfig", namespace=NS)
        monkeypatch.setenv("KUBECONFIG", str(kc))
        ex, k = KubernetesExecutor(), Controllers(kc)
        a0, a1, a2 = (ex.submit(rd_a, attempt, 600, "USR2@60") for attempt in range(3))
        b0 = ex.submit(rd_b, 0, 600, "USR2@60")
        # a0: an hour old and failed; a1: an hour old and still held by Kueue; a2 just completed; b0 running
        k.condition(a0, "Failed", "True", "FailedJobs", "jobset failed")
        k.suspend(a1)
        k.condition(a2, "Complete", "True", "JobsCompleted", "jobset completed")
        k.pod(b0, "Running", {"state": {"running": {"startedAt": now()}}})
        for tj in (a0, a1):
            server.backdate("trainjobs", NS, tj, 3600)
        found = {f.job_id: f.state for f in ex.find(rd_a, time.time() - 5)}
        assert found == {a1: "PENDING", a2: "COMPLETED"}
        assert {f.job_id for f in ex.find(rd_b, time.time() - 5)} == {b0}
        # a minute's slack for two machines' clocks: a job made 30 s before the given time is still one of it
        assert set(f.job_id for f in ex.find(rd_a, time.time() + 30)) == {a1, a2}
        assert set(f.job_id for f in ex.find(rd_a, time.time() + 120)) == {a1}


@pytest.mark.parametrize("kueue", ["v1beta2", "v1beta1", None])
def test_a_suspended_trainjob_gives_kueues_reason(tmp_path, monkeypatch, kueue):
    """Kueue's reason is on its Workload (the TrainJob only says it is suspended), in whichever of its API
    versions the cluster serves; without Kueue, the TrainJob's own condition."""
    (rd,) = render(tmp_path, 1)
    with FakeApiServer(kueue=kueue) as server:
        kc = server.kubeconfig(tmp_path / "kubeconfig", namespace=NS)
        monkeypatch.setenv("KUBECONFIG", str(kc))
        ex, k = KubernetesExecutor(), Controllers(kc, kueue)
        tj = ex.submit(rd, 0, 600, "USR2@60")
        k.suspend(tj)
        if kueue is None:
            assert ex.poll({tj: rd})[tj].reason == f"suspended: {TRAINJOB_SUSPENDED}"
            return
        k.workload(tj, [
            {"type": "QuotaReserved", "status": "False", "reason": "Pending", "message": KUEUE_NO_QUOTA},
            {"type": "Evicted", "status": "True", "reason": "Preempted", "message": KUEUE_PREEMPTED},
        ])  # fmt: skip
        f = ex.poll({tj: rd})[tj]
        assert (f.state, f.reason) == (
            "PENDING",
            f"suspended by Kueue: evicted: {KUEUE_PREEMPTED}; {KUEUE_NO_QUOTA}",
        )


def table_row(out: str, run: str) -> list[str]:
    """The cells of the run's row in `status`'s table."""
    (line,) = [ln for ln in out.splitlines() if ln.startswith("│") and f" {run} " in ln]
    return [c.strip() for c in line.strip("│").split("│")]


def test_status_shows_why_an_active_kubernetes_job_waits(tmp_path):
    """`status` shows the reason of a job that is pending (Kueue's quota, an image that cannot be pulled)
    or running unusually (a crash loop), and no stale one once it runs normally."""
    with FakeApiServer() as server:
        kc = server.kubeconfig(tmp_path / "kubeconfig", namespace=NS)
        env = {"KUBECONFIG": str(kc), "COLUMNS": "600"}  # one line per row, however long its reason
        study = write_study(tmp_path / "s.yaml", "k8s_why", [{"nodes": 1}], executor="kubernetes")
        doc = yaml.safe_load(study.read_text())
        doc["cluster"]["kubernetes"] = SECTION
        study.write_text(yaml.safe_dump(doc, sort_keys=False))
        db = tmp_path / "store.duckdb"
        res = invoke("submit", study, "--db", db, "--runs-dir", tmp_path / "runs", env=env)
        assert res.exit_code == 0, res.output
        k = Controllers(kc)
        (tj,) = k.trainjobs()
        run = k.trainjobs()[tj]["metadata"]["annotations"]["mimo-jobs.io/run"]
        header = None

        def row() -> dict[str, str]:
            nonlocal header
            res = invoke("status", "k8s_why", "--db", db, env=env)
            assert res.exit_code == 0, res.output
            out = res.output
            header = header or table_row(out.replace("┃", "│"), "run")
            return dict(zip(header, table_row(out, run)))

        # Kueue holds it: not enough quota in its ClusterQueue
        k.suspend(tj)
        k.workload(
            tj, [{"type": "QuotaReserved", "status": "False", "reason": "Pending", "message": KUEUE_NO_QUOTA}]
        )
        r = row()
        assert (r["state"], r["reason"]) == ("PENDING", f"suspended by Kueue: {KUEUE_NO_QUOTA}"), r

        # admitted; the kubelet cannot pull the image
        k.condition(tj, "Suspended", "False", "Resumed", "TrainJob is resumed")
        pull = 'Back-off pulling image "mimo-jobs:latest"'
        k.pod(tj, "Pending", {"state": {"waiting": {"reason": "ImagePullBackOff", "message": pull}}})
        r = row()
        assert (r["state"], r["reason"]) == ("PENDING", f"ImagePullBackOff: {pull}"), r

        # pulled; the container exits at once and the kubelet restarts it with a back-off
        pod = f"{tj}-node-0-0-x7k2p"
        crash = f"back-off 10s restarting failed container=node pod={pod}_{NS}(5d1c)"
        k.pod(tj, "Running", {"state": {"waiting": {"reason": "CrashLoopBackOff", "message": crash}},
                              "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}}})  # fmt: skip
        r = row()
        assert (r["state"], r["reason"]) == ("RUNNING", f"CrashLoopBackOff: {crash}"), r

        # it runs: no reason left over from the waits
        k.pod(tj, "Running", {"state": {"running": {"startedAt": now()}}})
        r = row()
        assert (r["state"], r["reason"]) == ("RUNNING", ""), r

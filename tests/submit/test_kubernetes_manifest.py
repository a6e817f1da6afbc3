"""The Kubernetes executor's launch artefact: golden TrainJob manifests (production and CPU study), checked
against the Trainer API's published models (`kubeflow-trainer-api`), removed and unknown fields refused,
the study section and its refusals, and launch.sh's PET_* mode giving the ranks SLURM's mode gives.

After an intended change, regenerate the golden files with `MIMO_JOBS_UPDATE_GOLDEN=1 python3 -m pytest
tests/submit/test_kubernetes_manifest.py` and review `git diff tests/submit/golden_k8s`.
"""

from __future__ import annotations

import copy
import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from helpers import STUDIES
from mimo_jobs.contract.rundir import RunDir
from mimo_jobs.study.diagnose import diagnose_data
from mimo_jobs.study.expand import runs_of
from mimo_jobs.study.load import StudyError, parse_study, read_yaml
from mimo_jobs.study.render import RenderError, plan_runs
from mimo_jobs.submit.executors.kubernetes import schema
from mimo_jobs.submit.executors.kubernetes.executor import KubernetesExecutor

pytest.importorskip("kubeflow_trainer_api")  # the published models the manifests are checked against

GOLDEN = Path(__file__).parent / "golden_k8s"
UPDATE = os.environ.get("MIMO_JOBS_UPDATE_GOLDEN") == "1"
# What a site writes in its study to run it on a Kubernetes cluster (docs/kubernetes.md)
SECTIONS = {
    "scale_33n_68n_100n.yaml": {
        "pvc": "mimo-runs",
        "namespace": "llm-training",
        "image": "registry.example.com/ml/mimo-jobs:0.1.0",
        "queue": "team-a",
        "priority_class": "research-high",
        "resources": {"memory": "1600Gi", "rdma/ib": "8"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "node_selector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
        "image_pull_secrets": ["registry-pull"],
    },
    "cpu_local.yaml": {"pvc": "mimo-runs"},
}


def study_doc(study_file: str) -> dict:
    doc = read_yaml(STUDIES / study_file)
    doc["cluster"]["kubernetes"] = copy.deepcopy(SECTIONS[study_file])
    return doc


def manifests(doc: dict, root: Path = Path("/runs")) -> dict[str, str]:
    """run name -> trainjob.yaml as rendered for the runs root `root` (nothing written)."""
    ex = KubernetesExecutor()
    planned = plan_runs(runs_of(parse_study(doc, env={})), root, None, ex.pet_rendezvous, ex.artefacts)
    return {p.spec.name: p.text(p.rd.trainjob_yaml) for p in planned}


@pytest.mark.parametrize("study_file", sorted(SECTIONS))
def test_trainjob_manifests_match_the_golden_files(study_file):
    got = manifests(study_doc(study_file))
    assert got
    study = Path(study_file).stem
    if UPDATE:
        for run, text in got.items():
            (GOLDEN / study).mkdir(parents=True, exist_ok=True)
            (GOLDEN / study / f"{run}.yaml").write_text(text)
    on_disk = {p.stem for p in (GOLDEN / study).glob("*.yaml")}
    assert on_disk == set(got)
    for run, text in got.items():
        assert text == (GOLDEN / study / f"{run}.yaml").read_text(), (
            f"{study}/{run} differs from its golden file"
        )


@pytest.mark.parametrize("study_file", sorted(SECTIONS))
def test_golden_manifests_are_trainjobs_of_the_published_api(study_file):
    from kubeflow_trainer_api.models.trainer_v1alpha1_train_job import TrainerV1alpha1TrainJob

    runs = {r.name: r for r in runs_of(parse_study(study_doc(study_file), env={}))}
    for path in sorted((GOLDEN / Path(study_file).stem).glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        schema.check(doc, str(path))
        tj = TrainerV1alpha1TrainJob.from_dict(doc)
        run = runs[path.stem]
        # the job SLURM would get: the run's nodes, its GPUs (processes) per node, the same launch.sh
        assert tj.spec.trainer.num_nodes == run.layout.nodes
        assert tj.spec.trainer.num_proc_per_node == run.cluster.gpus_per_node
        assert tj.spec.trainer.command[-1].endswith(f"-{run.run_id}/launch.sh")
        assert tj.spec.runtime_ref.name == "torch-distributed"
        (patch,) = tj.spec.runtime_patches
        pod = patch.training_runtime_spec.template.spec.replicated_jobs[0].template.spec.template.spec
        mounts = {m.name: m.mount_path for m in pod.containers[0].volume_mounts}
        claim = next(v.persistent_volume_claim.claim_name for v in pod.volumes if v.persistent_volume_claim)
        assert claim == "mimo-runs" and mounts["mimo-jobs-runs"] == "/runs"


def _trainjob() -> dict:
    return yaml.safe_load(next((GOLDEN / "scale_33n_68n_100n").glob("*.yaml")).read_text())


def test_a_removed_field_is_refused_with_what_replaced_it():
    doc = _trainjob()
    pod = doc["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    doc["spec"]["podTemplateOverrides"] = [
        {"targetJobs": [{"name": "node"}], "spec": pod["template"]["spec"]}
    ]
    with pytest.raises(
        schema.ManifestError, match=r"spec\.podTemplateOverrides: removed .* v2\.2 .*runtimePatches"
    ):
        schema.check(doc)


@pytest.mark.parametrize(
    "where, key",
    [
        (("spec", "trainer"), "numNode"),  # a misspelt field
        (("spec",), "podGroupPolicy"),  # a runtime's field, not a TrainJob's
        (("spec", "runtimePatches", 0, "trainingRuntimeSpec", "template", "spec"), "network"),
    ],
)
def test_an_unknown_field_is_refused_at_its_path(where, key):
    doc = _trainjob()
    node = doc
    for part in where:
        node = node[part]
    node[key] = 1
    path = ".".join(p if isinstance(p, str) else f"[{p}]" for p in (*where, key)).replace(".[", "[")
    with pytest.raises(schema.ManifestError, match=re.escape(f"{path}: unknown field")):
        schema.check(doc)


def test_a_wrong_type_is_refused_by_the_models():
    doc = _trainjob()
    doc["spec"]["trainer"]["numNodes"] = "33"
    with pytest.raises(schema.ManifestError, match="numNodes"):
        schema.check(doc)


def test_a_study_override_through_the_removed_field_is_refused():
    doc = study_doc("cpu_local.yaml")
    doc["cluster"]["kubernetes"]["podTemplateOverrides"] = [{"targetJobs": [{"name": "node"}]}]
    problems = diagnose_data(doc, env={}).problems
    assert [p.path for p in problems] == ["cluster.kubernetes"]
    assert "removed from the TrainJob API in Kubeflow Trainer v2.2" in problems[0].message


def test_a_runtime_patch_with_an_unknown_field_is_refused_before_anything_is_written(tmp_path):
    doc = study_doc("cpu_local.yaml")
    doc["cluster"]["kubernetes"]["runtime_patches"] = [
        {"manager": "site", "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [
            {"name": "node", "template": {"spec": {"template": {"spec": {"hostNetwork": True}}}}}]}}}}
    ]  # fmt: skip
    with pytest.raises(RenderError) as e:
        manifests(doc, tmp_path)
    assert "hostNetwork: unknown field" in str(e.value)
    assert not any(tmp_path.iterdir())


def test_the_executor_needs_its_section_and_leaves_the_reserved_variables_alone():
    doc = read_yaml(STUDIES / "cpu_local.yaml")
    doc["cluster"]["env"]["PET_MASTER_PORT"] = "1234"
    runs = runs_of(parse_study(doc, env={}))
    problems = KubernetesExecutor().problems(runs)
    assert any("needs cluster.kubernetes" in p for p in problems)
    assert any("PET_MASTER_PORT" in p and "torch plugin" in p for p in problems)
    doc["cluster"]["executor"] = "kubernetes"
    with pytest.raises(StudyError, match="needs its section cluster.kubernetes"):
        parse_study(doc, env={})


def test_a_checkpoint_directory_off_the_pvc_is_refused(tmp_path):
    doc = study_doc("cpu_local.yaml")
    doc["trainer"]["checkpoint_dir"] = "/elsewhere/ckpt"
    with pytest.raises(RenderError, match="outside the runs root"):
        manifests(doc, tmp_path)


def test_flat_slurm_keys_and_the_slurm_section_are_one_study():
    flat = read_yaml(STUDIES / "scale_33n_68n_100n.yaml")
    nested = copy.deepcopy(flat)
    c = nested["cluster"]
    c["slurm"] = {k: c.pop(k) for k in ("partition", "exclusive") if k in c}
    a, b = parse_study(flat, env={}), parse_study(nested, env={})
    assert a.cluster == b.cluster and a.cluster.slurm.partition == "batch"
    assert [r.run_id for r in runs_of(a)] == [r.run_id for r in runs_of(b)]
    both = copy.deepcopy(nested)
    both["cluster"]["partition"] = "other"
    problems = diagnose_data(both, env={}).problems
    assert any("partition given both flat under cluster and in cluster.slurm" in p.message for p in problems)
    bad = copy.deepcopy(flat)
    bad["cluster"]["qos"] = "has space"
    assert [p.path for p in diagnose_data(bad, env={}).problems] == [
        "cluster.qos"
    ]  # where the study wrote it


# ---------------------------------------------------------------- launch.sh: the same ranks as SLURM's

ARGS_PY = """#!/bin/bash
# stands in for the interpreter: prints what launch.sh asked torchrun for, one word a line
printf '%s\\n' "$@"
"""


def _torchrun_args(launch: Path, env: dict) -> list[str]:
    keep = {k: os.environ[k] for k in ("PATH", "HOME") if k in os.environ}
    p = subprocess.run(
        ["bash", str(launch)], env={**keep, **env}, capture_output=True, text=True, timeout=60, check=False
    )
    assert p.returncode == 0, p.stderr
    words = p.stdout.splitlines()
    return words[words.index("torch.distributed.run") + 1 :]


def test_pet_mode_launches_torchrun_with_slurms_node_layout(tmp_path):
    """A 2-node run: node rank 1 from PET_* (a TrainJob pod) gets the torchrun arguments that SLURM's node 1
    gets, so node 1's processes are global ranks 4-7 under both (rank = node rank x 4 + local rank)."""
    fake = tmp_path / "python"
    fake.write_text(ARGS_PY)
    fake.chmod(0o755)
    doc = study_doc("cpu_local.yaml")
    doc["cluster"]["python"] = str(fake)
    doc["matrix"] = {
        "points": [{"nodes": 2, "gbs": 6, "encoder": {"tp": 2, "dp": 1}, "llm": {"tp": 2, "dp": 3}}]
    }
    ex = KubernetesExecutor()
    root = tmp_path / "runs"
    (p,) = plan_runs(runs_of(parse_study(doc, env={})), root, None, ex.pet_rendezvous, ex.artefacts)
    rd = RunDir(p.rd.root)
    rd.root.mkdir(parents=True)
    rd.launch_sh.write_text(p.text(rd.launch_sh))
    pet = _torchrun_args(rd.launch_sh, {
        "PET_NNODES": "2", "PET_NPROC_PER_NODE": "4", "PET_NODE_RANK": "1", "PET_MASTER_ADDR": "job-node-0-0.job",
        "PET_MASTER_PORT": "29500", "MIMO_JOBS_JOB_ID": "mj-x-a0"})  # fmt: skip
    slurm = _torchrun_args(rd.launch_sh, {
        "SLURM_JOB_ID": "77", "SLURM_NODEID": "1", "SLURM_JOB_NUM_NODES": "2", "MASTER_ADDR": "job-node-0-0.job",
        "MASTER_PORT": "29500"})  # fmt: skip

    def flags(words):
        return {w: words[i + 1] for i, w in enumerate(words) if w.startswith("--") and i + 1 < len(words)}

    fp, fs = flags(pet), flags(slurm)
    for f in ("--nnodes", "--nproc-per-node", "--node-rank", "--master-addr", "--master-port"):
        assert fp[f] == fs[f], f
    assert (fp["--nnodes"], fp["--nproc-per-node"], fp["--node-rank"]) == ("2", "4", "1")
    assert fp["--log-dir"].endswith("/logs/job-mj-x-a0/node-1")
    # a pod of a job with another node count is refused before torchrun starts
    bad = subprocess.run(["bash", str(rd.launch_sh)], env={"PATH": os.environ["PATH"], "PET_NNODES": "3", "PET_NODE_RANK": "0",
                         "PET_MASTER_ADDR": "a", "PET_MASTER_PORT": "1", "MIMO_JOBS_JOB_ID": "j"},
                         capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert bad.returncode == 2 and "planned for 2 node(s) but its job has 3" in bad.stderr


PROBE = """
import sys
from mimo_jobs.cli.app import app
try:
    app(sys.argv[1:], standalone_mode=False)
except SystemExit:
    pass
print("LOADED", sorted(m for m in ("kubernetes", "kubeflow_trainer_api") if m in sys.modules))
"""


def test_validating_a_kubernetes_study_loads_no_client(tmp_path):
    study = tmp_path / "k8s.yaml"
    doc = study_doc("cpu_local.yaml")
    doc["cluster"]["executor"] = "kubernetes"
    study.write_text(yaml.safe_dump(doc))
    import sys

    p = subprocess.run(
        [sys.executable, "-c", PROBE, "validate", str(study)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert "LOADED []" in p.stdout, p.stdout + p.stderr
    assert "OK, 4 run(s) feasible" in " ".join(p.stdout.split())


def test_dry_run_writes_the_manifests_and_nothing_else_and_render_writes_what_they_run(tmp_path):
    from helpers.submit import cli

    study, runs, db = tmp_path / "k8s.yaml", tmp_path / "runs", tmp_path / "store.duckdb"
    doc = study_doc("cpu_local.yaml")
    doc["cluster"]["executor"] = "kubernetes"
    study.write_text(yaml.safe_dump(doc))
    p = cli("submit", study, "--dry-run", "--runs-dir", runs, "--db", db, check=True)
    written = sorted(f.relative_to(runs) for f in runs.rglob("*") if f.is_file())
    assert [f.name for f in written] == ["trainjob.yaml"] * 4 and not db.exists()
    assert "$ kubectl create -f" in p.stdout and "nothing submitted" in p.stdout
    dry = {f: (runs / f).read_text() for f in written}
    # `render` writes the same manifests and the launch.sh they run, in its pod mode
    cli("render", study, "-o", runs, check=True)
    for f, text in dry.items():
        assert (runs / f).read_text() == text
        assert 'NODE_RANK="$PET_NODE_RANK"' in ((runs / f).parent / "launch.sh").read_text()
    # rendered for SLURM, the same study's launch.sh has no pod mode (as its golden files say)
    doc["cluster"]["executor"] = "slurm"
    study.write_text(yaml.safe_dump(doc))
    cli("render", study, "-o", tmp_path / "slurm", check=True)
    launches = list((tmp_path / "slurm").rglob("launch.sh"))
    assert len(launches) == 4 and not any("PET_" in f.read_text() for f in launches)
    assert not list((tmp_path / "slurm").rglob("trainjob.yaml"))


def test_an_unreachable_api_server_is_a_clear_refusal_and_nothing_is_recorded(tmp_path):
    from helpers.fake_kube import FakeApiServer
    from helpers.submit import cli, query

    with FakeApiServer() as server:  # a kubeconfig for a server that is gone by the time we submit
        kubeconfig = server.kubeconfig(tmp_path / "kubeconfig")
    doc = study_doc("cpu_local.yaml")
    doc["cluster"].update(executor="kubernetes")
    doc["cluster"]["kubernetes"]["context"] = "fake"
    study, db = tmp_path / "k8s.yaml", tmp_path / "store.duckdb"
    study.write_text(yaml.safe_dump(doc))
    p = cli("submit", study, "--db", db, "--runs-dir", tmp_path / "runs", env={"KUBECONFIG": str(kubeconfig)})
    assert p.returncode == 1, p.stdout + p.stderr
    assert "cannot reach the Kubernetes API server" in p.stderr and "submitted before it: none" in p.stderr
    assert query(db, "SELECT count(*) FROM jobs") == [(0,)]

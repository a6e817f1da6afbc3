"""The image, built and run for real, daemonless: Debian's podman + runc build the Dockerfile with BASE_IMAGE
swapped for a locally bootstrapped Debian+Python base (registries are unreachable here), then

- the image answers `mimo-jobs --version/validate`, carries its provenance and no build tools or caches;
- the README's local use: `mimo-jobs submit <study> --executor local --wait` then `mimo-jobs report` in the
  image, with the working dir mounted: trainer, store and run dirs land on the host, where this test reads
  the DuckDB file and metrics itself;
- the cluster path: the rendered sbatch.sh runs for real with `srun` replaced by a pyxis stand-in
  (pyxis_srun.sh maps the --container-* flags onto podman), so launch.sh + torchrun + trainer run inside the
  image with exactly the rendered mounts and workdir; the host then ingests the run dir.

CI budget: build (base bootstrap included) + both runs within ~6 minutes on a 2-core machine."""

from __future__ import annotations

import hashlib
import json
import math
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
import tomllib
import yaml
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from helpers.container import BUILD_SCRIPT, PYXIS_SRUN, REPO, podman_env, slurm_env, write_stubs

# The timeout covers the module fixture (base bootstrap + build) on a loaded machine, not the CI budget.
pytestmark = [pytest.mark.container, pytest.mark.slow, pytest.mark.timeout(2400)]

STUDY = Path(__file__).with_name("container_cpu.yaml")
STUDY_DOC = yaml.safe_load(STUDY.read_text())
TRAIN_ITERS = STUDY_DOC["trainer"]["train_iters"]
RUN_NAME = "1n-e1x1-l1x1x1-g2"  # 1 node, encoder TP1 x DP1, LLM TP1 x EP1 x DP1, GBS 2
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
TRAIN_PINS = dict(r.split("==") for r in PYPROJECT["optional-dependencies"]["train"] if "==" in r)


def podman(*args: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run(
        ["podman", *args], env=podman_env(), capture_output=True, text=True, timeout=timeout, check=False
    )
    if check:
        assert p.returncode == 0, f"podman {' '.join(args)}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return p


BUILT_FROM: dict = {}  # the commit this test told the build to record; the sources the build saw


def package_sources() -> dict[str, str]:
    pkg = REPO / "mimo_jobs"
    return {
        str(f.relative_to(pkg)): hashlib.sha256(f.read_bytes()).hexdigest()
        for f in sorted(pkg.rglob("*.py"))
        if "__pycache__" not in f.parts and not f.is_symlink()
    }


@pytest.fixture(scope="module")
def image() -> str:
    BUILT_FROM["sha"] = host_git_sha()
    before = package_sources()
    env = dict(podman_env(), MIMO_JOBS_GIT_SHA=BUILT_FROM["sha"])
    p = subprocess.run(
        ["bash", str(BUILD_SCRIPT)], env=env, capture_output=True, text=True, timeout=1800, check=False
    )
    after = package_sources()
    # Files nobody edited while the build ran (CI: all of them; a shared checkout moves under a long build).
    BUILT_FROM["sources"] = {k: v for k, v in before.items() if after.get(k) == v}
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-6000:]
    print(p.stderr.strip())  # the build's phases with elapsed seconds
    return p.stdout.strip().splitlines()[-1]


INSTALLED_SOURCES = """
import hashlib, pathlib, mimo_jobs
pkg = pathlib.Path(mimo_jobs.__file__).parent
for f in sorted(pkg.rglob("*.py")):
    if "__pycache__" not in f.parts:
        print(f.relative_to(pkg), hashlib.sha256(f.read_bytes()).hexdigest())
"""


def in_image(image: str, *cmd: str, workdir: Path | None = None, check: bool = True, timeout: float = 600):
    vol = ["--volume", f"{workdir}:/work"] if workdir else []
    return podman("run", "--rm", "--network", "none", *vol, image, *cmd, check=check, timeout=timeout)


def host_git_sha() -> str:
    return subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()


def test_image_cli_provenance_and_clean_layers(image, tmp_path):
    assert in_image(image, "mimo-jobs", "--version").stdout.strip() == f"mimo-jobs {PYPROJECT['version']}"
    assert in_image(image, "mimo-jobs", "validate", "/opt/mimo-jobs/studies/cpu_local.yaml").returncode == 0
    # 1 encoder + 2 LLM ranks do not tile 1 node x 2 processes: refused with the rule and what fits.
    bad = dict(STUDY_DOC, matrix={"points": [{"nodes": 1, "gbs": 2, "encoder": {"dp": 1}, "llm": {"dp": 2}}]})
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(bad))
    r = in_image(image, "mimo-jobs", "validate", "bad.yaml", workdir=tmp_path, check=False)
    assert r.returncode == 2 and "tiling" in r.stdout + r.stderr and "llm.dp=1" in r.stdout + r.stderr

    doc = json.loads(in_image(image, "cat", "/opt/mimo-jobs/PROVENANCE.json").stdout)
    assert doc["version"] == PYPROJECT["version"] and doc["git_sha"] == BUILT_FROM["sha"]
    # a bare base gets a torch in train's range
    torch_range = next(r for r in PYPROJECT["optional-dependencies"]["train"] if r.startswith("torch"))
    assert Version(doc["versions"]["torch"]) in SpecifierSet(torch_range.removeprefix("torch"))
    assert doc["versions"]["megatron-core"] == TRAIN_PINS["megatron-core"]
    assert doc["base_image"].startswith("localhost/mimo-jobs-ci-base")
    env = dict(line.split("=", 1) for line in in_image(image, "env").stdout.splitlines() if "=" in line)
    assert env["MIMO_JOBS_GIT_SHA"] == doc["git_sha"]
    assert env["MIMO_JOBS_PROVENANCE"] == "/opt/mimo-jobs/PROVENANCE.json"

    # The installed package is this checkout's code, not a stale cached layer.
    listing = in_image(image, "python3", "-c", INSTALLED_SOURCES).stdout
    installed = dict(line.split() for line in listing.splitlines())
    stable = BUILT_FROM["sources"]
    assert len(stable) > 10 and {k: installed.get(k) for k in stable} == stable

    probe = (
        "for t in gcc cc g++ make; do command -v $t; done; find /root/.cache /tmp -type f | head; "
        "ls -d /src /dist 2>/dev/null; command -v mimo-jobs; ls /opt/mimo-jobs/templates /opt/mimo-jobs/studies"
    )
    out = in_image(image, "bash", "-c", probe + "; true").stdout.split()
    assert out[0] == "/usr/local/bin/mimo-jobs", out  # nothing before it: no compilers, caches, sources
    assert {"sbatch.sh.j2", "launch.sh.j2", "cpu_local.yaml"} <= set(out[1:])


def test_local_study_end_to_end_in_the_image(image, tmp_path):
    """README local use: submit --executor local, then report, in the image; results land in the mount."""
    (tmp_path / "study.yaml").write_text(STUDY.read_text())
    sub = in_image(
        image,
        "mimo-jobs",
        "submit",
        "study.yaml",
        "--executor",
        "local",
        "--wait",
        workdir=tmp_path,
        check=False,
        timeout=900,
    )
    assert sub.returncode == 0, sub.stdout[-4000:] + sub.stderr[-4000:]
    rep = in_image(image, "mimo-jobs", "report", "container_cpu", "--format", "json", workdir=tmp_path)
    report = json.loads(rep.stdout)
    assert RUN_NAME in json.dumps(report)

    (run_dir,) = (tmp_path / "runs" / "container_cpu").glob(f"{RUN_NAME}-*")  # <run name>-<run id>
    assert (run_dir / "run.yaml").is_file() and (run_dir / "metrics.jsonl").is_file()
    con = duckdb.connect(str(tmp_path / "mimo-jobs.duckdb"), read_only=True)
    jobs = con.execute("SELECT executor, state FROM jobs").fetchall()
    assert jobs == [("local", "COMPLETED")]
    its = con.execute("SELECT iteration, loss FROM iterations ORDER BY iteration").fetchall()
    assert [i for i, _ in its] == list(range(1, TRAIN_ITERS + 1))
    assert all(math.isfinite(loss) and loss > 0 for _, loss in its)
    # No git checkout in the image: the run's provenance is the commit the image was built from.
    ((name, version, sha),) = con.execute("SELECT name, pkg_version, git_sha FROM runs").fetchall()
    assert (name, version, sha) == (RUN_NAME, PYPROJECT["version"], BUILT_FROM["sha"])
    prov = yaml.safe_load((run_dir / "run.yaml").read_text())["provenance"]
    assert (prov["git_sha"], prov["git_dirty"]) == (BUILT_FROM["sha"], False)


def test_rendered_pyxis_step_runs_in_the_image(image, tmp_path):
    """sbatch.sh as rendered for pyxis, run by bash with the pyxis stand-in as srun: the trainer inside the
    image must find run.yaml and write metrics/logs through exactly the rendered mounts."""
    doc = json.loads(json.dumps(STUDY_DOC))
    doc["cluster"].update(executor="slurm", container={"image": image, "runtime": "pyxis"})
    (tmp_path / "pyxis.yaml").write_text(yaml.safe_dump(doc))
    runs = tmp_path / "runs"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "mimo_jobs.cli",
            "render",
            str(tmp_path / "pyxis.yaml"),
            "--output",
            str(runs),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    (run_dir,) = (runs / "container_cpu").glob(f"{RUN_NAME}-*")  # <run name>-<run id>
    bin_dir, out = tmp_path / "bin", tmp_path / "out"
    out.mkdir()
    write_stubs(bin_dir, srun=PYXIS_SRUN)
    env = slurm_env(bin_dir, out, job_id=4242, CONTAINERS_CONF=podman_env()["CONTAINERS_CONF"])
    p = subprocess.run(
        ["bash", str(run_dir / "sbatch.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    assert "srun exited with status 0" in p.stdout

    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    iters = [r["iteration"] for r in recs if r.get("kind") == "iteration"]
    assert iters == list(range(1, TRAIN_ITERS + 1)) and {r["job_id"] for r in recs} == {"4242"}
    assert (run_dir / "logs" / "job-4242" / "node-0").is_dir()

    db = tmp_path / "host.duckdb"
    subprocess.run(
        [sys.executable, "-m", "mimo_jobs.cli", "ingest", str(run_dir), "--db", str(db)],
        check=True,
        capture_output=True,
        text=True,
    )
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT count(*) FROM iterations WHERE job_id = '4242'").fetchone()[0] == TRAIN_ITERS

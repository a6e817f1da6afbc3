"""Helpers for the checkpoint tests: render a real run.yaml and launch the real trainer under torchrun."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import yaml

from helpers.launch import trainer, worker_env
from mimo_jobs.contract.rundir import RunDir
from mimo_jobs.study.expand import runs_of
from mimo_jobs.study.load import parse_study
from mimo_jobs.study.runspec import run_yaml_doc


def make_run(
    root: Path,
    *,
    enc_dp: int,
    llm_dp: int,
    llm_tp: int = 1,
    enc_tp: int = 1,
    llm_ep: int = 1,
    llm_pp: int = 1,
    model: str | dict = "tiny",
    gbs: int,
    mbs: int = 1,
    iters: int,
    save_interval: int | None = 2,
    keep: int = 2,
    distopt: bool = False,
    name: str = "ckpt",
    data: dict | None = None,
    seed: int = 1234,
    freeze: dict | None = None,
    checkpoint_dir: str | None = None,
    colocated: bool = False,
    init: dict | None = None,
    encoders: dict | None = None,
) -> Path:
    """A one-node CPU run (processes = ranks) rendered to <root>/runs/<name>/<run>/run.yaml (colocated: the
    LLM's ranks run the encoder too; enc_tp/enc_dp are ignored; `encoders` sizes each of several encoder
    modules on ranks of its own, in place of enc_tp/enc_dp)."""
    llm = llm_tp * llm_pp * llm_dp
    world = llm if colocated else enc_tp * enc_dp + llm
    if encoders and not colocated:  # several encoder modules, each on ranks of its own: {name: {tp, dp}}
        world = llm + sum(m.get("tp", 1) * m.get("dp", 1) for m in encoders.values())
    point = {
        "nodes": 1,
        "llm": {"tp": llm_tp, "pp": llm_pp, "dp": llm_dp, "ep": llm_ep},
        "gbs": gbs,
        "mbs": mbs,
    }
    if colocated:
        point["colocated"] = True
    elif encoders:
        point["encoders"] = encoders
    else:
        point["encoder"] = {"tp": enc_tp, "dp": enc_dp}
    trainer = {
        "model": model,
        "seq_length": 32,
        "train_iters": iters,
        "save_interval": save_interval,
        "keep_checkpoints": keep,
        "use_distributed_optimizer": distopt,
        "seed": seed,
        "lr": {"schedule": "cosine", "max": 2e-3, "min": 1e-4, "warmup_samples": gbs},
        "data": data or {"provider": "mock", "image_sizes": [8, 12, 16]},
    }
    if freeze:
        trainer["freeze"] = freeze
    if checkpoint_dir:
        trainer["checkpoint_dir"] = checkpoint_dir
    if init:
        trainer["init"] = init
    study = parse_study(
        {
            "name": name,
            "cluster": {"executor": "local", "accelerator": "cpu", "gpus_per_node": world},
            "trainer": trainer,
            "matrix": {"points": [point]},
        },
        env={},
    )
    (spec,) = runs_of(study)
    rd = RunDir.of(root / "runs", spec.study, spec.name, spec.run_id)
    rd.root.mkdir(parents=True, exist_ok=True)
    doc = run_yaml_doc(spec, rd.root, provenance={"git_sha": "0" * 40})
    rd.run_yaml.write_text(yaml.safe_dump(doc, sort_keys=False))
    return rd.run_yaml


def world_of(run_yaml: Path) -> int:
    doc = yaml.safe_load(run_yaml.read_text())
    return int(doc["run"]["layout"]["gpus_per_node"])


def trainer_env(extra: dict | None = None) -> dict:
    # the crash hook kills its process group: the real torchrun layout, not the tests' zygote
    env = worker_env(zygote="MIMO_CKPT_CRASH" not in (extra or {}))
    for k in (
        "MIMO_CKPT_CRASH",
        "MIMO_CKPT_KILL_AFTER_ITER",
        "MIMO_CKPT_TEST_STEP_DELAY_S",
        "MIMO_JOB_DEADLINE",
        "SLURM_JOB_END_TIME",
        "SLURM_JOB_ID",
        "SLURM_RESTART_COUNT",
        "MIMO_JOBS_JOB_ID",
        "MIMO_JOBS_ATTEMPT",
    ):
        env.pop(k, None)
    env.update(extra or {})
    return env


def torchrun_cmd(run_yaml: Path, *args: str) -> list[str]:
    return trainer(run_yaml, "--quiet", *args, nproc=world_of(run_yaml))


def launch(
    run_yaml: Path, *args: str, env: dict | None = None, timeout: int = 300
) -> subprocess.CompletedProcess:
    # own session: the crash hook SIGKILLs its whole process group (torchrun + ranks), never pytest
    return subprocess.run(
        torchrun_cmd(run_yaml, *args),
        check=False,
        env=trainer_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        start_new_session=True,
    )


def start(run_yaml: Path, *args: str, env: dict | None = None, log: Path) -> subprocess.Popen:
    with open(log, "w") as f:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(
            torchrun_cmd(run_yaml, *args),
            env=trainer_env(env),
            stdout=f,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )


def ranks_of(proc: subprocess.Popen) -> dict[int, int]:
    """{rank: pid} of the worker processes the torchrun `proc` started, found by their environment (RANK and
    this launch's MASTER_PORT) from /proc: under the tests' zygote torchrun runs in a fork of it, so its
    workers are not `proc`'s children. A signal sent to such a worker reaches the trainer process it stands in
    for (helpers/zygote.py)."""
    port = proc.args[proc.args.index("--master-port") + 1]
    out = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            env = dict(x.split("=", 1) for x in (d / "environ").read_text().split("\0") if "=" in x)
        except OSError:
            continue
        if env.get("MASTER_PORT") == port and "RANK" in env:
            out[int(env["RANK"])] = int(d.name)
    return out


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def metrics(run_yaml: Path, name: str = "metrics.jsonl") -> list[dict]:
    p = run_yaml.parent / name
    if not p.exists():
        return []
    return [json.loads(x) for x in p.read_text().splitlines() if x.strip()]


def curve(run_yaml: Path, name: str = "metrics.jsonl") -> dict[int, tuple]:
    """iteration -> (loss, grad_norm, lr, consumed) from the LAST record of each iteration (a resumed run
    redoes the iterations after its checkpoint; the later attempt's record is the one that counts)."""
    out = {}
    for r in metrics(run_yaml, name):
        if r.get("kind") == "iteration":
            out[r["iteration"]] = (r["loss"], r["grad_norm"], r["lr"], r["consumed_samples"])
    return out


def ckpt_dir(run_yaml: Path) -> Path:
    return Path(yaml.safe_load(run_yaml.read_text())["paths"]["checkpoints"])


def ends(run_yaml: Path) -> list[str]:
    return [r["extras"].get("reason") for r in metrics(run_yaml) if r.get("kind") == "end"]

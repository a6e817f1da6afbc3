"""Entry point: `python -m mimo_jobs.trainer RUN_YAML [--reference]` (under torchrun for the real run).

Order matters: everything that can be checked from run.yaml and the launch environment is checked on every
rank BEFORE the first collective, so a mismatched launch ends every rank with one clear message instead of
a hang. After that, an exception on any rank prints `rank N failed: ...` and exits at once (os._exit, no
teardown collectives); torchrun then stops the sibling workers, and the collective timeout
(trainer.timeout_s) bounds the wait anywhere else.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import traceback
from pathlib import Path

import torch
import torch.distributed as dist

import mimo_jobs.study.topology as topology
from mimo_jobs.contract.events import TRAINER_ERROR
from mimo_jobs.contract.manifest import CheckpointError
from mimo_jobs.contract.requeue import REQUEUE_EXIT_CODE
from mimo_jobs.data.check import prepared_videos
from mimo_jobs.data.mock import mock_config
from mimo_jobs.errors import MimoJobsError
from mimo_jobs.model.resolve import arch_of
from mimo_jobs.study.runspec import load_run_yaml
from mimo_jobs.study.runtime_rules import package_installed, runtime_problems
from mimo_jobs.study.spec import StudyError
from mimo_jobs.trainer import cuda_shims
from mimo_jobs.trainer.build import build_state
from mimo_jobs.trainer.checkpoint.checkpointer import Checkpointer, check_init_source
from mimo_jobs.trainer.device import runs_on_cpu
from mimo_jobs.trainer.model.kernels import installed, kernels_for
from mimo_jobs.trainer.model.models import unsupported
from mimo_jobs.trainer.model.packed import packing_problem
from mimo_jobs.trainer.observe.iterlog import IterLogger, init_lines, layout_line
from mimo_jobs.trainer.observe.memory import rank_facts, write_facts
from mimo_jobs.trainer.observe.profile import RankProfile
from mimo_jobs.trainer.observe.trackers import Trackers, trackers_for
from mimo_jobs.trainer.step import train_step
from mimo_jobs.trainer.step.dpsync import ddp_words
from mimo_jobs.trainer.weights.hf_load import HFInitError, check_init
from mimo_jobs.trainer.weights.megatron_load import MegatronInitError

EXIT_BAD_INPUT = 2
EXIT_FAILED = 1
# consecutive iterations with a NaN/Inf loss or gradient (each one skipped) after which the run stops: the
# model is not training (Megatron-LM's --check-for-nan-in-loss-and-grad stops at the first one)
NAN_STOP = 3


class NotTraining(MimoJobsError, RuntimeError):
    """Every recent iteration was skipped for a non-finite loss or gradient; decided alike on every rank (the
    optimizer's skip decision is world-wide)."""


class PreflightError(MimoJobsError, ValueError):
    """run.yaml or the launch environment cannot work; found before the first collective, the same on every
    rank."""


def _env_int(name: str, default: int) -> int:
    v = os.environ.get(name)
    if v is None or v == "":
        return default
    try:
        return int(v)
    except ValueError:
        raise PreflightError(f"environment variable {name}={v!r} is not an integer") from None


def kernel_problem(run, kernels) -> str | None:
    """Why this run cannot train on the rank's layer backend and fused kernels (None: it can)."""
    if run.trainer.data.packing:
        return packing_problem(kernels)
    return None


def preflight(run, doc: dict, reference: bool) -> list[str]:
    """Every check that needs no collective. Raises PreflightError with one specific message. Returns what
    loading trainer.init changes in the weights (for the first line)."""
    lay = run.layout
    viol = topology.check(lay)
    if viol:
        raise PreflightError("run.yaml: infeasible layout: " + "; ".join(str(v) for v in viol))
    plan = topology.rank_layout(lay)
    stored = doc.get("plan") or {}
    if stored and stored != plan.to_dict():
        diff = sorted(k for k in set(stored) | set(plan.to_dict()) if stored.get(k) != plan.to_dict().get(k))
        raise PreflightError(
            f"run.yaml: the stored plan does not match the layout (fields {diff}); re-render it"
        )
    t = run.trainer
    # the rules validate applies; the image sizes are the mock provider's (mock_config below)
    arch = arch_of(t.model)
    found = runtime_problems(t, run.cluster.accelerator, package_installed, arch, prepared_videos)
    if found:
        raise PreflightError(f"run.yaml: {found[0]}")
    why = unsupported(arch, lay)
    if why:
        raise PreflightError(f"run.yaml: {why}")
    try:  # HF sources of trainer.init: config, files and every tensor's shape, before any collective
        notes = check_init(t.init, arch, lay.llm_tp).notes(arch)
    except (HFInitError, MegatronInitError) as e:
        raise PreflightError(e.describe()) from None
    if t.data.provider == "mock":
        mock_config(run, plan)
    on_gpu = not runs_on_cpu(run.cluster.accelerator, torch.cuda.is_available())
    why = kernel_problem(run, kernels_for(on_gpu, installed(), t.attention))
    if why:
        raise PreflightError(f"run.yaml: {why}")
    if reference:
        return notes
    try:  # an unfinished or damaged start checkpoint ends every rank here, before any collective
        check_init_source(run)
    except CheckpointError as e:
        raise PreflightError(f"trainer.init.checkpoint: {e}") from None
    world = _env_int("WORLD_SIZE", 1)
    if world != plan.world:
        raise PreflightError(
            f"world size mismatch: launched with WORLD_SIZE={world} but run.yaml's layout needs {plan.world} "
            f"ranks ({lay.nodes} nodes x {lay.gpus_per_node}: encoder {plan.enc_rank_end} + LLM "
            f"{plan.llm_rank_end - plan.llm_rank_start}); launch with --nnodes {lay.nodes} --nproc-per-node "
            f"{lay.gpus_per_node}"
        )
    local = os.environ.get("LOCAL_WORLD_SIZE")
    if local is not None and int(local) != lay.gpus_per_node:
        raise PreflightError(
            f"LOCAL_WORLD_SIZE={local} but run.yaml has gpus_per_node={lay.gpus_per_node} "
            "processes per node (TP groups must stay inside a node); use --nproc-per-node "
            f"{lay.gpus_per_node}"
        )
    if run.cluster.accelerator == "gpu":
        if not torch.cuda.is_available():
            raise PreflightError(
                "cluster.accelerator=gpu but CUDA is not available on this node; use "
                "accelerator: cpu for a CPU (gloo) run"
            )
    return notes


def _init_dist(run, reference: bool):
    timeout = datetime.timedelta(seconds=run.trainer.timeout_s)
    use_gpu = not runs_on_cpu(run.cluster.accelerator, torch.cuda.is_available())
    if use_gpu:
        torch.cuda.set_device(_env_int("LOCAL_RANK", 0))
    backend = "nccl" if use_gpu else "gloo"
    if reference:
        os.environ["WORLD_SIZE"] = "1"  # HyperCommGrid reads WORLD_SIZE from the environment
        os.environ["RANK"] = "0"
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    else:
        dist.init_process_group(backend, timeout=timeout)
    return backend, timeout


FAIL_ENV = "MIMO_JOBS_TRAINER_FAIL"


def _injected_failure() -> tuple[int, int] | None:
    """Test hook: MIMO_JOBS_TRAINER_FAIL="<rank>:<iteration>" raises on that rank before that iteration,
    to check that one failing rank ends the whole job promptly."""
    v = os.environ.get(FAIL_ENV)
    if not v:
        return None
    rank, _, it = v.partition(":")
    return int(rank), int(it or 1)


def run_training(
    run_yaml: Path, reference: bool, metrics: Path | None, iters: int | None, quiet: bool
) -> int:
    """Train the run of `run_yaml` on this rank; returns the process exit code (0, or REQUEUE_EXIT_CODE)."""
    run, doc = _load_run(run_yaml)
    notes = preflight(run, doc, reference)
    _install_cpu_shims(run)
    backend, timeout = _init_dist(run, reference)
    plan = run.rank_layout()
    st = build_state(run, plan, reference, timeout)
    n_iters = iters or st.train_iters
    notes = [*notes, ddp_words(st)] if ddp_words(st) else notes
    log = _iteration_logger(
        run, plan, doc, metrics, reference, backend, st.prec.kernels.describe(), n_iters, quiet, notes
    )
    ckpt = Checkpointer.for_run(run, doc, run_yaml, reference)
    ckpt.resume(st)
    prof = RankProfile()
    stop = _train_loop(st, n_iters, log, ckpt, prof, lambda: _write_memory_facts(st, doc, reference, prof))
    if stop is None:
        ckpt.at_end(st)
    ckpt.settle()  # completed, or stopped and saved: a stop signal from here on changes nothing
    _write_memory_facts(st, doc, reference, prof)
    if stop is not None:
        log.end(f"requeue: {stop.reason}", st.iteration, st.consumed_samples)
        _shutdown()
        return REQUEUE_EXIT_CODE
    log.end("completed", st.iteration, st.consumed_samples)
    prof.write(st, _mode(st.run, st.reference))
    _shutdown()
    return 0


def _write_memory_facts(st, doc: dict, reference: bool, prof: RankProfile) -> None:
    """Every rank's measured memory (trainer/memory.py) and its phase timers (observe/profile.py) into
    <run dir>/memory/ (not for the reference)."""
    run_dir = (doc.get("paths") or {}).get("run_dir")
    if reference or not run_dir:
        return
    st.meter.peak = prof.saved_peak
    write_facts(Path(run_dir), {**rank_facts(st, st.meter, prof.inflight_peak), **prof.facts(st)})


def _load_run(run_yaml: Path):
    """(RunSpec, run.yaml document); PreflightError if it is not a valid run.yaml."""
    try:
        run, doc = load_run_yaml(run_yaml)
    except Exception as e:  # noqa: BLE001 - yaml, missing keys, pydantic: all mean "not a run.yaml"
        msg = " ".join(str(e).split())[:600]
        raise PreflightError(
            f"{run_yaml}: not a valid run.yaml ({type(e).__name__}: {msg}); re-render it with "
            "`mimo-jobs render`"
        ) from None
    return run, doc


def _install_cpu_shims(run=None) -> None:
    """A CPU run needs the torch.cuda stand-ins of cuda_shims.py (before any model is built), whether or
    not CUDA is visible (without a run: whenever CUDA is absent)."""
    accelerator = run.cluster.accelerator if run is not None else "gpu"
    if runs_on_cpu(accelerator, torch.cuda.is_available()):
        cuda_shims.install()


def _mode(run, reference: bool) -> str:
    """reference (one process), colocated or hetero: what the layout line and the rank profile say."""
    if reference:
        return "reference"
    return "colocated" if run.layout.colocated else "hetero"


def _iteration_logger(
    run,
    plan,
    doc: dict,
    metrics: Path | None,
    reference: bool,
    backend: str,
    kernels: str,
    n_iters: int,
    quiet: bool,
    notes: list[str] = (),
):
    """The IterLogger (active on the last rank, an LLM rank: LLM ranks come last), started with the layout
    and what loading trainer.init changed in the weights."""
    mode = _mode(run, reference)
    last = dist.get_rank() == dist.get_world_size() - 1
    paths = doc.get("paths") or {}
    if metrics is None and paths.get("metrics"):
        metrics = Path(paths["metrics"])
        if reference:
            metrics = metrics.with_name("metrics.reference.jsonl")
    log = IterLogger(
        run,
        plan,
        metrics,
        n_iters,
        active=last,
        echo=not quiet,
        provenance=doc.get("provenance"),
        trackers=_trackers(run, paths, reference, last),
    )
    sources = init_lines(run.trainer.init, arch_of(run.trainer.model))
    log.start(layout_line(run, plan, mode, backend, kernels, notes), mode, backend, sources)
    return log


def _trackers(run, paths: dict, reference: bool, last: bool):
    """TensorBoard / W&B on the rank that writes metrics.jsonl, for real runs (not the reference)."""
    if reference or not last or not paths.get("run_dir"):
        return Trackers()
    return trackers_for(run, Path(paths["run_dir"]))


def _train_loop(st, n_iters: int, log, ckpt, prof: RankProfile, on_checkpoint=None):
    """Iterations until `n_iters`; returns the StopDecision when the world stopped early for a requeue.
    `on_checkpoint()` runs after each periodic checkpoint interval (the memory facts are refreshed then)."""
    fail_at = _injected_failure()
    nan_run = 0
    while st.iteration < n_iters:
        if fail_at is not None and fail_at == (dist.get_rank(), st.iteration + 1):
            raise RuntimeError(f"injected failure ({FAIL_ENV}) at iteration {st.iteration + 1}")
        stats = train_step(st)
        prof.add(stats)
        log.iteration(stats, st.consumed_samples, st.preset, st.run.trainer.seq_length)
        nan_run = nan_run + 1 if stats.nan else 0
        if nan_run >= NAN_STOP:
            raise NotTraining(
                f"iterations {st.iteration - nan_run + 1}-{st.iteration} all had a NaN/Inf loss or gradient and "
                "were skipped: the model is not training (check the starting weights, trainer.init, the "
                "learning rate and the data)"
            )
        stop = ckpt.after_step(st, n_iters, stats.elapsed_s)
        if stop is not None:
            return stop
        every = st.run.trainer.save_interval
        if on_checkpoint is not None and every and st.iteration % every == 0:
            on_checkpoint()
    return None


def _shutdown() -> None:
    dist.barrier()
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m mimo_jobs.trainer",
        description="The heterogeneous MIMO trainer (launch under torchrun).",
    )
    ap.add_argument("run_yaml", type=Path, help="runs/<study>/<run>/run.yaml")
    ap.add_argument(
        "--reference",
        action="store_true",
        help="one process, same model and global batches: the correctness yardstick",
    )
    ap.add_argument(
        "--metrics",
        type=Path,
        default=None,
        help="metrics.jsonl to append to (default: paths.metrics; metrics.reference.jsonl with --reference)",
    )
    ap.add_argument("--iters", type=int, default=None, help="stop after this many iterations")
    ap.add_argument("--quiet", action="store_true", help="do not print iteration lines")
    a = ap.parse_args(argv)
    rank = _env_int("RANK", 0) if not a.reference else 0
    local_rank = _env_int("LOCAL_RANK", 0) if not a.reference else 0
    try:
        if not a.run_yaml.is_file():
            raise PreflightError(f"{a.run_yaml}: no such run.yaml")
        return run_training(a.run_yaml, a.reference, a.metrics, a.iters, a.quiet)
    except PreflightError as e:
        # identical on every rank (it depends only on run.yaml and the environment): say it once per node
        if local_rank == 0:
            print(f"{TRAINER_ERROR}{e}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(EXIT_BAD_INPUT)
    except NotTraining as e:
        if local_rank == 0:
            print(f"{TRAINER_ERROR}{e}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(EXIT_FAILED)
    except MegatronInitError as e:
        # a Megatron checkpoint of another architecture, found once the LLM is built: every LLM rank
        # raises the same line (megatron_load gathers the whole LLM's keys), before training
        if e.report:
            print(f"{TRAINER_ERROR}{e.describe()}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(EXIT_BAD_INPUT)
    except Exception as e:  # noqa: BLE001 - any failure ends this rank at once, naming it
        if isinstance(e, (StudyError, KeyError, FileNotFoundError)) and local_rank == 0:
            print(f"{TRAINER_ERROR}cannot read {a.run_yaml}: {e}", file=sys.stderr, flush=True)
            os._exit(EXIT_BAD_INPUT)
        print(f"mimo-jobs trainer: rank {rank} failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        traceback.print_exc(file=sys.stderr)
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(EXIT_FAILED)

"""Which checkpoint a run can resume from, whichever program wrote it (read without torch).

- the packaged trainer's: the `latest` complete checkpoint of contract/manifest.py (a manifest is written last);
- Megatron-LM's (and any program that keeps its tracker file): `latest_checkpointed_iteration.txt` in the
  checkpoint directory, which Megatron writes only after every rank has finished the save
  (megatron/training/checkpointing.py, `get_checkpoint_tracker_filename`); it holds an iteration or
  `release`;
- for a run of its own command only, the program's own word in its log: Megatron prints
  "successfully saved checkpoint from iteration N to DIR" once a save is complete. Its `--save` may point
  outside the run's checkpoint directory, so the log line is the one sign mimo-jobs can see.
"""

from __future__ import annotations

import re
from pathlib import Path

from mimo_jobs.contract.rundir import RunDir

MEGATRON_TRACKER = "latest_checkpointed_iteration.txt"
# Megatron-LM's line (print_rank_0 in save_checkpoint); the iteration is right-aligned in 7 columns.
SAVED_LINE_RE = re.compile(r"successfully saved checkpoint (?:from|at) iteration\s+(\d+)", re.IGNORECASE)


def megatron_iteration(directory: str | Path) -> int | None:
    """The iteration Megatron's tracker file names (0 for a `release` checkpoint), None without one."""
    try:
        text = (Path(directory) / MEGATRON_TRACKER).read_text(errors="replace").strip()
    except OSError:
        return None
    if text == "release":
        return 0
    return int(text) if text.isdigit() else None  # a half-written or foreign file names nothing


def saved_iteration(directory: str | Path) -> int | None:
    """The newest complete checkpoint in `directory`, in the packaged trainer's format or Megatron's."""
    from mimo_jobs.contract.manifest import CheckpointError, latest_checkpoint, list_checkpoints

    try:
        info = latest_checkpoint(directory)
    except (
        CheckpointError
    ):  # `latest` names a damaged manifest: the newest readable one (the trainer says why)
        complete = list_checkpoints(directory)
        info = complete[-1] if complete else None
    found = [
        i for i in (None if info is None else info.iteration, megatron_iteration(directory)) if i is not None
    ]
    return max(found) if found else None


def logged_iteration(messages: list[str]) -> int | None:
    """The newest iteration a program's "successfully saved checkpoint from iteration N" lines name."""
    its = [int(m.group(1)) for text in messages if (m := SAVED_LINE_RE.search(text or ""))]
    return max(its) if its else None


def runs_own_command(spec: dict) -> bool:
    """A run whose program is its own command (trainer.command or the point's), not the packaged trainer."""
    return bool((spec.get("trainer") or {}).get("command") or (spec.get("point") or {}).get("command"))


def checkpoint_dir(run_dir: str | Path, spec: dict) -> Path:
    return RunDir(Path(run_dir)).checkpoint_dir((spec.get("trainer") or {}).get("checkpoint_dir"))


def saved_messages(con, run_id: str) -> list[str]:
    """The messages of the run's stored checkpoint-saved events (every job of the run)."""
    from mimo_jobs.contract import events as K

    rows = con.execute(
        "SELECT message FROM events WHERE run_id = ? AND kind = ?", [run_id, K.CHECKPOINT_SAVED]
    ).fetchall()
    return [r[0] for r in rows if r[0]]


def resumable_iteration(run_dir: str | Path, spec: dict, con=None, run_id: str | None = None) -> int | None:
    """The iteration the run's next attempt resumes from: its checkpoint directory, and for a run of its own
    command also what its log said it saved (needs the store `con` and `run_id`)."""
    found = saved_iteration(checkpoint_dir(run_dir, spec))
    if con is not None and run_id and runs_own_command(spec):
        logged = logged_iteration(saved_messages(con, run_id))
        if logged is not None:
            found = logged if found is None else max(found, logged)
    return found


# ------------------------------------------------------------------------------------------- continuation

# The fields a run may lengthen and still continue a completed run (Megatron users raise --train-iters and
# --load the same directory). Anything else that differs makes a different run.
LONGER = ("train_iters", "train_samples")
# Fields that name a run rather than describe its training.
_IDENTITY = ("run_id", "index")


def _comparable(spec: dict) -> dict:
    d = {k: v for k, v in spec.items() if k not in _IDENTITY}
    d["trainer"] = {k: v for k, v in (spec.get("trainer") or {}).items() if k not in (*LONGER, "init")}
    return d


def _length(trainer: dict, gbs: int) -> int | None:
    """The run's length in samples (train_iters x gbs, or train_samples)."""
    if trainer.get("train_iters") is not None:
        return int(trainer["train_iters"]) * gbs
    if trainer.get("train_samples") is not None:
        return int(trainer["train_samples"])
    return None


def is_longer_version(new: dict, old: dict) -> bool:
    """Whether run spec `new` (RunSpec.to_dict) differs from the completed run `old` only by a longer
    train_iters/train_samples (and its run id), and gives no start point of its own."""
    if new.get("run_id") == old.get("run_id") or (new.get("trainer") or {}).get("init"):
        return False
    if _comparable(new) != _comparable(old):
        return False
    gbs = int((new.get("layout") or {}).get("gbs") or 1)
    a, b = _length(new.get("trainer") or {}, gbs), _length(old.get("trainer") or {}, gbs)
    return a is not None and b is not None and a > b


def continuation_source(new: dict, completed: list[tuple[str, dict]]) -> tuple[Path, str] | None:
    """(latest checkpoint, run id) of the longest completed run (run dir, spec) that `new` is a longer version
    of (None: none, or none of them saved a complete checkpoint)."""
    from mimo_jobs.contract.manifest import latest_checkpoint

    best: tuple[int, Path, str] | None = None
    for run_dir, old in completed:
        if not is_longer_version(new, old):
            continue
        info = latest_checkpoint(checkpoint_dir(run_dir, old))
        if info is not None and (best is None or info.iteration > best[0]):
            best = (info.iteration, info.path, str(old.get("run_id")))
    return None if best is None else (best[1], best[2])

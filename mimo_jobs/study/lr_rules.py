"""Rules a learning-rate schedule must keep, checked by `validate` for every run and by the trainer's
schedule (trainer/model/schedule.py) on every rank: one owner, so validate never passes what ranks refuse.
Pure: numbers in, a problem out."""

from __future__ import annotations

RULE = "lr-warmup"


def run_samples(train_iters: int | None, train_samples: int | None, gbs: int) -> int:
    """The samples a run trains on: trainer.train_samples, else train_iters x gbs."""
    return train_samples if train_samples is not None else (train_iters or 0) * gbs


def decay_end(decay_samples: int | None, total_samples: int) -> int:
    """Where the decay ends: lr.decay_samples, by default the run's samples (train_iters x gbs)."""
    return decay_samples or total_samples


def warmup_problem(style: str, warmup_samples: int, end: int) -> tuple[str, str] | None:
    """(message, a value that fits) when the warmup outlasts the decay (every schedule but constant decays
    after its warmup, so the warmup must end by the decay end); None when it fits."""
    if style == "constant" or warmup_samples <= end:
        return None
    return (
        f"trainer.lr.warmup_samples={warmup_samples} is beyond the decay end at {end} samples "
        f"(schedule {style!r} decays after its warmup)",
        f"trainer.lr.warmup_samples <= {end}, or a later trainer.lr.decay_samples",
    )

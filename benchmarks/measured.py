"""The planner against the trainer's own GPU runs on megatron-core's local layers
(benchmarks/measured/local_layers.yaml).

python benchmarks/measured.py          per record: the measured step time against the planner's for
                                       Transformer Engine layers and for local layers (the shares stored in
                                       mimo_jobs/predict/hardware.py), and the saved activations against the
                                       planner's unfused-attention activation model
python benchmarks/measured.py --fit    also the shares a fresh fit gives, as hardware.py stores them

Each record is priced as `mimo-jobs predict` prices its study's run: the study file loaded and expanded, the
run found by name, predict.estimate.predict_shape on its GPU. The fit (predict/fit.py `share`): the dense
record fixes LOCAL_COMPUTE_SHARE (both modules' compute fractions times it reproduce its step time), then the
MoE record LOCAL_EXPERTS_SHARE with that compute share.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from mimo_jobs.predict.estimate import Prediction, predict_shape
from mimo_jobs.predict.fit import share
from mimo_jobs.predict.hardware import GPUS, with_layers
from mimo_jobs.predict.run import RunShape, shape_of
from mimo_jobs.predict.steptime import efficiency_for, on_local_layers
from mimo_jobs.study.expand import runs_of
from mimo_jobs.study.load import load_study

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "benchmarks" / "measured" / "local_layers.yaml"


@dataclass(frozen=True)
class Record:
    id: str
    gpu: str
    fits: str  # "compute" | "experts"
    shape: RunShape
    run_id: str  # the run id the study gives now (the record's, while the study file is unchanged)
    measured_s: float
    saved_activations_bytes: int


def load_records(path: Path = DATA) -> list[Record]:
    doc = yaml.safe_load(path.read_text())
    out = []
    for r in doc["records"]:
        study = load_study(REPO / r["study"])
        run = next(x for x in runs_of(study) if x.name == r["run"])
        # the attention the run ran with (the records' runs predate trainer.attention: unfused)
        shape = replace(shape_of(run.layout, run.trainer, run.point.command), attention=r["attention"])
        out.append(
            Record(r["id"], r["gpu"], r["fits"], shape, run.run_id, float(r["measured_s"]),
                   int(r["saved_activations_bytes"]))
        )  # fmt: skip
    return out


def priced(
    rec: Record, layers: str, compute: float | None = None, experts: float | None = None
) -> Prediction:
    """The record's run priced for `layers` (local: at the given shares, else hardware.py's)."""
    gpu = with_layers(GPUS[rec.gpu], layers)
    eff = efficiency_for(with_layers(gpu, "te"))
    if layers == "local":
        eff = on_local_layers(eff, compute, experts)
    return predict_shape(rec.shape, gpu, eff)


def fit_shares(records: list[Record]) -> tuple[float, float]:
    """(compute share, experts share): the first `fits: compute` record, then the first `fits: experts`."""
    dense = next(r for r in records if r.fits == "compute")
    moe = next(r for r in records if r.fits == "experts")
    c = share(lambda s: priced(dense, "local", s, 1.0).time.iteration_s, dense.measured_s)
    x = share(lambda s: priced(moe, "local", c, s).time.iteration_s, moe.measured_s)
    return c, x


def activations(p: Prediction) -> int:
    """The planner's saved activations of a colocated rank: every module's activations on it."""
    return max(sum(m.activation_bytes for m in c.modules) for c in p.memory.classes)


def main(argv: list[str]) -> None:
    records = load_records()
    gib = 1024**3
    print(
        f"{'record':24} {'measured':>9} {'te':>8} {'local':>8} {'error':>7}   saved act. measured / predicted"
    )
    for r in records:
        te, local = priced(r, "te"), priced(r, "local")
        err = local.time.iteration_s / r.measured_s - 1
        act = activations(local)
        print(
            f"{r.id:24} {r.measured_s:9.3f} {te.time.iteration_s:8.3f} {local.time.iteration_s:8.3f} {err:+7.1%}"
            f"   {r.saved_activations_bytes / gib:.2f} / {act / gib:.2f} GiB ({act / r.saved_activations_bytes - 1:+.1%})"
        )
    if "--fit" in argv:
        c, x = fit_shares(records)
        print(f"LOCAL_COMPUTE_SHARE = {c}\nLOCAL_EXPERTS_SHARE = {x}")


if __name__ == "__main__":
    main(sys.argv[1:])

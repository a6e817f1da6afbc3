"""Price a study's runs from a measured operator table and print predicted against measured, run by run.

  python3 benchmarks/gpu/ops_check.py OPS.yaml STUDY.yaml [STUDY.yaml ...]     (the store: $MIMO_JOBS_DB, else ./mimo-jobs.duckdb)

Each study is read as written with `cluster.hardware.ops: OPS.yaml` set (its own validation: the table is
checked as any study's would be; run ids do not change), priced twice, from the table and from the published
figures alone, and set beside the median steady-state iteration time `mimo-jobs report` measured for the
same run id. A run the operator model does not price (local layers) says so: the FLOPs model priced
it, and the table changed nothing.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from mimo_jobs import strictread
from mimo_jobs.predict.estimate import predict_run
from mimo_jobs.predict.hardware import study_gpu
from mimo_jobs.report.steptimes import measured_iteration_s
from mimo_jobs.study.expand import runs_of
from mimo_jobs.study.load import parse_study


def priced_study(path: Path, ops: Path):
    """The study at `path` with cluster.hardware.ops set to `ops`, validated as the study file itself."""
    data = strictread.yaml_text(path.read_text())
    hw = data.setdefault("cluster", {}).get("hardware") or {}
    data["cluster"]["hardware"] = {**hw, "ops": str(ops.resolve())}
    return parse_study(data, source=str(path))


def _err(pred: float, meas: float | None) -> str:
    return "-" if not meas else f"{(pred - meas) / meas:+.1%}"


def check(ops: Path, study_path: Path, db: Path) -> list[str]:
    study = priced_study(study_path, ops)
    gpu = study_gpu(study.cluster)
    measured = measured_iteration_s(db, study.name)
    lines = [f"{study.name} on {gpu.name} ({gpu.layers} layers), table {ops} (device {gpu.ops.device}):"]
    for run in runs_of(study, str(study_path)):
        table = predict_run(run, gpu)
        published = predict_run(run, replace(gpu, ops=None))
        meas = measured.get(run.run_id)
        by = (
            "ops table" if table.time.ops_file else "FLOPs model (the operator model does not price this run)"
        )
        lines.append(
            f"  {run.name} ({run.run_id}): predicted {table.time.iteration_s:.4f} s/iter [{by}], "
            f"published figures {published.time.iteration_s:.4f}, measured "
            f"{'-' if meas is None else f'{meas:.4f}'}; error {_err(table.time.iteration_s, meas)} "
            f"(published {_err(published.time.iteration_s, meas)})"
            + (
                f"; {len(table.time.ops_clamped)} shape(s) outside the table"
                if table.time.ops_clamped
                else ""
            )
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ops", type=Path)
    ap.add_argument("studies", type=Path, nargs="+")
    a = ap.parse_args(argv)
    from mimo_jobs.store.connection import db_path

    db = db_path()
    for s in a.studies:
        print("\n".join(check(a.ops, s, db)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

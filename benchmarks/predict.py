"""Time `predict` on a generated 1,000-run study and `plan` for 100 nodes with the whole search (splits x LLM
TP/PP/EP/DP x colocated, microbatch sizes, memory savers; target: under 2 s), pure Python, no torch: priced
by the FLOPs model, then the same by the operator model (the study's default `time_model: operators`: its
LLM and encoder module priced by their operators).

python3 benchmarks/predict.py
"""

from __future__ import annotations

import copy
import time
from dataclasses import replace
from pathlib import Path

import yaml

from mimo_jobs.predict.estimate import predict_run, to_json
from mimo_jobs.predict.hardware import get_gpu
from mimo_jobs.predict.layouts import best_layouts
from mimo_jobs.predict.planning import plan_many
from mimo_jobs.predict.run import shape_of
from mimo_jobs.predict.steptime import Efficiency, efficiency_for
from mimo_jobs.study.diagnose import diagnose_data

STUDY = Path(__file__).resolve().parents[1] / "studies" / "scale_33n_68n_100n.yaml"


def _big_study(n: int = 1000) -> dict:
    """The production study with `n` points: the three layouts repeated as distinct gbs multiples."""
    doc = yaml.safe_load(STUDY.read_text())
    base = doc["matrix"]["points"]
    doc["matrix"]["defaults"].pop("gbs")
    doc["matrix"]["points"] = [{**copy.deepcopy(base[i % 3]), "gbs": 768 * (1 + i // 3)} for i in range(n)]
    return doc


def main() -> None:
    gpu = get_gpu("H100")
    diag = diagnose_data(_big_study(), "bench", env={})
    assert diag.ok, diag.problems[:3]
    t0 = time.perf_counter()
    docs = [to_json(predict_run(r, gpu)) for r in diag.runs]
    t_predict = time.perf_counter() - t0
    run = diag.runs[0]
    t0 = time.perf_counter()
    best, priced = best_layouts(shape_of(run.layout, run.trainer), gpu, 100, Efficiency(), 5)
    t_plan = time.perf_counter() - t0
    print(f"predict: {len(docs)} runs in {t_predict:.2f} s ({t_predict / len(docs) * 1e3:.2f} ms/run)")
    print(
        f"plan --nodes 100: {priced} feasible layouts priced in {t_plan:.2f} s (target < 2 s), best "
        f"{best[0].prediction.time.iteration_s:.3f} s/iter"
    )
    t0 = time.perf_counter()
    many = plan_many(shape_of(run.layout, run.trainer), gpu, [32, 33, 68, 100], [], Efficiency(), 5, 0)
    t_many = time.perf_counter() - t0
    print(f"plan --nodes 32,33,68,100: {sum(p.priced for p in many.plans)} layouts in {t_many:.2f} s")
    operators(diag.runs, replace(gpu, time_model="operators"))


def operators(runs: list, gpu) -> None:
    """The same timings priced by the operator model (the GPU's own efficiencies: what chooses it)."""
    eff = efficiency_for(gpu)
    t0 = time.perf_counter()
    docs = [predict_run(r, gpu) for r in runs]
    t_predict = time.perf_counter() - t0
    models = sorted({p.time.model for p in docs})
    run = runs[0]
    t0 = time.perf_counter()
    best, priced = best_layouts(shape_of(run.layout, run.trainer), gpu, 100, eff, 5)
    t_plan = time.perf_counter() - t0
    print(f"operator model ({', '.join(models)}): predict {len(docs)} runs in {t_predict:.2f} s")
    print(
        f"operator model: plan --nodes 100: {priced} feasible layouts priced in {t_plan:.2f} s, best "
        f"{best[0].prediction.time.iteration_s:.3f} s/iter ({best[0].prediction.time.model})"
    )


if __name__ == "__main__":
    main()

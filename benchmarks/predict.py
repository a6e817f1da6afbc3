"""Time `predict` on a generated 1,000-run study and `plan` for 100 nodes with the whole search (splits x LLM
TP/PP/EP/DP x colocated, microbatch sizes, memory savers; target: under 2 s), pure Python, no torch: priced
by the FLOPs model, then the same by the operator model (the study's default `time_model: operators`: its
LLM and encoder module priced by their operators); and, in the same run, what plan's shortcuts save: the
plan with memory.py's memoised functions computed afresh (memory.unmemoised), the split search with every
split built and checked (candidate_layouts, prune=False), and a text-only MoE on the operator model
(Megatron-LM's layouts: PP, virtual stages, CP, EP).

python3 benchmarks/predict.py
"""

from __future__ import annotations

import copy
import time
from dataclasses import replace
from pathlib import Path

import yaml

from mimo_jobs.predict import memory
from mimo_jobs.predict.estimate import predict_run, to_json
from mimo_jobs.predict.hardware import get_gpu, study_gpu
from mimo_jobs.predict.layouts import best_layouts, candidate_layouts
from mimo_jobs.predict.planning import plan_many
from mimo_jobs.predict.run import shape_of, trainer_of
from mimo_jobs.predict.start import study_start
from mimo_jobs.predict.steptime import Efficiency, efficiency_for
from mimo_jobs.study.diagnose import diagnose_data

STUDIES = Path(__file__).resolve().parents[1] / "studies"
STUDY = STUDIES / "scale_33n_68n_100n.yaml"


def _big_study(n: int = 1000) -> dict:
    """The production study with `n` points: the three layouts repeated as distinct gbs multiples."""
    doc = yaml.safe_load(STUDY.read_text())
    base = doc["matrix"]["points"]
    doc["matrix"]["defaults"].pop("gbs")
    doc["matrix"]["points"] = [{**copy.deepcopy(base[i % 3]), "gbs": 768 * (1 + i // 3)} for i in range(n)]
    return doc


def _text_only_moe() -> dict:
    """Megatron-LM's GPT study with Qwen3-30B-A3B's LLM alone, priced by the operator model (cluster.hardware
    time_model: operators) on TE layers; gbs 2400 tiles 100 nodes."""
    doc = yaml.safe_load((STUDIES / "megatron_gpt_mock.yaml").read_text())
    doc["trainer"]["model"] = {"name": "qwen3-30b-a3b-text", "llm": "qwen3-30b-a3b"}
    doc["trainer"]["seq_length"] = 4096
    doc["cluster"]["hardware"] = {"gpu": "H100", "time_model": "operators", "layers": "te"}
    doc["matrix"] = {"defaults": {"colocated": True, "gbs": 2400}, "points": [{"nodes": 4, "llm": {"tp": 2}}]}
    return doc


def _timed(f):
    """(f(), wall seconds, CPU seconds of this process: what the search costs on a shared machine)."""
    t0, c0 = time.perf_counter(), time.process_time()
    out = f()
    return out, time.perf_counter() - t0, time.process_time() - c0


def _afresh(f):
    with memory.unmemoised():
        return f()


def main() -> None:
    gpu = get_gpu("H100")
    diag = diagnose_data(_big_study(), "bench", env={})
    assert diag.ok, diag.problems[:3]
    docs, t_predict, _ = _timed(lambda: [to_json(predict_run(r, gpu)) for r in diag.runs])
    run = diag.runs[0]
    shape = shape_of(run.layout, run.trainer)
    (best, priced), t_plan, c_plan = _timed(lambda: best_layouts(shape, gpu, 100, Efficiency(), 5))
    print(f"predict: {len(docs)} runs in {t_predict:.2f} s ({t_predict / len(docs) * 1e3:.2f} ms/run)")
    print(
        f"plan --nodes 100: {priced} feasible layouts priced in {t_plan:.2f} s (target < 2 s; {c_plan:.2f} s CPU), "
        f"best {best[0].prediction.time.iteration_s:.3f} s/iter"
    )
    many, t_many, _ = _timed(lambda: plan_many(shape, gpu, [32, 33, 68, 100], [], Efficiency(), 5, 0))
    print(f"plan --nodes 32,33,68,100: {sum(p.priced for p in many.plans)} layouts in {t_many:.2f} s")
    _, _, c_fresh = _timed(lambda: _afresh(lambda: best_layouts(shape, gpu, 100, Efficiency(), 5)))
    print(f"  plan --nodes 100 with memory.py's memoised functions computed afresh: {c_fresh:.2f} s CPU "
          f"({c_fresh / c_plan:.1f}x)")  # fmt: skip
    who = trainer_of(shape)
    pruned, _, c_pruned = _timed(lambda: candidate_layouts(shape.layout, 100, who))
    every, _, c_every = _timed(lambda: candidate_layouts(shape.layout, 100, who, prune=False))
    assert pruned == every
    print(f"  its split search: {len(pruned)} feasible layouts in {c_pruned:.2f} s CPU; every split built and "
          f"checked {c_every:.2f} s ({c_every / c_pruned:.1f}x)")  # fmt: skip
    operators(diag.runs, replace(gpu, time_model="operators"))
    diag = diagnose_data(_text_only_moe(), "text-only", env={})
    start, ops = study_start(diag.study, diag.points, diag.problems).shape, study_gpu(diag.study.cluster)
    (best, priced), t_ops, c_ops = _timed(lambda: best_layouts(start, ops, 100, efficiency_for(ops), 5))
    print(f"plan --nodes 100, text-only Qwen3-30B-A3B on the {best[0].prediction.time.model} model: {priced} "
          f"feasible layouts priced in {t_ops:.2f} s ({c_ops:.2f} s CPU), best "
          f"{best[0].prediction.time.iteration_s:.3f} s/iter")  # fmt: skip
    _, _, c_ops_fresh = _timed(lambda: _afresh(lambda: best_layouts(start, ops, 100, efficiency_for(ops), 5)))
    print(f"  the same with memory.py's memoised functions computed afresh: {c_ops_fresh:.2f} s CPU "
          f"({c_ops_fresh / c_ops:.1f}x)")  # fmt: skip


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

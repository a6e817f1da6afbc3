"""One pricing path: every model is priced module by module, a one-encoder study as a model of one module
(predict/memory.py, steptime.py). Pure logic, no trainer:

- a one-encoder study's `vision` module is priced exactly as the same module inside a vision + audio model
  on the same sizes (memory, one microbatch's seconds, FLOPs): a module's figures are its own;
- a one-encoder step is composed from its modules' microbatch times by the documented pipeline rule;
- the figures of the packaged one-encoder studies (and their stated-prior and recompute variants) are the
  ones the planner has always printed for them: iteration seconds, the worst rank class's bytes and plan's
  best layouts, to the last bit.
"""

from __future__ import annotations

import pytest
import yaml

from helpers import REPO
from mimo_jobs.predict import steptime
from mimo_jobs.predict.estimate import modules_json, predict_run
from mimo_jobs.predict.hardware import get_gpu
from mimo_jobs.predict.layouts import best_layouts, point_name
from mimo_jobs.predict.start import start_of
from mimo_jobs.predict.steptime import Efficiency
from mimo_jobs.study.expand import runs_of
from mimo_jobs.study.load import parse_study

H100 = get_gpu("H100")
EFF = Efficiency()  # the defaults: the figures below hold whatever efficiencies the GPUs are fitted with


def _study(encoders: dict, point: dict, gpn: int = 4) -> dict:
    return {
        "name": "one-path",
        "cluster": {"gpus_per_node": gpn},
        "trainer": {
            "model": {**encoders, "llm": "tiny"},
            "seq_length": 32,
            "train_iters": 10,
            "data": {"audio_fraction": 0.5, "audio_frames": [16, 24]},
        },
        "matrix": {"points": [{**point, "gbs": 32}]},
    }


def _priced(doc: dict):
    (run,) = runs_of(parse_study(doc, env={}))
    return predict_run(run, H100, EFF)


def _vision(p):
    return next(m for c in p.memory.classes for m in c.modules if m.module == "vision")


def test_a_one_encoder_study_is_its_vision_module_alone():
    # heterogeneous: vision 1x4 and an LLM DP 8 on 3 nodes of 4, against the same beside an audio 1x4
    one = _priced(_study({"encoder": "tiny"}, {"nodes": 3, "encoder": {"dp": 4}, "llm": {"dp": 8}}))
    two = _priced(
        _study(
            {"encoders": {"vision": "tiny", "audio": "tiny-audio"}},
            {"nodes": 4, "encoders": {"vision": {"dp": 4}, "audio": {"dp": 4}}, "llm": {"dp": 8}},
        )
    )
    a, b = _vision(one), _vision(two)
    assert a.ranks == b.ranks == (0, 3)
    assert (a.params, a.weight_bytes, a.grad_bytes, a.optimizer_bytes) == (
        b.params,
        b.weight_bytes,
        b.grad_bytes,
        b.optimizer_bytes,
    )
    assert (a.activation_bytes, a.bridge_bytes, a.inflight) == (
        b.activation_bytes,
        b.bridge_bytes,
        b.inflight,
    )
    assert one.time.modules["vision"] == two.time.modules["vision"]
    flops = [{m["module"]: m["flops_per_iteration"] for m in modules_json(p)} for p in (one, two)]
    assert list(flops[0]) == ["vision", "llm"] and flops[0]["vision"] == flops[1]["vision"]
    assert one.time.flops.encoder * 32 == flops[0]["vision"]
    # every figure is named by the study's module names
    assert {m.module for c in one.memory.classes for m in c.modules} == {"vision", "llm"}
    assert set(one.time.modules) == {"vision", "llm"} and one.time.bottleneck in ("vision", "llm")


def test_a_one_encoder_step_is_composed_from_its_modules():
    for point, colocated in (
        ({"nodes": 3, "encoder": {"dp": 4}, "llm": {"dp": 8}}, False),
        ({"nodes": 2, "colocated": True, "llm": {"dp": 8}}, True),
    ):
        p = _priced(_study({"encoder": "tiny"}, point))
        t, m = p.time, p.shape.microbatches
        v, llm = t.modules["vision"], t.modules["llm"]
        dp_latency = steptime._dp_s(p.shape, p.memory, p.gpu, EFF)[1]
        pipe = m * (v + llm) if colocated else m * max(v, llm) + min(v, llm)  # pp 1: no bubble
        assert t.iteration_s == pytest.approx(
            pipe + t.parts["dp"] + t.parts["optimizer"] + dp_latency, rel=1e-12
        )
        assert t.bottleneck == ("vision" if v > llm else "llm") and t.encoder_mb_s == v and t.llm_mb_s == llm
        assert t.idle_fraction == (0.0 if colocated else 1 - min(v, llm) / max(v, llm))


TILED = {"provider": "energon", "path": "/data/none", "max_tiles": 12, "thumbnail": True}
CASES = {
    "scale": ("scale_33n_68n_100n.yaml", {}, "H100"),
    "prior": ("scale_33n_68n_100n.yaml", {"data": TILED}, "H100"),
    "recompute": ("scale_33n_68n_100n.yaml", {"recompute": {"encoder": "full", "llm": "selective"}}, "H200"),
    "cpu": ("cpu_local.yaml", {}, "cpu"),
}
# (iteration seconds, the worst rank class's bytes) of each run; plan's three best layouts on 33 nodes, their
# seconds and the layouts priced: the planner's figures for these studies before every model went through
# one path, which must not move them
PRICED = {
    "scale 33n-e1x8-l2x8x128-g768": (3.663593034283513, 48984218348),
    "scale 68n-e1x32-l2x8x256-g768": (2.2173508896193685, 48268321768),
    "scale 100n-e1x32-l2x8x384-g768": (1.7714371407770027, 48029690092),
    "scale plan": (
        ["33n-e1x8-l4x1x8p8t4-g768", "33n-e2x4-l4x1x8p8t4-g768", "33n-e1x8-l2x2x16p8t2-g768"],
        [1.3342514738105762, 1.3379762024962902, 1.3426338118608963],
        501,
    ),
    "prior 33n-e1x8-l2x8x128-g768": (4.018836820347623, 135947694488),
    "prior 68n-e1x32-l2x8x256-g768": (2.3949727826514233, 70685768380),
    "prior 100n-e1x32-l2x8x384-g768": (2.0378699803250857, 103080737468),
    "prior plan": (
        ["33n-e1x8-l4x2x16p4t4-g768", "33n-e1x8-l8x2x16p2t8-g768", "33n-e1x8-l2x4x32p4t2-g768"],
        [3.1182108060178515, 3.1353649922728115, 3.134377728210204],
        501,
    ),
    "recompute 33n-e1x8-l2x8x128-g768": (3.6899146511763092, 48984218348),
    "recompute 68n-e1x32-l2x8x256-g768": (2.230131177113154, 48268321768),
    "recompute 100n-e1x32-l2x8x384-g768": (1.7910956851745103, 48029690092),
    "recompute plan": (
        ["33n-e1x8-l2x2x16p8t2-g768", "33n-e1x8-l2x4x16p8t2-g768", "33n-e1x8-l4x2x8p8t4-g768"],
        [1.3467915679010278, 1.3569287273372186, 1.41716151211079],
        501,
    ),
    "cpu 1n-e1x1-l1x1x3-g6": (0.006419776, 721016),
    "cpu 1n-e1x2-l1x1x2-g6": (0.008338756114285712, 710320),
    "cpu 1n-e2x1-l2x1x1-g6": (0.019374865714285715, 411824),
    "cpu 1n-colo-l2x1x2-g6": (0.016502786514285713, 625960),
}


def _doc(name: str, trainer: dict) -> dict:
    d = yaml.safe_load((REPO / "mimo_jobs/_studies" / name).read_text())
    d["trainer"].update(trainer)
    if d["cluster"].get("executor") != "local":
        d["cluster"]["partition"] = "batch"
        d["cluster"]["container"] = {"image": "/images/x.sqsh", "runtime": "pyxis"}
    return d


def test_the_packaged_one_encoder_studies_keep_their_figures():
    got = {}
    for tag, (name, trainer, gpu) in CASES.items():
        st = parse_study(_doc(name, trainer), env={})
        runs = runs_of(st)
        for run in runs:
            p = predict_run(run, get_gpu(gpu), EFF)
            assert [m.name for m in p.shape.modules] == ["vision"]
            got[f"{tag} {run.name}"] = (p.time.iteration_s, p.memory.worst.total_bytes)
        if gpu != "cpu":
            shape = start_of(st.trainer, st.cluster.gpus_per_node, runs[0].layout.gbs, runs[0].layout.mbs)
            top, n = best_layouts(shape, get_gpu(gpu), 33, EFF, top=3)
            got[f"{tag} plan"] = (
                [point_name(c.layout) for c in top],
                [c.prediction.time.iteration_s for c in top],
                n,
            )
    assert got == PRICED

"""`plan` across node counts and batches: the split as an axis, the colocated baseline or why none tiles,
flags across node counts, headroom, ranking, structured JSON; and `validate`'s predicted-OOM verdict."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import yaml
from typer.testing import CliRunner

from helpers import REPO
from mimo_jobs.cli.app import app
from mimo_jobs.predict.hardware import GIB, get_gpu
from mimo_jobs.predict.layouts import TIE, Candidate, free_bytes, price_layouts, ranked, split_label
from mimo_jobs.predict.run import shape_of
from mimo_jobs.predict.steptime import Efficiency
from mimo_jobs.study.diagnose import diagnose
from mimo_jobs.study.topology import check

PROD = REPO / "studies/scale_33n_68n_100n.yaml"
runner = CliRunner()


def _plan(*args: str) -> dict:
    r = runner.invoke(app, ["plan", "--from", str(PROD), "--json", *args])
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


@pytest.mark.slow  # multi-process or real jobs: CI runs it, the fast local default does not
def test_plan_several_node_counts_best_split_colocated_and_flags():
    doc = _plan("--nodes", "32,33,68,100")
    plans = {p["nodes"]: p for p in doc["plans"]}
    assert sorted(plans) == [32, 33, 68, 100] and all(p["gbs"] == 768 for p in plans.values())
    for n, p in plans.items():
        best = p["best_heterogeneous"]
        assert p["best"]["iteration_s"] <= best["iteration_s"]
        assert best["point"]["nodes"] == n and not best["colocated"]
        assert best["split"].startswith("vision ") and "| LLM " in best["split"]
        assert best["fits"] is True and best["free_bytes"] == doc["capacity_bytes"] - max(
            c["bytes"] for c in best["rank_classes"]
        )
        assert p["best"]["relative_to_best"] == 0 and all(
            x["relative_to_best"] >= -TIE for x in p["layouts"]
        )  # ties go to headroom
        assert set(best["parts_s"]) >= {"compute", "tp", "dp", "bridge"}
    # 256 GPUs tile gbs 768 colocated; 264, 544 and 800 do not, and the nearest batches that would are named
    assert plans[32]["best_colocated"]["colocated"] and plans[32]["colocated_note"] is None
    for n in (33, 68, 100):
        assert (
            plans[n]["best_colocated"] is None
            and "no colocated layout tiles gbs 768" in plans[n]["colocated_note"]
        )
        near = plans[n]["nearest_colocated_gbs"]
        assert near and all(g != 768 for g in near)
        again = _plan("--nodes", str(n), "--gbs", str(near[-1]))["plans"][0]
        assert again["best_colocated"] is not None  # the nearest batch really tiles a colocated layout
    kinds = {(f["kind"], f["nodes"]) for f in doc["flags"]}
    assert {("no-colocated", 33), ("no-colocated", 68), ("no-colocated", 100)} <= kinds
    # a larger allocation predicted slower than a smaller one is flagged, and only then
    times = {s["nodes"]: s["best_s"] for s in doc["summary"]}
    slower = {n for n in times if any(m < n and times[m] < times[n] for m in times)}
    assert slower == {n for k, n in kinds if k == "larger-slower"}


def test_plan_text_states_table_and_flags():
    r = runner.invoke(app, ["plan", "--nodes", "32-33", "--nodes", "68", "--from", str(PROD)])
    assert r.exit_code == 0, r.output
    assert "# summary:" in r.output and "# no-colocated: " in r.output
    assert all(f"# {n} node(s), gbs 768" in r.output for n in (32, 33, 68))  # a range and a repeat both count


def test_plan_gbs_list_and_headroom():
    doc = _plan("--nodes", "32", "--gbs", "384,768", "--headroom", "60")
    assert [p["gbs"] for p in doc["plans"]] == [384, 768] and doc["headroom_bytes"] == 60 * GIB
    for p in doc["plans"]:
        assert all(x["point"]["gbs"] == p["gbs"] and x["free_bytes"] >= 60 * GIB for x in p["layouts"])
    none = _plan("--nodes", "32", "--headroom", "4000")
    assert none["plans"][0]["best"] is None and none["flags"][0]["kind"] == "nothing-fits"
    r = runner.invoke(app, ["plan", "--nodes", "32", "--headroom", "4000", "--from", str(PROD)])
    assert r.exit_code == 2 and "no layout fits" in r.output


def test_a_batch_no_layout_tiles_is_not_called_over_memory():
    # gbs 1 on 264 GPUs: no layout divides it, so nothing was priced and memory was never the question
    r = runner.invoke(app, ["plan", "--nodes", "33", "--gbs", "1", "--from", str(PROD)])
    assert r.exit_code == 2, r.output
    assert "no layout fits" not in r.output and "nothing-fits" not in r.output
    assert (
        "flag nothing-tiles: 33 nodes: no layout tiles gbs 1 on 264 GPUs; a colocated layout tiles gbs"
        in r.output
    )
    near = r.output.split("a colocated layout tiles gbs ")[1].split("\n")[0].split(" or ")
    for g in near:  # each batch it names is one a layout tiles: priced, not flagged again
        tiled = runner.invoke(app, ["plan", "--nodes", "33", "--gbs", g, "--from", str(PROD), "--json"])
        assert '"nothing-tiles"' not in tiled.output and '"best": null' not in tiled.output, tiled.output[
            :500
        ]


def test_plan_bad_counts_are_refused():
    for bad in ("x", "5-3", "0", "1-5000", "3,,"):
        r = runner.invoke(app, ["plan", "--nodes", bad, "--from", str(PROD)])
        assert r.exit_code == 2 and "--nodes" in r.output, (bad, r.output)
    r = runner.invoke(app, ["plan", "--nodes", "32", "--gbs", "0", "--from", str(PROD)])
    assert r.exit_code == 2 and "--gbs" in r.output
    r = runner.invoke(app, ["plan", "--nodes", "32", "--headroom", "-1", "--from", str(PROD)])
    assert r.exit_code == 2 and "--headroom" in r.output


def test_ranking_breaks_near_ties_by_headroom():
    run = diagnose(PROD, env={}).runs[0]
    fit, _ = price_layouts(shape_of(run.layout, run.trainer), get_gpu("H100"), 32, Efficiency())
    a = fit[0]
    b = next(c for c in fit if free_bytes(c.prediction) != free_bytes(a.prediction))
    t = a.prediction.time.iteration_s

    def at(c: Candidate, s: float) -> Candidate:
        return Candidate(c.layout, replace(c.prediction, time=replace(c.prediction.time, iteration_s=s)))

    roomy, tight = (a, b) if free_bytes(a.prediction) > free_bytes(b.prediction) else (b, a)
    assert ranked([at(tight, t), at(roomy, t * (1 + TIE / 2))])[0].layout == roomy.layout  # a tie: more room
    assert ranked([at(tight, t), at(roomy, t * (1 + 3 * TIE))])[0].layout == tight.layout  # not a tie: faster


def test_every_candidate_is_feasible_and_the_split_adds_up():
    for study, nodes, gpu in ((PROD, 33, "H100"), (REPO / "studies/cpu_local.yaml", 1, "cpu")):
        run = diagnose(study, env={}).runs[0]
        fit, over = price_layouts(shape_of(run.layout, run.trainer), get_gpu(gpu), nodes, Efficiency())
        assert fit and not any(check(c.layout) for c in fit + over)
    # GPUs inside a node where the topology allows: 1 encoder process feeding 3 LLM lanes
    assert any(split_label(c.layout) == "vision 1 GPU | LLM 3 GPUs" for c in fit)
    assert (
        split_label(replace(run.layout, nodes=4, encoders=(replace(run.layout.single, tp=4, dp=1),)))
        == "vision 1 node (4 GPUs) | LLM 3 nodes"
    )


def _over_memory_study(tmp_path, memory_gib: float):
    doc = yaml.safe_load(PROD.read_text())
    doc["cluster"]["hardware"] = {"gpu": "H100", "memory_gib": memory_gib}
    doc["trainer"]["model"] = "moe-8x1b"  # the figures below are this model's, whatever the study ships
    p = tmp_path / "oom.yaml"
    p.write_text(yaml.safe_dump(doc, sort_keys=False))
    return p, doc


def test_validate_refuses_a_predicted_oom_with_the_cheapest_fix(tmp_path):
    study, doc = _over_memory_study(tmp_path, 17)  # the 33-node run's encoder ranks need ~19 GiB
    r = runner.invoke(app, ["validate", str(study)], env={"COLUMNS": "250"})
    assert r.exit_code == 2, r.output
    assert "[memory] predicted out of memory on H100: ranks 0-7 (vision) over by" in r.output
    assert "cheapest change that fits: trainer.encoder_inflight: 1" in " ".join(r.output.split())
    j = runner.invoke(app, ["validate", str(study), "--json"])
    assert j.exit_code == 2 and json.loads(j.output)["ok"] is False
    ok = runner.invoke(app, ["validate", str(study), "--allow-oom"], env={"COLUMNS": "250"})
    assert ok.exit_code == 0 and "allowed by --allow-oom" in ok.output
    # the change it names does fit
    doc["trainer"]["encoder_inflight"] = 1
    study.write_text(yaml.safe_dump(doc, sort_keys=False))
    fixed = runner.invoke(app, ["validate", str(study)], env={"COLUMNS": "250"})
    assert fixed.exit_code == 0, fixed.output

"""What a team bets GPU-hours on, before running: the cost of a study's length and of a token budget (one rule
with `report --tokens`), `plan --rank-by cost`, every Megatron-LM layout of a text-only model priced (PP with
and without virtual stages, CP) where the packaged trainer is not the one to run it, `plan` from a study whose
points do not validate or from a model alone, and a ranking whose order is explained in its rows."""

from __future__ import annotations

import json
import math

import pytest
import yaml
from typer.testing import CliRunner

from helpers import REPO
from mimo_jobs.cli.app import app
from mimo_jobs.predict.cost import cost_of, iterations_of, to_budget
from mimo_jobs.study import topology

runner = CliRunner()
PROD = REPO / "studies/scale_33n_68n_100n.yaml"


def _json(*args: str) -> dict:
    r = runner.invoke(app, list(args))
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def _gpt_study(tmp_path, points: list[dict], command: bool = True, **trainer) -> str:
    doc = {
        "name": "gpt",
        "cluster": {
            "executor": "local",
            "gpus_per_node": 8,
            "accelerator": "gpu",
            "hardware": {"gpu": "H100"},
        },
        "trainer": {
            "model": {"llm": {"preset": "qwen2.5-7b"}},
            "seq_length": 4096,
            "precision": "bf16",
            "use_distributed_optimizer": True,
            **({"command": "python pretrain_gpt.py"} if command else {}),
            **({"train_iters": 1000} if "train_samples" not in trainer else {}),
            **trainer,
        },
        "matrix": {"points": points},
    }
    f = tmp_path / "gpt.yaml"
    f.write_text(yaml.safe_dump(doc))
    return str(f)


# ------------------------------------------------------------------------------------------------ cost


def test_the_cost_rule():
    c = cost_of(7200, gpus=16, nodes=2)
    assert (c.hours, c.gpu_hours, c.node_hours) == (2.0, 32.0, 4.0)
    b = to_budget(1e9, carried_tokens_per_s=1e5, gpus=8, nodes=1)
    assert b.hours == pytest.approx(1e4 / 3600) and b.gpu_hours == pytest.approx(8e4 / 3600)
    assert to_budget(1e9, 0.0, 8, 1) is None
    assert iterations_of(100, None, 64) == 100
    assert iterations_of(None, 1000, 64) == 16  # the last, partial global batch runs whole


def test_predict_costs_the_study_and_a_token_budget():
    doc = _json("predict", str(PROD), "--json", "--tokens", "1T")
    for run in doc["runs"]:
        c = run["cost"]
        world = run["nodes"] * 8
        assert c["run"]["gpu_hours"] == pytest.approx(c["iterations"] * run["iteration_s"] * world / 3600)
        assert c["run"]["node_hours"] == pytest.approx(c["run"]["gpu_hours"] / 8)
        # no dataset statistics: a row carries its whole seq_length, the padded figure
        assert c["carried_tokens"] == "assumed full rows"
        assert c["carried_tokens_per_s"] == pytest.approx(run["tokens_per_s_per_gpu"] * world)
        assert c["to_tokens"]["hours"] == pytest.approx(1e12 / c["carried_tokens_per_s"] / 3600)
        assert c["to_tokens"]["gpu_hours"] == pytest.approx(c["to_tokens"]["hours"] * world)


def test_train_samples_cost_whole_global_batches(tmp_path):
    f = _gpt_study(
        tmp_path, [{"nodes": 1, "colocated": True, "llm": {"tp": 4}, "gbs": 64}], train_samples=1000
    )
    (run,) = _json("predict", f, "--json")["runs"]
    assert run["cost"]["iterations"] == math.ceil(1000 / 64)


def test_plan_ranks_node_counts_by_cost_with_the_budget():
    args = ["plan", "--from", str(PROD), "--nodes", "16,64", "--top", "1", "--tokens", "1T"]
    by_time = _json(*args, "--json")
    by_cost = _json(*args, "--json", "--rank-by", "cost")
    assert [s["nodes"] for s in by_time["summary"]] == [16, 64]  # as asked
    costs = [s["best_gpu_hours"] for s in by_cost["summary"]]
    assert costs == sorted(costs) and by_cost["rank_by"] == "cost" and by_cost["tokens"] == 1e12
    best = by_cost["plans"][0]["best"]
    assert best["cost"]["to_tokens"]["gpu_hours"] == pytest.approx(
        1e12 / best["cost"]["carried_tokens_per_s"] / 3600 * 16 * 8
    )
    text = runner.invoke(app, [*args, "--rank-by", "cost"]).output
    assert "# summary (cheapest first)" in text and "GPU-h to 1T" in text
    for bad, why in (
        (["--rank-by", "price"], "--rank-by must be time or cost"),
        (["--tokens", "lots"], "--tokens"),
    ):
        r = runner.invoke(app, [*args, *bad])
        assert r.exit_code == 2 and why in r.output, r.output


# --------------------------------------------------------------------------- every Megatron-LM layout


def _lay(**kw) -> topology.Layout:
    base = dict(nodes=4, gpus_per_node=8, llm_tp=4, llm_layers=28, gbs=256, colocated=True)
    base.update(kw)
    per = base["llm_tp"] * base.get("llm_pp", 1) * base.get("llm_cp", 1)
    base.setdefault("encoders", (topology.ModuleShape("vision", 4, 1, 32 // per),))
    base.setdefault("llm_dp", 32 // per)
    base.setdefault("llm_pp", 1)
    return topology.Layout(**base)


def test_a_text_only_model_pipelines_where_its_own_command_runs_it():
    piped = _lay(llm_pp=2)
    rules = {v.rule: v.message for v in topology.check(piped)}  # an encoder feeding itself: no later stage
    assert "no later pipeline stage to feed" in rules["colocated"]
    packaged = {v.rule: v.message for v in topology.check(piped, topology.Trainer(text_only=True))}
    assert set(packaged) == {"text-only-pp"} and "trainer.command" in packaged["text-only-pp"]
    assert topology.check(piped, topology.Trainer(text_only=True, packaged=False)) == []


def test_cp_and_virtual_stages_are_the_own_commands_and_need_their_shapes():
    own = topology.Trainer(text_only=True, packaged=False)
    assert topology.check(_lay(llm_cp=2), own) == []
    assert [v.rule for v in topology.check(_lay(llm_cp=2))] == ["cp"]
    assert topology.check(_lay(llm_pp=2, llm_vp=2), own) == []
    assert [v.rule for v in topology.check(_lay(llm_vp=2), own)] == ["vp"]  # no pipeline to interleave
    bad = topology.check(_lay(llm_pp=2, llm_vp=4), own)  # 28 layers do not make 8 equal virtual stages
    assert [v.rule for v in bad] == ["vp"] and "28 layers" in bad[0].message
    assert "vp" in {v.rule for v in topology.check(_lay(llm_pp=2, llm_vp=2), topology.Trainer(True, True))}


def test_predict_prices_cp_and_interleaving_and_cp_splits_the_activations(tmp_path):
    points = [
        {"nodes": 4, "colocated": True, "llm": {"tp": 4, "pp": 2}, "gbs": 256},
        {"nodes": 4, "colocated": True, "llm": {"tp": 4, "pp": 2, "vp": 2}, "gbs": 256},
        {"nodes": 4, "colocated": True, "llm": {"tp": 2}, "gbs": 256},
        {"nodes": 4, "colocated": True, "llm": {"tp": 2, "cp": 2}, "gbs": 256},
    ]
    runs = _json("predict", _gpt_study(tmp_path, points), "--json")["runs"]
    names = [r["name"] for r in runs]
    assert names == [
        "4n-colo-l4x1x4p2-g256",
        "4n-colo-l4x1x4p2v2-g256",
        "4n-colo-l2x1x16-g256",
        "4n-colo-l2x1x8c2-g256",
    ]
    pp, vp, tp2, cp2 = runs
    assert vp["iteration_s"] < pp["iteration_s"]  # the interleaved schedule's bubble is (pp - 1) / vp
    act = {r["name"]: max(x["activation_bytes"] for x in r["ranks"]) for r in runs}
    # the same microbatch per rank, half of each sequence: about half the activations
    assert act[cp2["name"]] == pytest.approx(act[tp2["name"]] / 2, rel=0.05)
    # the packaged trainer refuses them, naming why
    r = runner.invoke(app, ["validate", _gpt_study(tmp_path, points, command=False)])
    assert r.exit_code == 2 and "[text-only-pp]" in r.output and "[cp]" in r.output and "[vp]" in r.output


def test_plan_searches_pipelines_interleaving_and_cp_for_a_text_only_command(tmp_path):
    f = _gpt_study(tmp_path, [{"nodes": 4, "colocated": True, "llm": {"tp": 4}, "gbs": 256}])
    doc = _json("plan", "--from", f, "--nodes", "4", "--top", "50", "--json")
    seen = {(c["point"]["llm"].get("pp", 1) > 1, "vp" in c["point"]["llm"], "cp" in c["point"]["llm"])
            for c in doc["plans"][0]["layouts"]}  # fmt: skip
    assert {(True, False, False), (True, True, False)} <= {(p, v, False) for p, v, _ in seen}
    assert any(cp for _, _, cp in seen)
    # the packaged trainer's study: none of them
    g = _gpt_study(tmp_path, [{"nodes": 4, "colocated": True, "llm": {"tp": 4}, "gbs": 256}], command=False)
    packaged = _json("plan", "--from", g, "--nodes", "4", "--top", "50", "--json")["plans"][0]["layouts"]
    assert all(set(c["point"]["llm"]) <= {"tp", "dp"} for c in packaged)


# ---------------------------------------------------------------------------------- where a plan starts


def test_plan_from_a_study_whose_points_do_not_validate(tmp_path):
    f = _gpt_study(tmp_path, [{"nodes": 2, "colocated": True, "llm": {"tp": 3}, "gbs": 64}])
    r = runner.invoke(app, ["plan", "--from", f, "--nodes", "2", "--top", "1"])
    assert r.exit_code == 0, r.output
    assert r.output.startswith("# note: matrix.points[0] does not validate ([tiling]")
    doc = _json("plan", "--from", f, "--nodes", "2", "--json")
    assert doc["notes"] and doc["plans"][0]["best"] is not None
    assert validate_exit(f) == 2  # validate still refuses the point


def validate_exit(f: str) -> int:
    return runner.invoke(app, ["validate", f]).exit_code


def test_plan_from_a_model_alone():
    doc = _json("plan", "--model", "qwen2.5-7b", "--gbs", "512", "--nodes", "16", "--tokens", "1T", "--json")
    best = doc["plans"][0]["best"]
    assert best["colocated"] and best["cost"]["to_tokens"]["gpu_hours"] > 0
    assert best["cost"]["iterations"] == 0  # a model alone has no length: the budget is the cost
    for args, why in (
        (["--model", "nope", "--gbs", "8"], "is no model this knows"),
        (["--model", "tiny"], "--model needs --gbs"),
        (["--model", "tiny", "--gbs", "8", "--from", str(PROD)], "not both"),
        ([], "not both and not neither"),
    ):
        r = runner.invoke(app, ["plan", "--nodes", "1", *args])
        assert r.exit_code == 2 and why in r.output, (args, r.output)


# ------------------------------------------------------------------------------- a ranking that reads


def test_no_row_is_best_above_a_faster_row_without_saying_why():
    text = runner.invoke(
        app, ["plan", "--from", str(PROD), "--nodes", "33", "--gpu", "H100", "--top", "5"]
    ).output
    rows = [ln for ln in text.splitlines() if ln.startswith("  - {")]
    secs = [float(ln.split("; ")[1].split(" s/iter")[0]) for ln in rows]
    best = next(i for i, ln in enumerate(rows) if "(best" in ln)
    if min(secs) < secs[best]:
        assert "(best: within 0.5% of the fastest" in rows[best]
    for s, ln in zip(secs, rows):
        if s < secs[best]:
            assert "a tie within 0.5% with the best" in ln, ln


def test_validate_names_the_cost_of_each_run_that_fits():
    out = runner.invoke(app, ["validate", str(PROD)], env={"COLUMNS": "250"}).output
    doc = _json("predict", str(PROD), "--json")
    for run in doc["runs"]:
        line = next(ln for ln in out.splitlines() if ln.startswith(f"run {run['run_id']} "))
        gpu_h = run["cost"]["run"]["gpu_hours"]
        assert f"; {gpu_h:,.0f} GPU-h for {run['cost']['iterations']:,} iterations" in line, line
        # no dataset statistics: the memory verdict rests on the image prior, and says so
        assert line.endswith("; image tokens assumed (no dataset statistics)"), line
    mock = runner.invoke(
        app, ["validate", str(REPO / "studies/cpu_local.yaml")], env={"COLUMNS": "250"}
    ).output
    assert "memory on cpu: fits" in mock and "image tokens assumed" not in mock  # the mock images are exact

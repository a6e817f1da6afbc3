"""Study files: parsing errors with YAML paths, ${ENV} interpolation, expansion, stable run ids, and the
`validate` command (table, --json, every problem at once, exit code)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from helpers import REPO
from mimo_jobs.cli.app import app
from mimo_jobs.study.diagnose import diagnose, diagnose_data
from mimo_jobs.study.expand import expand, run_name, runs_of
from mimo_jobs.study.load import load_study, parse_study
from mimo_jobs.study.spec import StudyError

STUDIES = REPO / "studies"
PROD = STUDIES / "scale_33n_68n_100n.yaml"


def minimal(**over) -> dict:
    doc = {
        "name": "t",
        "cluster": {"gpus_per_node": 4, "accelerator": "cpu", "executor": "local"},
        "trainer": {"model": "tiny", "train_iters": 5},
        "matrix": {"points": [{"nodes": 1, "encoder": {"dp": 1}, "llm": {"dp": 3}, "gbs": 6}]},
    }
    for k, v in over.items():
        doc[k] = v
    return doc


def problems_of(doc: dict, env: dict | None = None) -> list[tuple[str, str]]:
    with pytest.raises(StudyError) as e:
        runs_of(parse_study(doc, "s.yaml", env or {}), "s.yaml")
    return e.value.problems


# ---------------------------------------------------------------- the shipped studies


def test_production_study_has_the_documented_layouts():
    s = load_study(PROD, env={})
    runs = runs_of(s)
    assert [r.layout.nodes for r in runs] == [33, 68, 100]
    assert [(r.point.encoder.tp, r.point.encoder.dp) for r in runs] == [(1, 8), (1, 32), (1, 32)]
    assert [(r.point.llm.tp, r.point.llm.ep, r.point.llm.dp) for r in runs] == [
        (2, 8, 128),
        (2, 8, 256),
        (2, 8, 384),
    ]
    assert [(r.rank_layout().lanes_per_encoder, r.rank_layout().num_microbatches) for r in runs] == [
        (16, 6),
        (8, 3),
        (12, 2),
    ]
    assert [len(r.rank_layout().encoder_nodes) for r in runs] == [1, 4, 4]
    assert {r.name for r in runs} == {
        "33n-e1x8-l2x8x128-g768",
        "68n-e1x32-l2x8x256-g768",
        "100n-e1x32-l2x8x384-g768",
    }
    c, t = s.cluster, s.trainer
    assert (c.gpus_per_node, c.time_limit, c.accelerator, c.container is not None) == (
        8,
        "04:00:00",
        "gpu",
        True,
    )
    assert (t.model["encoder"]["name"], t.model["llm"]["name"]) == ("siglip-so400m-14-384", "qwen3-30b-a3b")
    assert (t.log_interval, t.save_interval, t.train_iters) == (100, 1000, None)
    assert (t.lr.schedule, t.lr.wsd_decay_style) == ("wsd", "minus_sqrt")
    assert t.train_samples == 122070313 and t.lr.warmup_samples + t.lr.decay_samples == t.train_samples
    assert all(r.point.gbs == 768 and r.point.mbs == 1 for r in runs)


def test_cpu_local_study_fits_one_node_of_four_processes():
    s = load_study(STUDIES / "cpu_local.yaml", env={})
    runs = runs_of(s)
    assert s.cluster.executor == "local" and s.cluster.accelerator == "cpu" and s.trainer.model == "tiny"
    assert 3 <= len(runs) <= 4
    assert all(r.layout.nodes == 1 and r.layout.world == 4 for r in runs)
    assert "out" in {r.rank_layout().fan for r in runs}  # at least one bridge fan-out point
    # the colocated baseline, at the same size and global batch as the heterogeneous layouts
    (colo,) = [r for r in runs if r.layout.colocated]
    assert colo.rank_layout().fan == "colocated" and colo.layout.gbs == runs[0].layout.gbs


def test_colocated_points_are_planned_refused_and_named():
    doc = minimal()
    doc["cluster"]["gpus_per_node"] = 4
    doc["matrix"]["points"] = [{"nodes": 2, "colocated": True, "llm": {"tp": 2}, "gbs": 8}]
    (run,) = runs_of(parse_study(doc, env={}))
    plan = run.rank_layout()
    assert run.name == "2n-colo-l2x1x4-g8"
    assert (plan.enc_rank_start, plan.enc_rank_end, plan.llm_rank_start, plan.llm_rank_end) == (0, 8, 0, 8)
    assert (run.layout.single.tp, run.layout.single.dp, plan.num_microbatches) == (2, 4, 2)
    # encoder sizes make no sense on a colocated point
    doc["matrix"]["points"] = [{"nodes": 2, "colocated": True, "encoder": {"dp": 2}, "gbs": 8}]
    with pytest.raises(StudyError, match="a colocated point runs the encoder on every rank"):
        runs_of(parse_study(doc, env={}))
    # a layout that cannot be colocated: the LLM grid must cover all 8 GPUs
    doc["matrix"]["points"] = [{"nodes": 2, "colocated": True, "llm": {"tp": 2, "dp": 2}, "gbs": 8}]
    with pytest.raises(StudyError, match=r"\[tiling\] colocated: .* must be all 2x4=8 GPUs; llm.dp=4 fits"):
        runs_of(parse_study(doc, env={}))


def test_the_production_study_has_no_feasible_colocated_baseline_at_gbs_768():
    """A colocated layout must use every GPU for the LLM grid: 264, 544 and 800 GPUs with TP2 give DP 132,
    272 and 400, none of which divides GBS 768 (their factors 11, 17 and 5 are not in 768 = 2^8 x 3), and
    no TP inside a node removes them. validate says so, with the global batch that would fit."""
    s = load_study(STUDIES / "scale_33n_68n_100n.yaml", env={})
    for nodes, dp in ((33, 132), (68, 272), (100, 400)):
        doc = s.model_dump(mode="json")
        doc["matrix"] = {
            "points": [{"nodes": nodes, "colocated": True, "llm": {"tp": 2, "ep": 8}, "gbs": 768}]
        }
        with pytest.raises(StudyError, match=rf"\[gbs\] gbs=768 is not divisible by mbs\*llm.dp=1\*{dp}"):
            runs_of(parse_study(doc, env={}))


def test_slurm_ci_study_has_2_3_4_node_points():
    s = load_study(STUDIES / "slurm_ci.yaml", env={})
    runs = runs_of(s)
    assert sorted(r.layout.nodes for r in runs) == [2, 3, 4]
    assert s.cluster.executor == "slurm" and s.cluster.gpus_per_node == 2 and s.cluster.accelerator == "cpu"


# ---------------------------------------------------------------- errors with YAML paths


def test_unknown_keys_are_reported_with_their_paths():
    doc = minimal()
    doc["cluster"]["gpus_per_nod"] = 8
    doc["trainer"]["lr"] = {"schedul": "wsd"}
    doc["matrix"]["points"] = [{"nodes": 1, "llm": {"dp": 3}, "gbs": 6}] * 2 + [
        {"nodes": 1, "llm": {"dp": 3, "tpp": 2}, "gbs": 6}
    ]
    diag = diagnose_data(doc, "s.yaml", env={})
    paths = {(p.path, p.message) for p in diag.problems}
    assert ("cluster.gpus_per_nod", "unknown key") in paths
    assert ("trainer.lr.schedul", "unknown key") in paths
    assert ("matrix.points[2].llm.tpp", "unknown key") in paths


def test_point_type_errors_have_paths():
    doc = minimal(matrix={"points": [{"nodes": "two", "gbs": 6}, {"nodes": 1, "gbs": 0}]})
    probs = dict(problems_of(doc))
    assert "matrix.points[0].nodes" in probs and "integer" in probs["matrix.points[0].nodes"]
    assert "matrix.points[1].gbs" in probs and "greater than or equal to 1" in probs["matrix.points[1].gbs"]


def test_yaml_syntax_error_names_the_line(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text("name: x\ncluster: {gpus_per_node: 4\ntrainer: {}\n")
    diag = diagnose(f)
    assert not diag.ok and diag.problems[0].rule == "yaml"
    assert diag.problems[0].path.startswith("line ")
    with pytest.raises(StudyError) as e:
        load_study(f)
    assert "invalid YAML" in str(e.value)


def test_missing_file():
    diag = diagnose("/nonexistent/study.yaml")
    assert diag.problems[0].path == "<file>" and "cannot read" in diag.problems[0].message


def test_exactly_one_of_train_iters_and_samples():
    doc = minimal()
    doc["trainer"] = {"model": "tiny", "train_iters": 5, "train_samples": 10}
    probs = [p for p in diagnose_data(doc, env={}).problems]
    assert any(p.path == "trainer" and "exactly one" in p.message for p in probs)


def test_wsd_needs_decay_samples_and_unknown_preset():
    doc = minimal()
    doc["trainer"] = {"model": "huge", "train_iters": 5, "lr": {"schedule": "wsd"}}
    probs = {p.path: p.message for p in diagnose_data(doc, env={}).problems}
    assert "wsd_decay_samples" in probs["trainer.lr"]
    assert "unknown model preset 'huge'" in probs["trainer.model"] and "tiny" in probs["trainer.model"]


def test_shell_facing_values_are_restricted():
    doc = minimal()
    doc["name"] = "x;rm -rf"
    doc["cluster"].update(
        {
            "partition": "a b",
            "env": {"BAD-KEY": "1"},
            "sbatch_args": ["--x=$(id)"],
            "srun_args": ["--cpu-bind=none; id"],
            "python": "python3 -c x",
            "container": {"image": "img;id", "mounts": ["/a b:/c", "/a:/b,/c:/d"], "workdir": "rel/dir"},
        }
    )
    paths = {p.path for p in diagnose_data(doc, env={}).problems}
    assert {
        "name",
        "cluster.partition",
        "cluster.env",
        "cluster.sbatch_args",
        "cluster.srun_args",
        "cluster.python",
        "cluster.container.image",
        "cluster.container.mounts",
        "cluster.container.workdir",
    } <= paths


def test_env_values_numbers_become_strings_booleans_are_rejected():
    doc = minimal()
    doc["cluster"]["env"] = {"A": 1, "B": 2.5, "C": "x"}
    s = parse_study(doc, env={})
    assert s.cluster.env == {"A": "1", "B": "2.5", "C": "x"}
    doc["cluster"]["env"] = {"D": True}
    probs = diagnose_data(doc, env={}).problems
    assert probs[0].path == "cluster.env" and "quoted string" in probs[0].message


# ---------------------------------------------------------------- ${ENV}


def test_env_interpolation_and_defaults():
    doc = minimal()
    doc["cluster"]["partition"] = "${PART}"
    doc["cluster"]["env"] = {"X": "pre-${WHO:-nobody}-post"}
    s = parse_study(doc, env={"PART": "gpu"})
    assert s.cluster.slurm.partition == "gpu" and s.cluster.env["X"] == "pre-nobody-post"
    s = parse_study(doc, env={"PART": "gpu", "WHO": "me"})
    assert s.cluster.env["X"] == "pre-me-post"


def test_unset_env_is_an_error_at_its_path():
    doc = minimal()
    doc["cluster"]["partition"] = "${MIMO_TEST_UNSET_PART}"
    doc["matrix"]["points"][0]["gbs"] = "${MIMO_TEST_UNSET_GBS}"
    with pytest.raises(StudyError) as e:
        parse_study(doc, "s.yaml", env={})
    got = dict(e.value.problems)
    assert (
        "MIMO_TEST_UNSET_PART" in got["cluster.partition"]
        and "export MIMO_TEST_UNSET_PART=" in got["cluster.partition"]
    )
    assert "MIMO_TEST_UNSET_GBS" in got["matrix.points[0].gbs"]


def test_production_study_reads_site_settings_from_env():
    s = load_study(PROD, env={"MIMO_JOBS_PARTITION": "prod", "MIMO_JOBS_IMAGE": "/img/x.sqsh"})
    assert s.cluster.slurm.partition == "prod" and s.cluster.container.image == "/img/x.sqsh"


# ---------------------------------------------------------------- expansion and run ids


def test_product_axes_expand_over_defaults():
    doc = minimal(
        matrix={
            "defaults": {"nodes": 1, "gbs": 12, "encoder": {"dp": 1}},
            "product": {"llm.dp": [3], "mbs": [1, 2]},
        }
    )
    runs = runs_of(parse_study(doc, env={}))
    assert [(r.point.llm.dp, r.point.mbs) for r in runs] == [(3, 1), (3, 2)]
    assert [r.rank_layout().num_microbatches for r in runs] == [4, 2]  # 12/(1*3), 12/(2*3)


def test_derived_llm_dp_and_infeasible_points_are_labelled():
    doc = minimal(
        matrix={
            "defaults": {"nodes": 1, "gbs": 6},
            "points": [{"encoder": {"dp": 1}}, {"encoder": {"dp": 2}, "gbs": 5}],
        }
    )
    results = expand(parse_study(doc, env={}))
    assert results[0].run.point.llm.dp == 3  # 4 - 1
    assert results[1].run is None and results[1].label == "matrix.points[1]"
    assert {v.rule for v in results[1].violations} == {"gbs"}  # 5 % 2


def test_repeats_get_distinct_names_and_ids():
    doc = minimal()
    doc["matrix"]["points"][0]["repeats"] = 2
    runs = runs_of(parse_study(doc, env={}))
    assert [r.name for r in runs] == ["1n-e1x1-l1x1x3-g6-r0", "1n-e1x1-l1x1x3-g6-r1"]
    assert runs[0].run_id != runs[1].run_id


def test_duplicate_points_are_an_error():
    doc = minimal()
    doc["matrix"]["points"] = doc["matrix"]["points"] * 2
    probs = problems_of(doc)
    assert probs[0][0] == "matrix.points[1]" and "duplicate run" in probs[0][1]


def test_run_name_format():
    s = load_study(PROD, env={})
    assert run_name(runs_of(s)[0].point, 0, 1) == "33n-e1x8-l2x8x128-g768"


def test_run_ids_are_stable_across_processes_and_key_order(tmp_path):
    doc = minimal()
    ids = [r.run_id for r in runs_of(parse_study(doc, env={}))]
    # Same config in another interpreter (different hash seed) and with keys written in another order.
    reordered = {k: doc[k] for k in reversed(list(doc))}
    reordered["cluster"] = dict(reversed(list(doc["cluster"].items())))
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump(reordered, sort_keys=False))
    code = (
        "import sys; from mimo_jobs.study.load import load_study; from mimo_jobs.study.expand import runs_of; "
        "print(' '.join(r.run_id for r in runs_of(load_study(sys.argv[1], env={}))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(f)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONHASHSEED": "123"},
    ).stdout.split()
    assert out == ids
    assert all(re.fullmatch(r"[0-9a-f]{12}", i) for i in ids)


@pytest.mark.parametrize(
    "change",
    [
        lambda d: d["trainer"].update(seed=1),
        lambda d: d["cluster"].update(time_limit="00:30:00"),
        lambda d: d["matrix"]["points"][0].update(gbs=12),
        lambda d: d.update(name="t2"),
    ],
)
def test_run_id_changes_with_the_resolved_config(change):
    doc = minimal()
    before = runs_of(parse_study(doc, env={}))[0].run_id
    change(doc)
    assert runs_of(parse_study(doc, env={}))[0].run_id != before


def test_description_does_not_change_run_ids():
    doc = minimal()
    before = runs_of(parse_study(doc, env={}))[0].run_id
    doc["description"] = "free text"
    assert runs_of(parse_study(doc, env={}))[0].run_id == before


# ---------------------------------------------------------------- every problem at once


def test_diagnose_reports_schema_env_and_topology_together():
    doc = minimal()
    doc["cluster"]["bogus"] = 1
    doc["cluster"]["env"] = {"A": "${MIMO_TEST_NOPE}"}
    doc["matrix"]["points"] = [
        {"nodes": 1, "encoder": {"dp": 1}, "llm": {"dp": 2}, "gbs": 6},  # leaves 1 rank unused
        {"nodes": 1, "encoder": {"dp": 2}, "llm": {"dp": 2}, "gbs": 5},  # gbs 5 % 2
        {"nodes": 1, "llm": {"tpp": 1}, "gbs": 6},
    ]
    diag = diagnose_data(doc, "s.yaml", env={})
    got = {(p.path, p.rule) for p in diag.problems}
    assert {
        ("cluster.env.A", "env"),
        ("cluster.bogus", "schema"),
        ("matrix.points[0]", "tiling"),
        ("matrix.points[1]", "gbs"),
        ("matrix.points[2].llm.tpp", "schema"),
    } <= got
    tiling = [p for p in diag.problems if p.rule == "tiling"][0]
    assert "leaves 1 GPUs unused" in tiling.message and tiling.fit == "llm.dp=3 fits"


# ---------------------------------------------------------------- the validate command


runner = CliRunner()


def test_validate_prints_the_design_table():
    r = runner.invoke(app, ["validate", str(PROD)], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    rows = [line for line in r.output.splitlines() if "n-e1x" in line]
    assert len(rows) == 3
    # per row: nodes, encoder, LLM, lanes/encoder, microbatches (docs/topology.md worked example)
    for row, want in zip(
        rows,
        [
            ("33", "1 node", "32 nodes", "TP2 EP8 DP128", "16", "6"),
            ("68", "4 nodes", "64 nodes", "TP2 EP8 DP256", "8", "3"),
            ("100", "4 nodes", "96 nodes", "TP2 EP8 DP384", "12", "2"),
        ],
    ):
        cells = [c.strip() for c in row.split("│")[1:-1]]
        assert cells[2] == want[0]
        assert cells[3].startswith(want[1]) and cells[4].startswith(want[2]) and want[3] in cells[4]
        assert (cells[7], cells[8]) == (want[4], want[5])


def test_validate_json_gives_the_plan():
    r = runner.invoke(app, ["validate", str(PROD), "--json"])
    assert r.exit_code == 0
    doc = json.loads(r.output)
    assert doc["ok"] and doc["problems"] == []
    assert [
        (x["nodes"], x["plan"]["lanes_per_encoder"], x["plan"]["num_microbatches"]) for x in doc["runs"]
    ] == [(33, 16, 6), (68, 8, 3), (100, 12, 2)]
    assert doc["runs"][0]["plan"]["layout"]["llm_ep"] == 8 and doc["runs"][0]["plan"]["expert_dp"] == 32


def test_validate_reports_every_broken_rule_and_exits_nonzero(tmp_path):
    doc = yaml.safe_load(PROD.read_text())
    doc["matrix"]["points"][0]["llm"]["dp"] = 120  # tiling + gbs (768 % 120)
    doc["matrix"]["points"][1]["encoder"]["dp"] = 24  # bridge: 256 % 24, 24 % 256 (and tiling)
    doc["cluster"]["qos"] = "has space"
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(doc))
    r = runner.invoke(app, ["validate", str(f)], env={"COLUMNS": "300"})
    assert r.exit_code == 2
    out = r.output
    assert "cluster.qos" in out
    assert "matrix.points[0]: [tiling]" in out and "leaves 16 GPUs unused" in out and "llm.dp=128 fits" in out
    assert "matrix.points[0]: [gbs]" in out
    assert "matrix.points[1]: [bridge-ratio]" in out
    rj = runner.invoke(app, ["validate", str(f), "--json"])
    assert rj.exit_code == 2
    rules = {(p["path"], p["rule"]) for p in json.loads(rj.stdout)["problems"]}
    assert {
        ("matrix.points[0]", "tiling"),
        ("matrix.points[0]", "gbs"),
        ("matrix.points[1]", "bridge-ratio"),
        ("cluster.qos", "schema"),
    } <= rules


def test_validate_console_script_runs(tmp_path):
    exe = Path(sys.executable).parent / "mimo-jobs"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "mimo_jobs.cli"]
    r = subprocess.run(cmd + ["validate", str(STUDIES / "slurm_ci.yaml")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "3 run(s) feasible" in r.stdout


def test_validate_reports_incomplete_setup_lines(tmp_path):
    doc = minimal()
    doc["cluster"]["setup"] = ["module load x", "echo 'open"]
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump(doc))
    r = runner.invoke(app, ["validate", str(f)])
    assert r.exit_code == 2 and "cluster.setup[1]: [setup]" in r.output and "setup[0]" not in r.output

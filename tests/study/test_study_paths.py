"""The one path rule (study/paths.py): every path a study names starts at the study file's directory, is
recorded absolute in run.yaml and is checked by `validate` (there, and the right kind), all problems at once,
one line each; run ids name the paths relative to the study, so a study moved with its files keeps its ids."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import yaml
from test_study import minimal
from typer.testing import CliRunner

from mimo_jobs.cli.app import app
from mimo_jobs.study.expand import runs_of
from mimo_jobs.study.load import load_study
from mimo_jobs.study.render import render_study

runner = CliRunner()


def _study(d: Path, doc: dict) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    f = d / "s.yaml"
    f.write_text(yaml.safe_dump(doc))
    return f


def _validate_json(f: Path) -> tuple[int, dict]:
    r = runner.invoke(app, ["validate", str(f), "--json"])
    return r.exit_code, json.loads(r.output)


def _tokenizer(d: Path) -> Path:
    d.mkdir(parents=True)
    (d / "tokenizer.json").write_text("{}")
    return d


def test_data_paths_start_at_the_study_file_and_run_yaml_records_them_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # elsewhere than the study: the rule does not depend on where mimo-jobs runs
    study_dir = tmp_path / "proj" / "studies"
    _tokenizer(study_dir / "tok")
    (study_dir / "data").mkdir()
    doc = minimal()
    doc["trainer"]["data"] = {"path": "data", "tokenizer": "tok"}
    f = _study(study_dir, doc)
    (r,) = render_study(load_study(f, env={}), tmp_path / "runs", source=str(f))
    data = yaml.safe_load(r.run_yaml.read_text())["run"]["trainer"]["data"]
    assert (data["path"], data["tokenizer"]) == (str(study_dir / "data"), str(study_dir / "tok"))


def test_validate_names_every_missing_path_and_wrong_kind_at_once(tmp_path):
    d = tmp_path / "s"
    (d / "tok.json").parent.mkdir(parents=True)
    (d / "tok.json").write_text("{}")
    doc = minimal()
    doc["trainer"]["data"] = {"path": "no-data", "tokenizer": "tok.json"}
    doc["trainer"]["init"] = {"llm": "models/llm", "encoder": "models/vit"}
    code, out = _validate_json(_study(d, doc))
    assert code == 2 and not out["ok"]
    got = {p["path"]: p for p in out["problems"] if p["rule"] == "path"}
    assert set(got) == {
        "trainer.data.path",
        "trainer.data.tokenizer",
        "trainer.init.llm",
        "trainer.init.encoder",
    }
    assert got["trainer.data.path"]["message"].startswith(
        f"{d / 'no-data'} does not exist (relative paths start"
    )
    assert got["trainer.data.tokenizer"]["message"] == f"{d / 'tok.json'} is a file, not a directory"
    assert "HuggingFace tokenizer directory" in got["trainer.data.tokenizer"]["fit"]
    assert got["trainer.init.llm"]["message"].startswith(f"{d / 'models' / 'llm'} does not exist")


def test_the_cli_prints_one_line_per_path_problem_and_exits_2(tmp_path):
    doc = minimal()
    doc["trainer"]["data"] = {"tokenizer": "gone"}
    doc["trainer"]["init"] = {"checkpoint": "runs/x/checkpoints"}
    r = runner.invoke(app, ["validate", str(_study(tmp_path, doc))])
    assert r.exit_code == 2
    lines = [ln for ln in r.output.splitlines() if "[path]" in ln]
    assert len(lines) == 2, r.output
    assert any("trainer.data.tokenizer: [path]" in ln and str(tmp_path / "gone") in ln for ln in lines)
    assert any("trainer.init.checkpoint: [path]" in ln for ln in lines)


def test_a_container_path_is_judged_where_its_mount_comes_from_on_this_host(tmp_path):
    src = tmp_path / "datasets"
    src.mkdir()
    doc = minimal()
    doc["cluster"]["container"] = {"image": "/images/x.sqsh", "mounts": [f"{src}:/data:ro"]}
    doc["trainer"]["data"] = {"path": "/data/blend.yaml"}  # the container's path
    code, out = _validate_json(_study(tmp_path / "a", doc))
    assert code == 2 and out["problems"][0]["message"].startswith(
        f"/data/blend.yaml (on this host {src / 'blend.yaml'}) does not exist"
    )
    (src / "blend.yaml").write_text("splits: {}\n")
    assert _validate_json(_study(tmp_path / "a", doc))[0] == 0
    # a mount whose source this host does not have (a login node without the cluster's file systems), or a
    # path inside the image: not judged here
    doc["cluster"]["container"]["mounts"] = ["/nowhere-on-this-host:/data:ro"]
    assert _validate_json(_study(tmp_path / "b", doc))[0] == 0


def test_a_moved_study_keeps_its_ids_and_a_study_without_paths_keeps_its_old_ids(tmp_path):
    here = tmp_path / "one"
    _tokenizer(here / "tok")
    (here / "ckpt").mkdir()
    doc = minimal()
    doc["trainer"]["data"] = {"tokenizer": "tok"}
    doc["trainer"]["init"] = {"checkpoint": "ckpt"}
    ids = [r.run_id for r in runs_of(load_study(_study(here, doc), env={}))]
    shutil.copytree(here, tmp_path / "two")
    moved = [r.run_id for r in runs_of(load_study(tmp_path / "two" / "s.yaml", env={}))]
    assert ids == moved
    # the id of this minimal study as it was before paths were resolved (no path in it: unchanged)
    plain = runs_of(load_study(_study(tmp_path / "three", minimal()), env={}))
    assert [r.run_id for r in plain] == ["073475b5b807"]


def test_an_absolute_data_path_outside_the_study_keeps_the_id_it_had(tmp_path):
    doc = minimal()
    doc["trainer"]["data"] = {"path": "/abs/data"}  # the id before paths were resolved, from anywhere
    for where in (tmp_path / "x" / "a", tmp_path / "y"):
        assert runs_of(load_study(_study(where, doc), env={}))[0].run_id == "c56d45802b93"


def test_a_command_reads_its_scripts_through_study_dir(tmp_path):
    d = tmp_path / "s"
    (d / "scripts").mkdir(parents=True)
    (d / "scripts" / "pretrain.py").write_text("print('hi')\n")
    doc = minimal()
    doc["trainer"]["command"] = "{{ study_dir }}/scripts/pretrain.py --out={{ study_dir }}/scripts"
    f = _study(d, doc)
    (r,) = render_study(load_study(f, env={}), tmp_path / "runs", source=str(f))
    assert f"{d}/scripts/pretrain.py --out={d}/scripts" in r.launch_sh.read_text()
    doc["trainer"]["command"] = "{{ study_dir }}/scripts/gone.py"
    code, out = _validate_json(_study(d, doc))
    (p,) = [p for p in out["problems"] if p["rule"] == "path"]
    assert code == 2 and p["message"] == f"trainer.command: {d}/scripts/gone.py does not exist"


def test_a_data_path_through_a_link_is_kept_as_written(tmp_path):
    # a container's path (/data/...) must not become what a link on this machine points to
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    doc = minimal()
    doc["trainer"]["data"] = {"path": str(tmp_path / "link" / "blend.yaml"), "tokenizer": "../link/tok"}
    study = load_study(_study(tmp_path / "s", doc), env={})
    assert study.trainer.data.path == str(tmp_path / "link" / "blend.yaml")
    assert study.trainer.data.tokenizer == str(tmp_path / "link" / "tok")

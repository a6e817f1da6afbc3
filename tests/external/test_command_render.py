"""A study's own training command (trainer.command / a point's command): rendered into launch.sh under
torchrun --no-python with every value shell-quoted; hostile values (quotes, $(...), backticks, newlines in a
path or an env value) arrive as one inert word each, checked by bash -n, shellcheck and by running the
rendered script with a stub python that records its argv and environment."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from helpers import REPO
from mimo_jobs.cli.app import app
from mimo_jobs.contract.rundir import RunDir
from mimo_jobs.study.command import render_command
from mimo_jobs.study.expand import runs_of
from mimo_jobs.study.load import parse_study
from mimo_jobs.study.render import RenderError, render_study

# Records the argv and the environment of the torchrun it stands in for, then exits 0.
STUB_PYTHON = """#!/usr/bin/env bash
exec "$REAL_PYTHON" -c '
import json, os, sys
out = os.environ["STUB_OUT"]
json.dump({"argv": sys.argv[1:], "env": dict(os.environ)}, open(os.path.join(out, "python.json"), "w"))
' "$@"
"""


def study_doc(command: str, **trainer) -> dict:
    return {
        "name": "ext",
        "cluster": {"executor": "local", "accelerator": "cpu", "gpus_per_node": 2, "requeue": False},
        "trainer": {"train_iters": 3, "seq_length": 16, "command": command, **trainer},
        "matrix": {"points": [{"nodes": 1, "gbs": 4, "encoder": {"dp": 1}, "llm": {"tp": 1, "dp": 1}}]},
    }


def test_the_command_gets_every_layout_value_quoted(tmp_path):
    study = parse_study(
        study_doc(
            "python pretrain.py --tp {{ llm.tp }} --pp {{ llm.pp }} --ep {{ llm.ep }} --dp {{ llm.dp }}"
            " --etp {{ encoder.tp }} --edp {{ encoder.dp }} --gbs {{ gbs }} --mbs {{ mbs }}"
            " --seq {{ seq_length }} --iters {{ train_iters }} --nodes {{ nodes }} --gpn {{ gpus_per_node }}"
            " --colo {{ colocated }} --run {{ run_name }}/{{ run_id }}/{{ study }}"
            " --save {{ checkpoint_dir }} --tb {{ run_dir }}/tensorboard"
        ),
        env={},
    )
    (run,) = runs_of(study)
    rd = RunDir.of(tmp_path, run.study, run.name, run.run_id)
    got = render_command(run, rd)
    assert got == (
        "python pretrain.py --tp 1 --pp 1 --ep 1 --dp 1 --etp 1 --edp 1 --gbs 4 --mbs 1 --seq 16 --iters 3"
        f" --nodes 1 --gpn 2 --colo false --run {run.name}/{run.run_id}/ext"
        f" --save {rd.root}/checkpoints --tb {rd.root}/tensorboard"
    )


@pytest.mark.parametrize(
    "command, expect",
    [
        ("python x.py --tp {{ llm.tq }}", "it may use"),
        ("python x.py --n {{ nope }}", "'nope' is undefined"),
        ("python x.py; rm -rf /", "unquoted ';'"),
        ("python x.py > out.log", "unquoted '>'"),
        ("python x.py | tee log", "unquoted '|'"),
        ("python x.py & ", "unquoted '&'"),
        ("python x.py --a 'open", "No closing quotation"),
        ("{% if false %}x{% endif %}", "renders to nothing"),
        ("python x.py {{ ''.__class__.__mro__ }}", "unsafe"),
        # a value the shell would read again, a comment that eats the exit-code capture, a second line
        ("python x.py `echo {{ run_dir }}`", "placeholder inside backquotes"),
        ("python x.py $'{{ run_dir }}'", "placeholder inside $'...'"),
        ("python x.py #{{ gbs }}", "unquoted word starting with '#'"),
        ('python x.py {% filter replace(" ", "\\n") %}a b{% endfilter %}', "more than one line"),
        # the template's own failures: one line each, never a traceback
        ('python x.py {% include "other" %}', "have nothing to read"),
        ("python x.py {{ gbs / 0 }}", "ZeroDivisionError"),
        ("python x.py {{ run_dir + 1 }}", "TypeError"),
        ("python x.py {% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "recurses without end"),
        # bounded: no exec takes a 200 KB argument, and a command line is not worth minutes of looping
        ("python x.py {{ 'a' * 200000 }}", "over 128 KiB"),
        (
            "python x.py {% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}",
            "took more",
        ),
    ],
)
def test_bad_commands_are_refused_before_anything_is_written(tmp_path, command, expect):
    study = parse_study(study_doc(command), env={})
    with pytest.raises(RenderError) as e:
        render_study(study, tmp_path / "runs")
    assert e.value.problems[0].rule == "command"
    assert expect in str(e.value), str(e.value)
    assert not (tmp_path / "runs").exists()


def test_validate_reports_a_bad_command_with_exit_2(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump(study_doc("python x.py --tp {{ llm.tq }}")))
    r = CliRunner().invoke(app, ["validate", str(f)])
    assert r.exit_code == 2, r.output
    assert "[command] trainer.command" in r.output and "llm.tp" in r.output


def test_a_point_may_carry_its_own_command_beside_packaged_trainer_points(tmp_path):
    doc = study_doc("python a.py")
    del doc["trainer"]["command"]
    point = doc["matrix"]["points"][0]
    doc["matrix"]["points"] = [point, {**point, "command": "python b.py --gbs {{ gbs }}"}]
    (packaged, own) = runs_of(parse_study(doc, env={}))
    assert own.name == packaged.name + "-cmd" and own.run_id != packaged.run_id
    rendered = {r.run.name: r for r in render_study(parse_study(doc, env={}), tmp_path / "runs")}
    assert "-m mimo_jobs.trainer" in rendered[packaged.name].launch_sh.read_text()
    text = rendered[own.name].launch_sh.read_text()
    assert "--no-python" in text and "python b.py --gbs 4" in text and "mimo_jobs.trainer" not in text


# however the template surrounds a placeholder (bare, in its own quotes, glued to a flag), the value is one word
SAVE_FORMS = {
    "bare": ("--save {{ checkpoint_dir }}", ["--save", "{}"]),
    "single-quoted": ("--save '{{ checkpoint_dir }}'", ["--save", "{}"]),
    "double-quoted": ('--save "{{ checkpoint_dir }}"', ["--save", "{}"]),
    "glued": ("--save={{ checkpoint_dir }}", ["--save={}"]),
    "inside a quoted word": ('--save "at:{{ checkpoint_dir }}:end"', ["--save", "at:{}:end"]),
}


@pytest.mark.parametrize("form", list(SAVE_FORMS))
def test_hostile_values_stay_inert_in_the_rendered_script(tmp_path, form):
    canary = tmp_path / "canary"
    hostile_dir = str(tmp_path / f"ck'x\" $(touch {canary}) `touch {canary}`\nline2 ; | &")
    hostile_env = f"a'b\"c $(touch {canary})\n`touch {canary}` ; end"
    save, save_words = SAVE_FORMS[form]
    doc = study_doc(f"python3 train.py {save} --tb {{{{ run_dir }}}}/tb --note {{{{ study }}}}")
    doc["trainer"]["checkpoint_dir"] = hostile_dir
    doc["cluster"]["env"] = {"EVIL": hostile_env}
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stub = bin_dir / "python3"
    stub.write_text(STUB_PYTHON)
    stub.chmod(0o755)
    doc["cluster"]["python"] = str(stub)
    (r,) = render_study(parse_study(doc, env={}), tmp_path / "runs")
    launch = r.launch_sh
    subprocess.run(["bash", "-n", str(launch)], check=True)
    sc = shutil.which("shellcheck")
    assert sc, "shellcheck missing: tests/run.sh installs the Debian package"
    chk = subprocess.run([sc, "--shell=bash", str(launch)], capture_output=True, text=True)
    assert chk.returncode == 0, chk.stdout + chk.stderr

    out = tmp_path / "out"
    out.mkdir()
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "HOME": str(out),
        "STUB_OUT": str(out),
        "REAL_PYTHON": sys.executable,
        "MASTER_PORT": "29999",
    }
    p = subprocess.run(
        ["bash", str(launch)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert not canary.exists()
    rec = json.loads((out / "python.json").read_text())
    argv = rec["argv"]
    tail = argv[argv.index("--no-python") + 1 :]
    saved = [w.replace("{}", hostile_dir) for w in save_words]
    assert tail == ["python3", "train.py", *saved, "--tb", f"{r.run_dir}/tb", "--note", "ext"]
    assert rec["env"]["EVIL"] == hostile_env
    assert rec["env"]["MIMO_JOBS_CHECKPOINT_DIR"] == hostile_dir
    assert rec["env"]["MIMO_JOBS_REQUEUE_MARKER"].startswith(hostile_dir + "/")
    assert rec["env"]["MIMO_JOBS_RUN_YAML"] == str(r.run_yaml)


def test_the_example_megatron_study_renders_and_passes_shellcheck(tmp_path):
    from mimo_jobs.study.load import load_study

    rendered = render_study(load_study(REPO / "studies" / "megatron_gpt_mock.yaml", env={}), tmp_path)
    assert len(rendered) == 3
    scripts = [str(p) for r in rendered for p in (r.sbatch_sh, r.launch_sh)]
    sc = shutil.which("shellcheck")
    assert sc, "shellcheck missing: tests/run.sh installs the Debian package"
    chk = subprocess.run([sc, "--shell=bash", *scripts], capture_output=True, text=True)
    assert chk.returncode == 0, chk.stdout + chk.stderr
    text = Path(rendered[1].launch_sh).read_text()
    assert "--no-python \\\n  python pretrain_gpt.py --tensor-model-parallel-size 2 " in text
    assert f"--save {rendered[1].run_dir}/checkpoints --load {rendered[1].run_dir}/checkpoints" in text


def test_user_templates_see_the_layout_and_the_rendered_command(tmp_path):
    tdir = tmp_path / "templates"
    tdir.mkdir()
    (tdir / "launch.sh.j2").write_text(
        "#!/bin/bash\n"
        "echo tp={{ llm.tp }} dp={{ llm.dp }} etp={{ encoder.tp }} edp={{ encoder.dp }} gbs={{ gbs }} "
        "mbs={{ mbs }} seq={{ seq_length }} iters={{ train_iters }} colo={{ colocated }}\n"
        "echo ck={{ checkpoint_dir | shq }}\n"
        "{{ command }}\n"
    )
    (r,) = render_study(
        parse_study(study_doc("python3 own.py --gbs {{ gbs }}"), env={}), tmp_path / "runs", tdir
    )
    assert r.launch_sh.read_text().splitlines()[1:] == [
        "echo tp=1 dp=1 etp=1 edp=1 gbs=4 mbs=1 seq=16 iters=3 colo=False",
        f"echo ck={r.run_dir}/checkpoints",
        "python3 own.py --gbs 4",
    ]

"""The README's console examples of `validate`, `submit --dry-run` and `plan` are what those commands print on
the shipped studies today: each `$ mimo-jobs ...` line of a README console block is run (with its pipe or
`; echo`, in bash) in a scratch directory that holds the shipped studies and the files the README makes with
`$ cat FILE`, and its output must equal the lines that follow it, with the scratch directory written
`<checkout>` and trailing blanks dropped. A README that drifts from the code fails here and the diff says
where; `python tests/docs/test_readme_outputs.py` rewrites those outputs from the commands."""

from __future__ import annotations

import difflib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from mdblocks import code_flags

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
CHECKED = ("mimo-jobs validate", "mimo-jobs submit", "mimo-jobs plan")
# a line that starts a command; other `$ ` lines are output (a dry run prints `$ sbatch ...`)
COMMAND = re.compile(r"^\$ (mimo-jobs |cat |COLUMNS=)")
WIDTH = "200"  # the README's examples are rendered at 200 columns
RULE = re.compile(r"^=+ (.*) =+$")


def console_blocks(text: str) -> list[list[str]]:
    """The lines of each ```console block."""
    blocks, cur = [], None
    for line, code in code_flags(text):
        if cur is None and code and line.strip() == "```console":
            cur = []
        elif cur is not None and line.strip() == "```":
            blocks.append(cur)
            cur = None
        elif cur is not None:
            cur.append(line)
    return blocks


def examples(text: str) -> list[tuple[str, list[str]]]:
    """(command, the output lines shown after it) for every command of every console block."""
    out = []
    for block in console_blocks(text):
        for line in block:
            if COMMAND.match(line):
                out.append((line[2:], []))
            elif out:
                out[-1][1].append(line)
    return out


def _checked() -> list[tuple[str, list[str]]]:
    return [(c, o) for c, o in examples(README.read_text()) if c.startswith(CHECKED)]


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("readme")
    (d / "studies").symlink_to(REPO / "studies")
    for cmd, shown in examples(README.read_text()):
        if cmd.startswith("cat "):
            (d / cmd.split()[1]).write_text("\n".join(shown) + "\n")
    return d


def run_example(cmd: str, where: Path) -> list[str]:
    env = dict(os.environ, COLUMNS=WIDTH, MIMO_JOBS_DB=str(where / "readme.duckdb"), NO_COLOR="1")
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    p = subprocess.run(
        ["bash", "-c", cmd],
        cwd=where,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=600,
    )
    text = p.stdout.replace(str(where), "<checkout>")  # one stream, in the order a terminal shows it
    return [normal(line) for line in text.splitlines()]


def normal(line: str) -> str:
    """Trailing blanks dropped; a rule's `=` padding (its width follows the length of the real path that
    `<checkout>` stands for) cut to three on each side."""
    return RULE.sub(r"=== \1 ===", line.rstrip())


def test_the_readme_shows_the_commands_this_test_checks():
    got = [c.split()[1] for c, _ in _checked()]
    assert got.count("validate") >= 2 and got.count("submit") >= 2 and got.count("plan") >= 1, got


@pytest.mark.parametrize("cmd,shown", _checked(), ids=[c for c, _ in _checked()])
def test_readme_example_is_what_the_command_prints(cmd, shown, scratch):
    want = [normal(line) for line in shown]
    got = run_example(cmd, scratch)
    diff = "\n".join(difflib.unified_diff(want, got, "README.md", "the command now", lineterm=""))
    assert got == want, f"README.md's `$ {cmd}` is stale; update it from the command's output:\n{diff}"


def test_the_comparison_can_fail(scratch):
    cmd, shown = _checked()[0]
    assert run_example(cmd, scratch) != [line.rstrip() for line in shown[:-1]] + [
        "a line the command never prints"
    ]


def test_the_cli_table_names_every_command():
    import typer.main

    from mimo_jobs.cli.app import app

    cli = typer.main.get_command(app)
    names = []
    for name, cmd in cli.commands.items():
        names += [f"{name} {sub}" for sub in getattr(cmd, "commands", {})] or [name]
    section = README.read_text().split("## The CLI", 1)[1].split("\n## ", 1)[0]
    missing = [
        n for n in names if not any(f"{a}{n}{b}" in section for a in ("mimo-jobs ", "`") for b in "` ")
    ]
    assert len(names) >= 14 and not missing, f"README.md's CLI table does not name: {missing}"


def update_readme() -> int:
    """Rewrite each checked example's output in README.md with what its command prints now."""
    import tempfile

    text = README.read_text()
    with tempfile.TemporaryDirectory() as tmp:
        where = Path(tmp)
        (where / "studies").symlink_to(REPO / "studies")
        for cmd, shown in examples(text):
            if cmd.startswith("cat "):
                (where / cmd.split()[1]).write_text("\n".join(shown) + "\n")
        changed = 0
        for cmd, shown in _checked():
            old = "\n".join([f"$ {cmd}", *shown]) + "\n"
            new = "\n".join([f"$ {cmd}", *run_example(cmd, where)]) + "\n"
            if old != new and old in text:
                text, changed = text.replace(old, new, 1), changed + 1
    README.write_text(text)
    print(f"README.md: {changed} example(s) rewritten")
    return 0


if __name__ == "__main__":  # python tests/docs/test_readme_outputs.py: bring the README's examples up to date
    sys.path.insert(0, str(Path(__file__).parent))
    sys.exit(update_readme())

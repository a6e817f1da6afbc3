"""Hostile study files to `validate` and `render`: alias bombs, deep nesting, recursive aliases, binary
bytes, FIFOs, duplicate keys, booleans and infinities where numbers belong, sizes beyond any cluster, bad
time limits, matrices that multiply into millions of runs. Each must be refused in one line per problem,
naming the place and the rule, with exit 2, within seconds and without memory growth, and nothing
written. One line per case (see tests/helpers/hostile.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from helpers import STUDIES
from helpers.hostile import Case, run_case

BASE = (STUDIES / "cpu_local.yaml").read_text()


def edit(old: str, new: str) -> str:
    assert old in BASE, old
    return BASE.replace(old, new, 1)


def bomb(levels: int = 9) -> str:
    lines = ["name: bomb", 'l0: &l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, levels):
        lines.append(f"l{i}: &l{i} [" + ",".join([f"*l{i - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


def fifo(tmp: Path) -> None:
    os.mkfifo(tmp / "s.yaml")


def nothing_rendered(tmp: Path, out: str) -> None:
    assert not (tmp / "runs").exists(), "a refused render wrote a run directory"


V = ["validate", "{tmp}/s.yaml"]
R = ["render", "{tmp}/s.yaml", "-o", "{tmp}/runs"]

CASES = [
    # what the YAML document itself may be
    Case("alias-bomb", V, 2, ("expands to more than 100,000 YAML nodes",), files={"s.yaml": bomb()}, timeout_s=30),
    Case("alias-bomb-render", R, 2, ("expands to more than",), files={"s.yaml": bomb()}, check=nothing_rendered,
         timeout_s=30),
    Case("recursive-alias", V, 2, ("recursive alias",), files={"s.yaml": "name: x\na: &a [1, *a]\n"}),
    Case("deep-nesting", V, 2, ("nested more than 32 levels",), files={"s.yaml": "a: " + "[" * 40 + "]" * 40}),
    Case("very-deep-nesting", V, 2, ("nested more than",), files={"s.yaml": "a: " + "[" * 100_000 + "]" * 100_000},
         timeout_s=30),
    Case("binary", V, 2, ("not UTF-8 text (byte 0xff at offset 8)",), files={"s.yaml": b"name: x\n\xff\xfe\x00"}),
    Case("fifo", V, 2, ("not a study file (not a regular file)",), setup=fifo, timeout_s=20),
    Case("fifo-render", R, 2, ("not a regular file",), setup=fifo, check=nothing_rendered, timeout_s=20),
    Case("directory", V, 2, ("not a study file (a directory)",), setup=lambda tmp: (tmp / "s.yaml").mkdir()),
    Case("missing", V, 2, ("s.yaml",)),
    Case("too-big", V, 2, ("a study file is at most 1,048,576 bytes",), files={"s.yaml": "#" * (2 << 20)}),
    Case("empty", V, 2, ("a study is a mapping",), files={"s.yaml": ""}),
    Case("a-list", V, 2, ("a study is a mapping, got list",), files={"s.yaml": "- 1\n- 2\n"}),
    Case("duplicate-key", V, 2, ("key 'seq_length' appears twice in the same mapping (first on line 25)",),
         files={"s.yaml": edit("  seq_length: 64\n", "  seq_length: 64\n  seq_length: 32\n")}),
    Case("duplicate-top-key", V, 2, ("key 'name' appears twice",), files={"s.yaml": "name: a\n" + BASE}),
    # numbers: booleans, infinities, strings, fractions, sizes beyond any cluster
    Case("bool-nodes", V, 2, ("nodes: [schema] True is a YAML boolean",),
         files={"s.yaml": edit("    nodes: 1\n", "    nodes: true\n")}),
    Case("yes-gbs", V, 2, ("gbs: [schema] True is a YAML boolean",),
         files={"s.yaml": edit("    gbs: 6\n", "    gbs: yes\n")}),
    Case("inf-lr", V, 2, ("trainer.lr.max: [schema] Input should be a finite number",),
         files={"s.yaml": edit("max: 4.0e-3", "max: .inf")}),
    Case("nan-lr", V, 2, ("trainer.lr.min: [schema] Input should be a finite number",),
         files={"s.yaml": edit("min: 1.0e-4", "min: .nan")}),
    Case("inf-string-lr", V, 2, ("finite number",), files={"s.yaml": edit("max: 4.0e-3", 'max: "inf"')}),
    Case("fraction-nodes", V, 2, ("nodes",), files={"s.yaml": edit("    nodes: 1\n", "    nodes: 1.5\n")}),
    Case("negative-nodes", V, 2, ("greater than or equal to 1",),
         files={"s.yaml": edit("    nodes: 1\n", "    nodes: -4\n")}),
    Case("huge-gbs", V, 2, ("gbs",), files={"s.yaml": edit("    gbs: 6\n", "    gbs: 2e300\n")}),
    Case("huge-gbs-int", V, 2, ("less than or equal to 100000000",),
         files={"s.yaml": edit("    gbs: 6\n", "    gbs: 200000000000000000000\n")}),
    Case("huge-gbs-render", R, 2, ("gbs",), files={"s.yaml": edit("    gbs: 6\n", "    gbs: 2e300\n")},
         check=nothing_rendered),
    # a float without a fraction passes pydantic's int check: 2.0e+300 would be a 301-digit batch
    Case("huge-gbs-float-render", R, 2, ("gbs: [schema]",),
         files={"s.yaml": edit("    gbs: 6\n", "    gbs: 2.0e+300\n")}, check=nothing_rendered),
    Case("huge-nodes", V, 2, ("less than or equal to 100000",),
         files={"s.yaml": edit("    nodes: 1\n", "    nodes: 1000000000000\n")}, timeout_s=20),
    Case("feasible-billion-nodes", V, 2, ("less than or equal to 100000",),
         files={"s.yaml": "name: b\ncluster: {gpus_per_node: 8}\ntrainer: {train_iters: 1}\nmatrix:\n"
                          "  points: [{nodes: 1000000000, encoder: {dp: 8}, gbs: 7999999992}]\n"}, timeout_s=20),
    Case("huge-seq", V, 2, ("seq_length",), files={"s.yaml": edit("  seq_length: 64", "  seq_length: 10000000000")}),
    Case("huge-seed", V, 2, ("seed",), files={"s.yaml": edit("  seed: 1234", "  seed: 99999999999999999999999")}),
    # SLURM time limits
    Case("time-99-minutes", V, 2, ("'00:99:99': minutes 99 must be below 60",),
         files={"s.yaml": edit('"00:10:00"', '"00:99:99"')}),
    Case("time-seconds-60", V, 2, ("seconds 60 must be below 60",), files={"s.yaml": edit('"00:10:00"', '"10:60"')}),
    Case("time-day-hours-24", V, 2, ("hours 24 must be below 24",), files={"s.yaml": edit('"00:10:00"', '"1-24"')}),
    Case("time-zero", V, 2, ("must be positive",), files={"s.yaml": edit('"00:10:00"', '"0"')}),
    Case("time-two-years", V, 2, ("more than 365 days",), files={"s.yaml": edit('"00:10:00"', '"730-00:00:00"')}),
    Case("time-words", V, 2, ("is not a SLURM time",), files={"s.yaml": edit('"00:10:00"', '"ten minutes"')}),
    # matrices that multiply
    Case("product-explosion", V, 2, ("expands to 1,000,000,000,000 points; a study holds at most 100,000",),
         files={"s.yaml": "name: p\ntrainer: {train_iters: 1}\nmatrix:\n  defaults: {nodes: 1, gbs: 6}\n"
                          "  product:\n" + "".join(f"    a{i}: [{', '.join(map(str, range(10)))}]\n"
                                                   for i in range(12))}, timeout_s=20),
    # accepted by validate once, then refused by every rank: the rules validate now shares with the trainer
    Case("colocated-pp", V, 2, ("matrix.points[3]: [colocated] colocated: llm.pp=2", "-> llm.pp=1"),
         files={"s.yaml": edit("{colocated: true, llm: {tp: 2}}", "{colocated: true, llm: {pp: 2}}")}),
    Case("warmup-beyond-decay", V, 2, ("[lr-warmup] trainer.lr.warmup_samples=200 is beyond the decay end at 120",
                                       "-> trainer.lr.warmup_samples <= 120"),
         files={"s.yaml": edit("warmup_samples: 12", "warmup_samples: 200")}),
    Case("warmup-beyond-decay-samples", V, 2, ("trainer.lr.warmup_samples=50 is beyond the decay end at 40",),
         files={"s.yaml": edit("warmup_samples: 12", "warmup_samples: 50\n    decay_samples: 40")}),
    # `$` matches before a final newline: every validator must match the whole text
    Case("env-key-newline", V, 2, ("environment variable name 'FOO\\n' is not a valid shell identifier",),
         files={"s.yaml": edit("    OMP_NUM_THREADS: 1\n", '    OMP_NUM_THREADS: 1\n    "FOO\\n": x\n')}),
    Case("name-newline", V, 2, ("name",), files={"s.yaml": edit("name: cpu_local\n", 'name: "cpu_local\\n"\n')}),
    Case("unset-variable", V, 2, ("environment variable ${NO_SUCH_VAR_X} is not set",),
         files={"s.yaml": edit('  model: tiny', '  model: "${NO_SUCH_VAR_X}"')}),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_study(case: Case, tmp_path: Path) -> None:
    run_case(case, tmp_path)


def test_the_times_sbatch_accepts_are_read_exactly() -> None:
    from mimo_jobs.study.slurm_time import seconds

    assert seconds("90") == 90 * 60  # minutes
    assert seconds("10:30") == 10 * 60 + 30  # MM:SS
    assert seconds("48:00:00") == 48 * 3600  # hours may exceed a day without a day field
    assert seconds("2-12") == (2 * 24 + 12) * 3600
    assert seconds("2-12:30") == ((2 * 24 + 12) * 60 + 30) * 60
    assert seconds("1-00:00:01") == 86401


def test_the_trainer_refuses_a_schedule_with_validate_s_words() -> None:
    """The trainer's schedule asks the same rule validate does (study/lr_rules.py), so both say the same."""
    from mimo_jobs.study.spec import LRSpec
    from mimo_jobs.trainer.model.schedule import from_spec

    with pytest.raises(ValueError, match=r"trainer.lr.warmup_samples=200 is beyond the decay end at 120"):
        from_spec(LRSpec(schedule="cosine", warmup_samples=200), 120)
    assert from_spec(LRSpec(schedule="constant", warmup_samples=200), 120)(100) > 0  # constant never decays

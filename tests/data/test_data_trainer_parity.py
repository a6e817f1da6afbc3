"""The trainer on a synthetic energon dataset: heterogeneous runs (torchrun, gloo) in fan-out and fan-in
layouts reproduce the one-process --reference step for step, and each iteration consumed exactly the
loss-bearing and image tokens that the lanes' samples hold (counted independently of the trainer)."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
from pathlib import Path

import pytest
import yaml

from helpers.launch import trainer, worker_env
from mimo_jobs.contract.rundir import RunDir
from mimo_jobs.study.expand import runs_of
from mimo_jobs.study.load import parse_study
from mimo_jobs.study.runspec import run_yaml_doc

ITERS = 3


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    from mimo_jobs.data.synth import SynthConfig, synth

    root = tmp_path_factory.mktemp("parity")
    with contextlib.redirect_stdout(io.StringIO()):
        res = synth(
            root / "ds",
            SynthConfig(
                samples=128,
                text_only_fraction=0.25,
                image_sizes=((8, 8), (12, 12), (16, 8)),
                samples_per_shard=32,
            ),
        )
    return root, res.blend


def _run_yaml(
    root: Path,
    blend: Path,
    enc_dp: int,
    llm_dp: int,
    mbs: int,
    gbs: int,
    nw: int,
    tokenizer: Path | None = None,
):
    world = enc_dp + llm_dp
    data = {"provider": "energon", "path": str(blend), "num_workers": nw}
    if tokenizer is not None:
        data["tokenizer"] = str(tokenizer)
    study = parse_study(
        {
            "name": "energon-parity",
            "cluster": {"executor": "local", "accelerator": "cpu", "gpus_per_node": world},
            "trainer": {
                "model": "tiny",
                "seq_length": 64,
                "train_iters": ITERS,
                "seed": 1234,
                "lr": {"schedule": "constant", "max": 1e-3},
                "data": data,
            },
            "matrix": {
                "points": [
                    {"nodes": 1, "encoder": {"dp": enc_dp}, "llm": {"dp": llm_dp}, "gbs": gbs, "mbs": mbs}
                ]
            },
        },
        env={},
    )
    (spec,) = runs_of(study)
    rd = RunDir.of(root / "runs", spec.study, spec.name, spec.run_id)
    rd.root.mkdir(parents=True, exist_ok=True)
    rd.run_yaml.write_text(yaml.safe_dump(run_yaml_doc(spec, rd.root, provenance={}), sort_keys=False))
    return spec, rd


def _iterations(path: Path) -> dict[int, dict]:
    return {
        r["iteration"]: r for r in map(json.loads, path.read_text().splitlines()) if r["kind"] == "iteration"
    }


def _expected_counts(spec) -> dict[int, tuple[int, int]]:
    """Independent of the trainer: draw the global batches from the lanes and count their tokens."""
    from mimo_jobs.data.energon_provider import make_energon_provider

    plan = spec.rank_layout()
    lanes = list(range(plan.layout.llm_dp))
    p = make_energon_provider(spec, plan, lanes, False, True)
    out = {}
    try:
        for it in range(1, ITERS + 1):
            loss_toks = img = 0
            for _ in range(plan.num_microbatches):
                for lane in lanes:
                    b = p.next(lane)
                    loss_toks += int(b.loss_mask.sum())
                    img += sum(b.counts("vision"))
            out[it] = (loss_toks, img)
    finally:
        p.close()
    return out


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "enc_dp,llm_dp,mbs,gbs,nw", [(1, 2, 1, 4, 0), (2, 1, 2, 4, 2)], ids=["fan-out", "fan-in-nw2"]
)
def test_trainer_on_energon_matches_reference(dataset, enc_dp, llm_dp, mbs, gbs, nw):
    root, blend = dataset
    _check_parity(root, blend, enc_dp, llm_dp, mbs, gbs, nw)


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "enc_dp,llm_dp,mbs,gbs,nw", [(1, 3, 1, 6, 0), (2, 1, 2, 4, 1)], ids=["fan-out3", "fan-in-nw1"]
)
def test_instruction_data_with_a_hf_chat_tokenizer_matches_reference(
    instruct_data, hf_tokenizer, tmp_path, enc_dp, llm_dp, mbs, gbs, nw
):
    res, _ = instruct_data
    _check_parity(tmp_path, res.blend, enc_dp, llm_dp, mbs, gbs, nw, hf_tokenizer)


def _check_parity(root, blend, enc_dp, llm_dp, mbs, gbs, nw, tokenizer=None):
    spec, rd = _run_yaml(root, blend, enc_dp, llm_dp, mbs, gbs, nw, tokenizer)
    assert spec.rank_layout().fan == ("out" if enc_dp < llm_dp else "in")
    env = worker_env()
    het = subprocess.run(
        trainer(rd.run_yaml, "--quiet", nproc=enc_dp + llm_dp),
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=500,
    )
    assert het.returncode == 0, het.stderr[-4000:]
    ref = subprocess.run(
        trainer(rd.run_yaml, "--reference", "--quiet"),
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ref.returncode == 0, ref.stderr[-4000:]
    h, r = _iterations(rd.metrics), _iterations(rd.root / "metrics.reference.jsonl")
    assert sorted(h) == sorted(r) == list(range(1, ITERS + 1))
    want = _expected_counts(spec)
    for it in h:
        assert h[it]["loss"] == pytest.approx(r[it]["loss"], rel=1e-5, abs=1e-6)
        assert h[it]["grad_norm"] == pytest.approx(r[it]["grad_norm"], rel=1e-4, abs=1e-6)
        got = (h[it]["tokens"], h[it]["extras"]["image_tokens"])
        assert got == (r[it]["tokens"], r[it]["extras"]["image_tokens"]) == want[it], (it, got, want[it])
    assert any(w[1] for w in want.values()), "the batches held images"

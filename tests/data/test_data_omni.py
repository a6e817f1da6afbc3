"""Real data for a model with several encoder modules: a `data synth --audio` dataset (image only, audio
only, both, neither) read by the energon provider of a vision + audio study, each module's inputs in the
batch fields the mock provider fills for the same model (images for the image module, clips for the audio
one); an audio-only model takes the clips and names an image sample it cannot embed; the trainer's
one-process reference takes a step on it."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess

import pytest
import torch

from mimo_jobs.data.errors import DataError
from mimo_jobs.data.synth_audio import AudioSynthConfig, write_audio

OMNI = {"name": "tiny-omni", "encoders": {"vision": "tiny", "audio": "tiny-audio"}, "llm": "tiny"}
AUDIO_ONLY = {"name": "tiny-hear", "encoders": {"audio": "tiny-audio"}, "llm": "tiny"}


@pytest.fixture(scope="module")
def omni_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("omni") / "omni"
    # tiny-audio reads 16 mel bins and at most 64 frames; the tiny ViT 16 px images of 4 px patches
    cfg = AudioSynthConfig(samples=16, n_mels=16, frames=(16, 24), seed=5, samples_per_shard=8)
    with contextlib.redirect_stdout(io.StringIO()):
        write_audio(root, cfg)
    return root


def _colocated(path, model):
    from mimo_jobs.study.expand import runs_of
    from mimo_jobs.study.load import parse_study

    doc = {
        "name": "omnidata",
        "cluster": {"executor": "local", "accelerator": "cpu", "gpus_per_node": 1},
        "trainer": {
            "model": model,
            "seq_length": 64,
            "train_iters": 1,
            "seed": 7,
            "data": {"provider": "energon", "path": str(path)},
        },
        "matrix": {"points": [{"nodes": 1, "colocated": True, "llm": {"dp": 1}, "gbs": 4, "mbs": 4}]},
    }
    (spec,) = runs_of(parse_study(doc, env={}))
    return spec


def test_each_module_gets_its_own_inputs_from_energon(omni_data):
    from mimo_jobs.data.energon_provider import make_energon_provider

    spec = _colocated(omni_data, OMNI)
    p = make_energon_provider(spec, spec.rank_layout(), [0], True, True)
    try:
        seen = {"image": 0, "audio": 0}
        for _ in range(4):
            b = p.next(0)
            for i in range(len(b.sample_keys)):
                # each placeholder count is its own module's, read off the tokens
                assert int((b.tokens[i] == p.image_token_id).sum()) == b.image_token_counts[i]
                assert int((b.tokens[i] == p.audio_token_id).sum()) == b.audio_token_counts[i]
                assert (b.images[i] is not None) == bool(b.image_token_counts[i])
                assert (b.audio[i] is not None) == bool(b.audio_token_counts[i])
                if b.audio[i] is not None:
                    assert all(c.shape[0] == 16 and isinstance(c, torch.Tensor) for c in b.audio[i])
                    seen["audio"] += 1
                if b.images[i] is not None:
                    seen["image"] += 1
        assert seen["image"] and seen["audio"]
    finally:
        p.close()


def test_an_audio_only_model_takes_clips_and_names_an_image_it_cannot_embed(omni_data):
    from mimo_jobs.data.energon_provider import make_energon_provider

    spec = _colocated(omni_data, AUDIO_ONLY)
    p = make_energon_provider(spec, spec.rank_layout(), [0], True, True)
    try:
        with pytest.raises(DataError, match="has an image but the model has no image encoder"):
            for _ in range(4):
                p.next(0)
    finally:
        p.close()


@pytest.mark.slow  # a fresh trainer process: importing megatron-core dominates
def test_the_reference_trains_vision_and_audio_on_energon(omni_data, tmp_path):
    import yaml

    from helpers.launch import trainer, worker_env
    from mimo_jobs.contract.rundir import RunDir
    from mimo_jobs.study.runspec import run_yaml_doc

    spec = _colocated(omni_data, OMNI)
    rd = RunDir.of(tmp_path / "runs", spec.study, spec.name, spec.run_id)
    rd.root.mkdir(parents=True, exist_ok=True)
    rd.run_yaml.write_text(yaml.safe_dump(run_yaml_doc(spec, rd.root, provenance={}), sort_keys=False))
    proc = subprocess.run(
        trainer(rd.run_yaml, "--reference", "--quiet"),
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = [json.loads(x) for x in (rd.root / "metrics.reference.jsonl").read_text().splitlines()]
    it = next(r for r in rows if r["kind"] == "iteration")
    assert it["loss"] > 0 and it["extras"]["image_tokens"] > 0


def _members(root) -> dict[str, int]:
    """Image and clip members of the shards, counted from the tar files: {"image": n, "audio": n}."""
    import tarfile

    out = {"image": 0, "audio": 0}
    for shard in sorted(root.glob("*.tar")):
        with tarfile.open(shard) as tar:
            for m in tar.getmembers():
                out["image"] += m.name.endswith(".png")
                out["audio"] += m.name.endswith(".npy")
    return out


def _stats(*args):
    import sys

    return subprocess.run(
        [sys.executable, "-m", "mimo_jobs.cli", "data", "stats", *map(str, args)],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_data_stats_measures_each_module(omni_data, tmp_path):
    """`data stats` of a vision + audio model, from --model and from a study: each module's items and tokens
    under `modules`, the one-image-encoder keys the planner reads kept; an audio-only model names the image
    sample it cannot embed."""
    import yaml

    from mimo_jobs.contract.datastats import read_stats

    want = _members(omni_data)
    out = tmp_path / "stats.json"
    model = json.dumps(OMNI)
    r = _stats(omni_data, "--seq-length", 64, "--model", model, "--out", out)
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    mods = doc["modules"]
    assert list(mods) == ["vision", "audio"]
    assert (mods["vision"]["items"], mods["audio"]["items"]) == (want["image"], want["audio"])
    per = doc["per_sample"]
    assert mods["vision"]["tokens"]["max"] == max(s["image_tokens"] for s in per) > 0
    assert mods["audio"]["tokens"]["max"] == max(s["audio_tokens"] for s in per) > 0
    assert "module audio (audio): " in r.stdout
    read_stats(out)  # the planner's reader takes the file as before

    study = tmp_path / "omni.yaml"
    study.write_text(
        yaml.safe_dump(
            {
                "name": "omnistats",
                "cluster": {"executor": "local", "accelerator": "cpu", "gpus_per_node": 1},
                "trainer": {
                    "model": OMNI,
                    "seq_length": 64,
                    "train_iters": 1,
                    "data": {
                        "provider": "energon",
                        "path": str(omni_data),
                        "stats": str(tmp_path / "s2.json"),
                    },
                },
                "matrix": {"points": [{"nodes": 1, "colocated": True, "llm": {"dp": 1}, "gbs": 4, "mbs": 4}]},
            }
        )
    )
    r = _stats("--study", study)
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "s2.json").read_text())["modules"] == mods

    r = _stats(omni_data, "--seq-length", 64, "--model", json.dumps(AUDIO_ONLY), "--out", out)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "has an image but the model has no image encoder" in r.stderr + r.stdout

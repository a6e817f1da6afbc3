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


def _colocated(path, model, tokenizer=None):
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
            "data": {
                "provider": "energon",
                "path": str(path),
                **({"tokenizer": str(tokenizer)} if tokenizer else {}),
            },
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
                assert int((b.tokens[i] == p.image_token_id).sum()) == b.counts("vision")[i]
                assert int((b.tokens[i] == p.audio_token_id).sum()) == b.counts("audio")[i]
                assert (b.inputs["vision"].items[i] is not None) == bool(b.counts("vision")[i])
                assert (b.inputs["audio"].items[i] is not None) == bool(b.counts("audio")[i])
                if b.inputs["audio"].items[i] is not None:
                    assert all(
                        c.shape[0] == 16 and isinstance(c, torch.Tensor) for c in b.inputs["audio"].items[i]
                    )
                    seen["audio"] += 1
                if b.inputs["vision"].items[i] is not None:
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


def _journey_jsonl(root):
    """A ShareGPT-style JSONL (line by line: image only, audio only, both, neither, a `.wav` clip with an
    extra key) beside its PNG files, `.npy` log-mel clips (16 mel bins: tiny-audio's) and one PCM `.wav`."""
    import wave

    import numpy as np
    from PIL import Image

    root.mkdir()
    rng = np.random.default_rng(0)
    for i, side in enumerate((8, 16)):
        Image.fromarray(rng.integers(0, 255, (side, side, 3), dtype=np.uint8)).save(root / f"im{i}.png")
    clips = {f"c{i}.npy": rng.standard_normal((16, f)).astype(np.float32) for i, f in enumerate((20, 33))}
    for name, c in clips.items():
        np.save(root / name, c)
    pcm = np.round(np.sin(np.arange(8000) / 7.0) * 12000).astype("<i2")  # 0.5 s at 16 kHz: 50 frames
    with wave.open(str(root / "s.wav"), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(pcm.tobytes())

    def turn(q, a="fine."):
        return [{"from": "human", "value": q}, {"from": "gpt", "value": a}]

    records = [
        {"id": 0, "image": "im0.png", "conversations": turn("<image>\nwhat is it?")},
        {"id": 1, "audio": "c0.npy", "conversations": turn("<audio>\nwhat is said?")},
        {"id": 2, "image": "im1.png", "audio": ["c1.npy"], "conversations": turn("<image> and <audio>?")},
        {"id": 3, "conversations": turn("hello there")},
        {"id": 4, "audio": "s.wav", "lang": "en", "conversations": turn("<audio> transcribe")},
    ]
    (root / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return clips, pcm


def _prepare(*args):
    import sys

    return subprocess.run(
        [sys.executable, "-m", "mimo_jobs.cli", "data", "prepare", *map(str, args)],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_prepare_carries_audio_to_the_audio_module(tmp_path, hf_tokenizer):
    """JSONL with images and audio -> `data prepare --n-mels 16` -> the energon provider of a vision + audio
    model gives each clip (`.npy` as given, the `.wav` as its log-mel) at its markers -> `data stats
    --study` counts them per module."""
    import numpy as np
    import yaml

    from mimo_jobs.data.audio_input import log_mel
    from mimo_jobs.data.energon_provider import make_energon_provider
    from mimo_jobs.model.families.whisper import MelFeatures

    src = tmp_path / "src"
    clips, pcm = _journey_jsonl(src)
    out = tmp_path / "ds"
    r = _prepare(src / "train.jsonl", "-o", out, "--n-mels", 16)
    assert r.returncode == 0, r.stderr
    assert "5 samples (train 5, val 0, test 0) with 2 images and 3 audio clips" in r.stdout
    assert "warning: 1 record(s) have the key 'lang', which nothing reads" in r.stderr

    want = {
        "1": [clips["c0.npy"]],
        "2": [clips["c1.npy"]],
        "4": [log_mel(pcm / 32768.0, MelFeatures(n_mels=16))],
    }
    spec = _colocated(out, OMNI, hf_tokenizer)
    p = make_energon_provider(spec, spec.rank_layout(), [0], True, True)
    got = {}
    try:
        for _ in range(2):
            b = p.next(0)
            for i, key in enumerate(b.sample_keys):
                n = int((b.tokens[i] == p.audio_token_id).sum())
                assert n == b.counts("audio")[i]
                if b.inputs["audio"].items[i] is not None:
                    got[key] = [c.numpy() for c in b.inputs["audio"].items[i]]
    finally:
        p.close()
    by_id = {str(int(k[1:])): v for k, v in got.items()}  # keys are l<line>: line n holds id n-1
    by_id = {str(int(k) - 1): v for k, v in by_id.items()}
    assert set(by_id) == set(want)
    for k, cs in want.items():
        for a, b in zip(by_id[k], cs, strict=True):
            np.testing.assert_allclose(a, b, rtol=0, atol=0)

    study = tmp_path / "s.yaml"
    study.write_text(
        yaml.safe_dump(
            {
                "name": "journey",
                "cluster": {"executor": "local", "accelerator": "cpu", "gpus_per_node": 1},
                "trainer": {
                    "model": OMNI,
                    "seq_length": 64,
                    "train_iters": 1,
                    "data": {"provider": "energon", "path": str(out), "tokenizer": str(hf_tokenizer)},
                },
                "matrix": {"points": [{"nodes": 1, "colocated": True, "llm": {"dp": 1}, "gbs": 4, "mbs": 4}]},
            }
        )
    )
    r = _stats("--study", study)
    assert r.returncode == 0, r.stderr
    mods = json.loads((out / "stats.json").read_text())["modules"]
    assert (mods["vision"]["items"], mods["audio"]["items"]) == (2, 3)


def test_synth_audio_and_prepared_data_are_one_sample_type_read_one_way(omni_data, tmp_path, hf_tokenizer):
    """`data synth --audio` writes the sample type `data prepare` writes: the same dataset.yaml and sample
    loader, read by one task encoder. A prepared conversation renders through the chat template (its rows
    hold the turn opener); a synthetic one, one assistant turn that nothing prompts, is a document: BOS, the
    text with its placeholders, EOS, every text token learned."""
    from transformers import AutoTokenizer

    from mimo_jobs.data.energon_provider import make_energon_provider

    src = tmp_path / "src"
    _journey_jsonl(src)
    out = tmp_path / "ds"
    assert _prepare(src / "train.jsonl", "-o", out, "--n-mels", 16).returncode == 0
    for name in ("dataset.yaml", "sample_loader.py"):
        assert (omni_data / ".nv-meta" / name).read_text() == (out / ".nv-meta" / name).read_text(), name
    opener = AutoTokenizer.from_pretrained(hf_tokenizer).convert_tokens_to_ids("<|im_start|>")
    for path in (omni_data, out):
        spec = _colocated(path, OMNI, hf_tokenizer)
        p = make_energon_provider(spec, spec.rank_layout(), [0], True, True)
        try:
            b = p.next(0)
        finally:
            p.close()
        rows = b.tokens.tolist()
        assert all((opener in row) == (path == out) for row in rows), path
        assert any(b.counts("audio")), path
        if path == omni_data:  # a document: everything after BOS up to EOS is a target but the placeholders
            for r, row in enumerate(rows):
                n = row.index(p.tokenizer.eos_id)
                held = {p.image_token_id, p.audio_token_id}
                want = [t if t not in held else -100 for t in row[1 : n + 1]]
                fixed = [-100 if row[t] in held else v for t, v in enumerate(want)]
                assert b.labels[r, :n].tolist() == fixed, r


def test_prepare_refuses_audio_that_does_not_fit_by_file_and_line(tmp_path):
    src = tmp_path / "src"
    _journey_jsonl(src)
    r = _prepare(src / "train.jsonl", "-o", tmp_path / "b", "--n-mels", 80)  # the clips have 16 bins
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert (
        "train.jsonl:2: " in r.stderr
        and "c0.npy holds an array of shape [16, 20]; expected [80, frames]" in r.stderr
    )
    lines = (src / "train.jsonl").read_text().splitlines()
    bad = json.loads(lines[1])
    bad["conversations"][0]["value"] = "no marker here"
    lines[1] = json.dumps(bad)
    (src / "train.jsonl").write_text("\n".join(lines) + "\n")
    r = _prepare(src / "train.jsonl", "-o", tmp_path / "a", "--n-mels", 16)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert 'train.jsonl:2: the text has 0 <audio> marker(s) but field "audio" gives 1 clip(s)' in r.stderr
    r = _prepare(src / "train.jsonl", "-o", tmp_path / "c", "--n-mels", 16, "--skip-bad")
    assert r.returncode == 0, r.stderr
    assert "4 samples" in r.stdout and "2 audio clips" in r.stdout and "skipped 1 bad record(s)" in r.stdout


# The new user's journey on an omni model and data a team prepared itself: JSONL with images and audio ->
# `data prepare` -> `data stats` -> `validate` -> a run with each encoder on ranks of its own and the LLM at
# TP 2, and a colocated one, trained on it through `submit` (the local executor, real torchrun jobs) ->
# `ingest` -> `report` rows per module; the run on ranks of their own exact against the one-process reference.
@pytest.mark.slow
def test_an_omni_team_trains_on_its_own_prepared_data_from_jsonl_to_the_report(
    shared_runs, tmp_path, hf_tokenizer
):
    import duckdb
    import yaml

    from helpers.submit import cli
    from mimo_jobs.contract.rundir import RunDir
    from mimo_jobs.study.expand import runs_of
    from mimo_jobs.study.load import load_study

    src = tmp_path / "src"
    _journey_jsonl(src)
    data = tmp_path / "ds"
    r = _prepare(src / "train.jsonl", "-o", data, "--n-mels", 16)
    assert r.returncode == 0, r.stderr
    study = tmp_path / "omni.yaml"
    study.write_text(
        yaml.safe_dump(
            {
                "name": "journey",
                "cluster": {
                    "executor": "local",
                    "accelerator": "cpu",
                    "gpus_per_node": 4,
                    "time_limit": "00:10:00",
                },
                "trainer": {
                    "model": OMNI,
                    "seq_length": 64,
                    "train_iters": 3,
                    "seed": 7,
                    "log_interval": 1,
                    "timeout_s": 120,
                    "data": {"provider": "energon", "path": str(data), "tokenizer": str(hf_tokenizer)},
                },
                "matrix": {
                    "defaults": {"nodes": 1, "gbs": 4, "mbs": 1},
                    "points": [
                        {"encoders": {"vision": {"dp": 1}, "audio": {"dp": 1}}, "llm": {"tp": 2}},
                        {"colocated": True, "llm": {"tp": 2, "dp": 2}},
                    ],
                },
            },
            sort_keys=False,
        )
    )
    stats = cli("data", "stats", "--study", str(study), "--json")
    assert stats.returncode == 0, stats.stderr
    assert set(json.loads(stats.stdout)["modules"]) == {"vision", "audio"}
    v = cli("validate", str(study))
    assert v.returncode == 0 and "2 run(s) feasible" in v.stdout, v.stdout + v.stderr

    db, runs = tmp_path / "store.duckdb", tmp_path / "runs"
    env = {"MIMO_JOBS_LOCAL_SLOTS_DIR": str(tmp_path / "slots")}
    sub = cli("submit", str(study), "--runs-dir", str(runs), "--db", str(db), "--wait", env=env, timeout=900)
    assert sub.returncode == 0, sub.stdout[-4000:] + sub.stderr[-4000:]
    ing = cli("ingest", str(runs), "--db", str(db))
    assert ing.returncode == 0, ing.stdout + ing.stderr

    # the run on ranks of their own, against the one-process reference of the same run.yaml
    own = next(r for r in runs_of(load_study(study)) if not r.layout.colocated)
    rd = RunDir.of(runs, own.study, own.name, own.run_id)
    ref = shared_runs.reference(rd.run_yaml).ok("reference").iterations()
    with duckdb.connect(str(db), read_only=True) as con:
        got = con.execute(
            "SELECT iteration, loss FROM iterations WHERE run_id = ? AND NOT superseded ORDER BY 1",
            [own.run_id],
        ).fetchall()
        modules = con.execute(
            "SELECT DISTINCT module FROM run_modules WHERE run_id = ? ORDER BY 1", [own.run_id]
        ).fetchall()
    assert [i for i, _ in got] == [1, 2, 3]
    for (_, loss), a in zip(got, ref):
        assert loss == pytest.approx(a["loss"], rel=1e-5), (loss, a)
    assert {m for (m,) in modules} >= {"vision", "audio"}

    rep = cli("report", "--db", str(db), "--format", "json")
    assert rep.returncode == 0, rep.stderr
    assert rep.stdout.count("vision") and rep.stdout.count("audio"), rep.stdout[:3000]
    # the colocated run's phase rows per module: each encoder's forward and its own backward (timed even
    # where a microbatch of this small dataset has no image or clip for it)
    col = next(r for r in runs_of(load_study(study)) if r.layout.colocated)
    rows = {e["module"]: e for e in json.loads(rep.stdout)["encoder_phases"] if e["run_id"] == col.run_id}
    assert set(rows) == {"vision", "audio", "llm"}, rows
    assert all(rows[m]["fwd_ms"] is not None and rows[m]["bwd_ms"] is not None for m in rows), rows

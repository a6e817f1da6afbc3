"""Videos from a dataset: a JSONL record's `"video"` (its frames' image files) -> `data prepare` -> the energon
provider hands each video to the image module as one [1, F, C, H, W] input, as the mock provider does, its
placeholders priced by the module's temporal patch (EncoderArch.video_tokens); bad videos are refused by file
and line or skipped; `data stats` counts video tokens; `validate` and the trainer's preflight refuse, in the
same words, a dataset with videos for an image module without a temporal patch; a colocated run on it
matches the one-process reference."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import torch

VIDEO = {
    "name": "tiny-video",
    "encoders": {"vision": {"preset": "tiny", "temporal_patch_size": 2}},
    "llm": "tiny",
}
FLAT = {"name": "tiny-flat", "encoders": {"vision": "tiny"}, "llm": "tiny"}
OMNI_VIDEO = {
    "name": "tiny-omni-video",
    "encoders": {"vision": {"preset": "tiny", "temporal_patch_size": 2}, "audio": "tiny-audio"},
    "llm": "tiny",
}
SEQ = 96


def _png(path, h: int, w: int, seed: int) -> None:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(path)


def _turn(q: str, a: str = "fine.") -> list[dict]:
    return [{"from": "human", "value": q}, {"from": "gpt", "value": a}]


def _source(root):
    """Frames (a 4-frame 8x8 video, a 3-frame 16x16 one), a still 8x16 image, a 16-mel clip, and a JSONL:
    video only, a video then an image, text only, an image only, audio and a video."""
    import numpy as np

    root.mkdir()
    for i in range(4):
        _png(root / f"a{i}.png", 8, 8, i)
    for i in range(3):
        _png(root / f"b{i}.png", 16, 16, 10 + i)
    _png(root / "still.png", 8, 16, 20)
    np.save(root / "c.npy", np.random.default_rng(0).standard_normal((16, 20)).astype(np.float32))
    records = [
        {"id": 0, "video": [f"a{i}.png" for i in range(4)], "conversations": _turn("<video>\nwhat happens?")},
        {
            "id": 1,
            "video": [f"b{i}.png" for i in range(3)],
            "image": "still.png",
            "conversations": _turn("<video> then <image>?"),
        },
        {"id": 2, "conversations": _turn("hello there")},
        {"id": 3, "image": "still.png", "conversations": _turn("<image> what?")},
        {
            "id": 4,
            "audio": "c.npy",
            "video": [["a0.png", "a1.png"]],
            "conversations": _turn("<audio> <video>"),
        },
    ]
    (root / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return root / "train.jsonl"


# Twelve frames of distinct solid colours (hues 30 degrees apart): a decoded frame is matched to its source
# frame by colour, far beyond the codec's error on a flat colour.
HUES = [tuple(round(255 * c) for c in __import__("colorsys").hsv_to_rgb(i / 12, 1, 1)) for i in range(12)]


def _mp4(path, colours, size: int = 16) -> None:
    """An MPEG-4 Part 2 video (FFmpeg's own encoder, in every PyAV wheel) of one solid frame per colour."""
    import av
    import numpy as np

    with av.open(str(path), "w") as out:
        stream = out.add_stream("mpeg4", rate=10)
        stream.width = stream.height = size
        stream.pix_fmt = "yuv420p"
        for colour in colours:
            rgb = np.empty((size, size, 3), np.uint8)
            rgb[:] = colour
            out.mux(stream.encode(av.VideoFrame.from_ndarray(rgb, format="rgb24")))
        out.mux(stream.encode())


def _wav(path) -> None:
    """A tenth of a second of silence: a file PyAV reads that holds no video stream."""
    import av
    import numpy as np

    with av.open(str(path), "w") as out:
        stream = out.add_stream("pcm_s16le", rate=8000)
        frame = av.AudioFrame.from_ndarray(np.zeros((1, 800), np.int16), format="s16", layout="mono")
        frame.sample_rate = 8000
        out.mux(stream.encode(frame))
        out.mux(stream.encode())


@pytest.fixture(scope="module")
def clips(prepared):
    """Video files beside the frames: a 12-frame clip of HUES, a 3-frame one, bytes that are no video, an
    audio file, and a sparse file one byte over the size limit (nothing of it is read)."""
    src, _ = prepared
    _mp4(src / "clip.mp4", HUES)
    _mp4(src / "short.mp4", HUES[:3])
    _wav(src / "sound.wav")
    (src / "corrupt.mp4").write_bytes(bytes(range(256)) * 16)
    with (src / "huge.mp4").open("wb") as f:
        f.truncate((4 << 30) + 1)  # one byte over the 4 GiB a video file may hold (the refusal names it)
    return src


def _data(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mimo_jobs.cli", "data", *map(str, args)],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    base = tmp_path_factory.mktemp("video")
    jsonl = _source(base / "src")
    out = base / "ds"
    r = _data("prepare", jsonl, "-o", out, "--n-mels", 16)
    assert r.returncode == 0, r.stderr
    assert "5 samples (train 5, val 0, test 0) with 2 images, 3 videos and 1 audio clips" in r.stdout
    assert json.loads((out / "prepare.json").read_text())["videos_written"] == 3
    return base / "src", out


def _study(path, model, tokenizer, **point) -> dict:
    return {
        "name": "videodata",
        "cluster": {"executor": "local", "accelerator": "cpu", "gpus_per_node": point.pop("gpn", 1)},
        "trainer": {
            "model": model,
            "seq_length": SEQ,
            "train_iters": 2,
            "seed": 11,
            "lr": {"schedule": "constant", "max": 1e-3},
            "data": {"provider": "energon", "path": str(path), "tokenizer": str(tokenizer)},
        },
        "matrix": {
            "points": [{"nodes": 1, "colocated": True, "llm": {"dp": 1}, "gbs": 5, "mbs": 5, **point}]
        },
    }


def _spec(doc: dict):
    from mimo_jobs.study.expand import runs_of
    from mimo_jobs.study.load import parse_study

    (spec,) = runs_of(parse_study(doc, env={}))
    return spec


def _runs(row: list[int], token: int) -> list[int]:
    """Lengths of the runs of `token` in a row, left to right."""
    out, prev = [], None
    for t in row:
        if t == token:
            out[-1:] = [out[-1] + 1] if prev == token else [*out[-1:], 1]
        prev = t
    return out


def test_each_video_reaches_the_image_module_as_its_frames_priced_by_the_temporal_patch(
    prepared, hf_tokenizer
):
    from mimo_jobs.data.energon_provider import make_energon_provider
    from mimo_jobs.data.images import ImageGeometry, decode
    from mimo_jobs.model.resolve import arch_of

    src, out = prepared
    spec = _spec(_study(out, OMNI_VIDEO, hf_tokenizer))
    enc = arch_of(OMNI_VIDEO).encoders["vision"]
    geom = ImageGeometry.of(enc)
    frames = {name: decode((src / name).read_bytes(), geom) for name in [f"a{i}.png" for i in range(4)]}
    frames |= {name: decode((src / name).read_bytes(), geom) for name in [f"b{i}.png" for i in range(3)]}
    still = decode((src / "still.png").read_bytes(), geom)
    a = torch.stack([frames[f"a{i}.png"] for i in range(4)])[None]
    b = torch.stack([frames[f"b{i}.png"] for i in range(3)])[None]
    # by record id: the image module's inputs in placeholder order, and its placeholder runs' lengths
    want = {
        0: ([a], [enc.video_tokens(4, 8, 8)]),
        1: ([b, still], [enc.video_tokens(3, 16, 16), enc.tokens_for(8, 16)]),
        2: ([], []),
        3: ([still], [enc.tokens_for(8, 16)]),
        4: ([a[:, :2]], [enc.video_tokens(2, 8, 8)]),
    }
    assert [n for _, ns in want.values() for n in ns] == [8, 32, 8, 8, 4]  # 2 groups of 2x2, 2 of 4x4, ...
    p = make_energon_provider(spec, spec.rank_layout(), [0], True, True)
    seen = set()
    try:
        for _ in range(4):  # the shuffled stream repeats the dataset: every record within a few batches
            _check_batch(p.next(0), want, seen)
    finally:
        p.close()
    assert seen == set(want)


def _check_batch(batch, want: dict, seen: set) -> None:
    vision = batch.inputs["vision"]
    for i, key in enumerate(batch.sample_keys):
        rid = int(key[1:]) - 1  # keys are l<line>; line n holds id n-1
        items, lengths = want[rid]
        seen.add(rid)
        got = vision.items[i]
        got = [] if got is None else (got if isinstance(got, list) else [got])
        assert [tuple(x.shape) for x in got] == [tuple(x.shape) for x in items], rid
        for x, y in zip(got, items):
            assert torch.equal(x, y), rid
        assert _runs(batch.tokens[i].tolist(), vision.token_id) == lengths, rid
        assert vision.counts[i] == sum(lengths)
        assert batch.loss_mask[i][batch.tokens[i] == vision.token_id].sum() == 0
        assert (batch.counts("audio")[i] > 0) == (rid == 4), rid  # the clip beside the video


def _members(ds) -> dict[str, bytes]:
    """Every member of the dataset's train shards, by name (the tar files read as data)."""
    import tarfile

    out = {}
    for shard in sorted((ds / "train").glob("*.tar")) or sorted(ds.rglob("*.tar")):
        with tarfile.open(shard) as tar:
            out |= {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
    return out


def test_a_video_file_becomes_its_frames_sampled_uniformly_in_time(prepared, clips, hf_tokenizer, tmp_path):
    """`"video": "clip.mp4"` (alone, beside a frame list, and as a list of video files) with --video-frames 3:
    frames 0, 6 and 11 of the 12 (evenly spread from the first to the last, Qwen2-VL's rule) stored as a
    frame list's members, their colours the source frames' within the codec's error, and each clip priced
    EncoderArch.video_tokens(3 frames) placeholders by the energon provider."""
    import io

    import numpy as np
    from PIL import Image

    from mimo_jobs.data.energon_provider import make_energon_provider
    from mimo_jobs.model.resolve import arch_of

    records = [
        {"id": 0, "video": "clip.mp4", "conversations": _turn("<video>\nwhat happens?")},
        {"id": 1, "video": [["a0.png", "a1.png"], "clip.mp4"], "conversations": _turn("<video> <video>")},
        {"id": 2, "video": ["clip.mp4", "short.mp4"], "conversations": _turn("<video> and <video>")},
    ]
    jsonl = tmp_path / "files.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in records))
    ds = tmp_path / "ds"
    r = _data("prepare", jsonl, "--images", clips, "-o", ds, "--video-frames", 3)
    assert r.returncode == 0, r.stderr
    assert "3 samples (train 3, val 0, test 0) with 0 images, 5 videos" in r.stdout, r.stdout
    members = _members(ds)
    picked = [0, 6, 11]  # round(k * 11 / 2), k = 0..2 (5.5 rounds half to even, as torch's round does)
    for key, v, hues in [
        ("l000000001", 0, picked),
        ("l000000002", 1, picked),
        ("l000000003", 0, picked),
        ("l000000003", 1, [0, 1, 2]),  # all 3 frames of the short clip
    ]:
        assert f"{key}.v{v}.3.png" not in members
        for f, hue in enumerate(hues):
            with Image.open(io.BytesIO(members[f"{key}.v{v}.{f}.png"])) as im:
                assert im.format == "PNG" and im.size == (16, 16), (key, v, f)
                rgb = np.asarray(im.convert("RGB"), dtype=np.int16)
            err = np.abs(rgb - np.array(HUES[hue], np.int16)).max()
            assert err <= 8, (key, v, f, hue, err)  # neighbouring hues differ by 127 in a channel
    for f in (0, 1):  # the frame list beside the file: the frames' own bytes, as before
        assert members[f"l000000002.v0.{f}.png"] == (clips / f"a{f}.png").read_bytes()

    spec = _spec(_study(ds, VIDEO, hf_tokenizer))
    enc = arch_of(VIDEO).encoders["vision"]
    clip = enc.video_tokens(3, 16, 16)
    assert clip == 2 * 16  # two temporal groups (the last padded) of one 16x16 frame's tokens
    want = {  # by record id: (frames, placeholders) of each video
        0: [(3, clip)],
        1: [(2, enc.video_tokens(2, 8, 8)), (3, clip)],
        2: [(3, clip), (3, clip)],
    }
    p = make_energon_provider(spec, spec.rank_layout(), [0], True, True)
    seen = set()
    try:
        for _ in range(3):
            batch = p.next(0)
            vision = batch.inputs["vision"]
            for i, key in enumerate(batch.sample_keys):
                rid = int(key[1:]) - 1
                seen.add(rid)
                assert _runs(batch.tokens[i].tolist(), vision.token_id) == [n for _, n in want[rid]], rid
                got = vision.items[i] if isinstance(vision.items[i], list) else [vision.items[i]]
                assert [tuple(x.shape[:2]) for x in got] == [(1, f) for f, _ in want[rid]], rid
    finally:
        p.close()
    assert seen == set(want)


@pytest.mark.parametrize("n", [0, -2, 1025])
def test_video_frames_outside_1_to_1024_is_refused_before_anything_is_read(n):
    from mimo_jobs.data.errors import DataError
    from mimo_jobs.data.prepare import PrepareConfig

    with pytest.raises(DataError, match=f"--video-frames={n}: frames sampled per video file, from 1 to 1024"):
        PrepareConfig(video_frames=n).check()


BAD = [
    ({"video": ["a0.png", "none.png"]}, "<video>", "video 0 frame 1: image 'none.png': no such file"),
    ({"video": ["a0.png", "junk.png"]}, "<video>", "video 0 frame 1: image 'junk.png'"),
    (
        {"video": ["a0.png", "b0.png"]},
        "<video>",
        "video 0 frame 1 'b0.png' is 16x16 px but frame 0 'a0.png' is 8x8",
    ),
    ({"video": []}, "<video>", 'field "video" is an empty list'),
    ({"video": [["a0.png"], []]}, "<video> <video>", 'field "video" item 1 is an empty list'),
    (
        {"video": ["a0.png"]},
        "no marker",
        'the text has 0 <video> marker(s) but field "video" gives 1 video(s)',
    ),
    ({}, "<video> here", 'the text has 1 <video> marker(s) but field "video" gives 0 video(s)'),
    (
        {"video": "corrupt.mp4"},
        "<video>",
        "video file 'corrupt.mp4': {src}/corrupt.mp4 is not a video PyAV reads",
    ),
    ({"video": "sound.wav"}, "<video>", "has no video stream (its streams: audio)"),
    ({"video": "short.mp4"}, "<video>", "has 3 frame(s), fewer than the 8 to sample (--video-frames)"),
    ({"video": "huge.mp4"}, "<video>", "bytes, over 4,294,967,296 (4 GiB); a training clip is at most"),
    ({"video": "none.mp4"}, "<video>", "video 0: video file 'none.mp4': no such file"),
    ({"video": ["a0.png", "clip.mp4"]}, "<video>", "field \"video\" item 1 'clip.mp4' is a video file"),
]


@pytest.mark.parametrize(
    ("fields", "text", "says"),
    BAD,
    ids=[
        "missing-frame",
        "unreadable-frame",
        "sizes-differ",
        "empty",
        "empty-second",
        "no-marker",
        "no-video",
        "file-corrupt",
        "file-no-video-stream",
        "file-too-few-frames",
        "file-too-big",
        "file-missing",
        "file-among-frames",
    ],
)
def test_a_bad_video_is_refused_by_file_and_line(prepared, clips, tmp_path, fields, text, says):
    from mimo_jobs.data.errors import DataError
    from mimo_jobs.data.prepare import prepare_jsonl

    src, _ = prepared
    (src / "junk.png").write_bytes(b"\x89PNG not really")
    good = {"id": "g", "conversations": _turn("hi")}
    bad = {"id": "b", **fields, "conversations": _turn(text)}
    jsonl = tmp_path / "bad.jsonl"
    jsonl.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(DataError) as e:
        prepare_jsonl(jsonl, src, tmp_path / "out")
    says = says.format(src=src.resolve())
    assert str(e.value).startswith(f"{jsonl}:2: ") and says in str(e.value), str(e.value)
    assert not (tmp_path / "out").exists()


def test_skip_bad_skips_and_counts_every_bad_video(prepared, clips, tmp_path):
    src, _ = prepared
    (src / "junk.png").write_bytes(b"\x89PNG not really")
    lines = [{"id": "g", "conversations": _turn("hi")}]
    lines += [{"id": i, **fields, "conversations": _turn(text)} for i, (fields, text, _) in enumerate(BAD)]
    jsonl = tmp_path / "bad.jsonl"
    jsonl.write_text("".join(json.dumps(x) + "\n" for x in lines))
    r = _data("prepare", jsonl, "--images", src, "-o", tmp_path / "out")
    assert r.returncode == 2 and f"{jsonl}:2: " in r.stderr and "Traceback" not in r.stderr, r.stderr
    r = _data("prepare", jsonl, "--images", src, "-o", tmp_path / "out", "--skip-bad")
    assert r.returncode == 0, r.stderr
    manifest = json.loads((tmp_path / "out" / "prepare.json").read_text())
    assert manifest["skipped"] == len(BAD) and manifest["samples"]["train"] == 1
    for x, (_, _, says) in zip(manifest["skipped_lines"], BAD, strict=True):
        assert says.format(src=src.resolve()) in x["reason"], x


def test_data_stats_counts_video_tokens(prepared, hf_tokenizer, tmp_path):
    _, out = prepared
    r = _data(
        "stats",
        out,
        "--seq-length",
        SEQ,
        "--model",
        json.dumps(OMNI_VIDEO),
        "--tokenizer",
        hf_tokenizer,
        "--out",
        tmp_path / "s.json",
    )
    assert r.returncode == 0, r.stderr
    assert "videos per sample: 0: 2, 1: 3" in r.stdout, r.stdout
    doc = json.loads((tmp_path / "s.json").read_text())
    per = {int(s["key"][1:]) - 1: s for s in doc["per_sample"]}
    assert [per[i]["video_tokens"] for i in range(5)] == [8, 32, 0, 0, 4]
    assert [per[i]["image_tokens"] for i in range(5)] == [8, 40, 0, 8, 4]
    assert doc["video_tokens"]["max"] == 32 and doc["modules"]["vision"]["items"] == 5


@pytest.mark.parametrize(
    "model", [FLAT, {"name": "hear", "encoders": {"audio": "tiny-audio"}, "llm": "tiny"}]
)
def test_videos_for_an_image_module_without_a_temporal_patch_are_refused_by_validate_and_preflight_alike(
    prepared, hf_tokenizer, tmp_path, model
):
    import yaml

    from mimo_jobs.trainer.main import PreflightError, preflight

    _, out = prepared
    doc = _study(out, model, hf_tokenizer)
    study = tmp_path / "s.yaml"
    study.write_text(yaml.safe_dump(doc, sort_keys=False))
    r = subprocess.run(
        [sys.executable, "-m", "mimo_jobs.cli", "validate", str(study)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**__import__("os").environ, "COLUMNS": "250"},
    )
    why = (
        "the image module 'vision' has temporal_patch_size 1: it embeds images, not a video's frames"
        if "vision" in model["encoders"]
        else "trainer.model has no image module to embed them"
    )
    message = f"{out} holds 3 video(s) but {why}"
    assert r.returncode == 2 and f"trainer.data.path: [module-data] {message}" in r.stderr, r.stderr
    with pytest.raises(
        PreflightError, match=re.escape(f"run.yaml: trainer.data.path: {message}; use an image")
    ):
        preflight(_spec(doc), {}, reference=True)
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(_study(out, VIDEO, hf_tokenizer), sort_keys=False))
    ok = subprocess.run(
        [sys.executable, "-m", "mimo_jobs.cli", "validate", str(good)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert ok.returncode == 0, ok.stderr


@pytest.mark.slow  # the trainer: two ranks under torchrun, and the one-process reference
@pytest.mark.timeout(900)
def test_a_colocated_run_on_prepared_videos_matches_the_reference(prepared, hf_tokenizer, tmp_path):
    """Vision (temporal patch 2) + audio, colocated on two LLM DP lanes, on the prepared dataset of videos,
    images, a clip and text: loss and gradient norm step for step as the one-process reference, and the
    image module's tokens of each iteration as the lanes' batches hold them (counted by the provider)."""
    import yaml

    from helpers.launch import trainer, worker_env
    from mimo_jobs.contract.rundir import RunDir
    from mimo_jobs.data.energon_provider import make_energon_provider
    from mimo_jobs.study.runspec import run_yaml_doc

    _, out = prepared
    spec = _spec(_study(out, OMNI_VIDEO, hf_tokenizer, gpn=2, llm={"dp": 2}, gbs=4, mbs=1))
    rd = RunDir.of(tmp_path / "runs", spec.study, spec.name, spec.run_id)
    rd.root.mkdir(parents=True, exist_ok=True)
    rd.run_yaml.write_text(yaml.safe_dump(run_yaml_doc(spec, rd.root, provenance={}), sort_keys=False))
    env = worker_env()
    runs = {}
    for what, cmd in (("world", trainer(rd.run_yaml, "--quiet", nproc=2)), ("reference", None)):
        cmd = cmd or trainer(rd.run_yaml, "--reference", "--quiet")
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, check=False)
        assert p.returncode == 0, (what, p.stderr[-4000:])
        metrics = rd.metrics if what == "world" else rd.root / "metrics.reference.jsonl"
        rows = [json.loads(x) for x in metrics.read_text().splitlines()]
        runs[what] = {r["iteration"]: r for r in rows if r["kind"] == "iteration"}
    h, r = runs["world"], runs["reference"]
    assert sorted(h) == sorted(r) == [1, 2]
    plan = spec.rank_layout()
    p = make_energon_provider(spec, plan, [0, 1], False, True)
    try:
        want = [
            sum(sum(p.next(lane).counts("vision")) for _ in range(plan.num_microbatches) for lane in (0, 1))
        ]
        want.append(
            sum(sum(p.next(lane).counts("vision")) for _ in range(plan.num_microbatches) for lane in (0, 1))
        )
    finally:
        p.close()
    for it in (1, 2):
        assert h[it]["loss"] == pytest.approx(r[it]["loss"], rel=1e-5, abs=1e-6), it
        assert h[it]["grad_norm"] == pytest.approx(r[it]["grad_norm"], rel=1e-4, abs=1e-6), it
        assert h[it]["extras"]["image_tokens"] == r[it]["extras"]["image_tokens"] == want[it - 1], it

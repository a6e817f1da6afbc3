"""Audio clips through the real loader: `data synth --audio` samples (audio only, image only, both, neither)
read back through the energon provider, each `<audio>` expanded to its clip's tokens by the audio encoder's
token rule, the clips handed to the encoder side as the shards hold them; a clip/marker mismatch and a
pickled `.npy` named by shard and key (the pickle never runs); the mock provider's audio samples; the
command's exit codes."""

from __future__ import annotations

import contextlib
import functools
import io
import json
import pickle
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

from mimo_jobs.data.audio import AudioSpec, npy_bytes
from mimo_jobs.data.batch import IGNORE_INDEX
from mimo_jobs.data.energon_provider import EnergonProvider, LoaderConfig
from mimo_jobs.data.errors import DataError
from mimo_jobs.data.images import ImageGeometry
from mimo_jobs.data.shards import prepare, write_shards
from mimo_jobs.data.synth_audio import AudioSynthConfig, write_audio

GEOM = ImageGeometry(patch_size=4, image_size=16)
# the sample type `data synth --audio` wrote before it wrote `data prepare`'s: such datasets still read
MEDIA = {"__module__": "mimo_jobs.data.samples", "__class__": "MediaSample"}
SIZES = ((8, 8), (12, 12), (16, 8))
SEQ = 64


def whisper_tokens(frames: int, pool: int = 1) -> int:
    """Whisper's encoder: conv2 (kernel 3, stride 2, padding 1) halves the mel frames, then an optional
    average pool of stride `pool` (Qwen2-Audio pools by 2)."""
    return ((frames + 2 - 3) // 2 + 1) // pool


RULE = AudioSpec(functools.partial(whisper_tokens, pool=2), n_mels=80)


def test_the_token_rule_by_hand():
    # 20 frames -> conv 10 -> pool 5; 41 -> 21 -> 10; 3000 (30 s) -> 1500 -> 750
    assert [RULE.clip_tokens((80, f)) for f in (20, 41, 3000)] == [5, 10, 750]
    with pytest.raises(ValueError, match="40 mel bins; the audio encoder reads 80"):
        RULE.clip_tokens((40, 20))
    with pytest.raises(ValueError, match="gives 0 tokens"):
        RULE.clip_tokens((80, 1))


@pytest.fixture(scope="module")
def audio_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("audio") / "audio"
    cfg = AudioSynthConfig(samples=24, frames=(20, 41), image_sizes=SIZES, seed=3, samples_per_shard=8)
    with contextlib.redirect_stdout(io.StringIO()):
        record = write_audio(root, cfg)
    return root, record


def _provider(path, packing=False, audio=RULE, need_images=True, **kw) -> EnergonProvider:
    cfg = LoaderConfig(
        path=str(path),
        llm_dp=1,
        mbs=4,
        num_microbatches=1,
        seq_length=SEQ,
        geometry=GEOM,
        vocab_size=128,
        packing=packing,
        packing_buffer_size=8,
        audio=audio,
        **kw,
    )
    return EnergonProvider(cfg, [0], need_images=need_images)


def _runs(row: list[int], ids: set[int]) -> list[tuple[int, int]]:
    """(placeholder id, run length) of each run of placeholders in a row, left to right."""
    runs: list[tuple[int, int]] = []
    for t, tok in enumerate(row):
        if tok in ids:
            if t and row[t - 1] == tok:
                runs[-1] = (tok, runs[-1][1] + 1)
            else:
                runs.append((tok, 1))
    return runs


def _members(root: Path) -> dict[str, np.ndarray]:
    """Every `.npy` member of the shards, read with numpy straight from the tar files: {name: array}."""
    out = {}
    for shard in sorted(root.glob("*.tar")):
        with tarfile.open(shard) as tar:
            for m in tar.getmembers():
                if m.name.endswith(".npy"):
                    out[m.name] = np.load(io.BytesIO(tar.extractfile(m).read()), allow_pickle=False)
    return out


@pytest.mark.parametrize("packing", [False, True], ids=["one-per-row", "packed"])
def test_synth_audio_reads_back_with_each_clip_at_its_placeholders(audio_data, packing):
    root, record = audio_data
    arrays = _members(root)
    p = _provider(root, packing=packing)
    img, aud = p.image_token_id, p.audio_token_id
    assert aud not in (None, img)
    kinds = set()
    try:
        for _ in range(6):
            b = p.next(0)
            for r, joined in enumerate(b.sample_keys):
                keys = joined.split("+")
                row = b.tokens[r].tolist()
                want = []  # the generator's record: each sample's image, then its clips (text order)
                for key in keys:
                    rec = record[key]
                    want += [(img, GEOM.tokens(h, w)) for h, w in rec["images"]]
                    want += [(aud, whisper_tokens(f, pool=2)) for f in rec["frames"]]
                    kinds.add((bool(rec["images"]), bool(rec["frames"])))
                assert _runs(row, {img, aud}) == want, joined
                assert b.counts("audio")[r] == sum(n for t, n in want if t == aud)
                assert b.counts("vision")[r] == sum(n for t, n in want if t == img)
                # the clips the encoder side gets are the shards' arrays, in placeholder order
                names = [
                    f"{key}.audio.npy" if len(record[key]["frames"]) == 1 else f"{key}.{j}.npy"
                    for key in keys
                    for j in range(len(record[key]["frames"]))
                ]
                clips = b.inputs["audio"].items[r] or []
                assert len(clips) == len(names)
                for clip, name in zip(clips, names):
                    assert clip.dtype == torch.float32 and torch.equal(clip, torch.from_numpy(arrays[name]))
                # no audio position carries loss, nor predicts the token after it
                for t, tok in enumerate(row[:-1]):
                    if tok == aud:
                        assert b.labels[r, t] == IGNORE_INDEX and b.loss_mask[r, t] == 0
        assert kinds == {(False, True), (True, False), (True, True), (False, False)}
        assert p.totals().audio_samples > 0
    finally:
        p.close()


def test_the_llm_side_counts_clips_without_loading_them(audio_data):
    root, _ = audio_data
    enc, llm = _provider(root), _provider(root, need_images=False)
    try:
        for _ in range(3):
            a, b = enc.next(0), llm.next(0)
            assert a.sample_keys == b.sample_keys and a.counts("audio") == b.counts("audio")
            assert (
                torch.equal(a.tokens, b.tokens)
                and b.inputs["audio"].items is None
                and b.inputs["vision"].items is None
            )
    finally:
        enc.close()
        llm.close()


def test_without_an_audio_encoder_a_clip_is_a_setting_error(audio_data):
    root, _ = audio_data
    p = _provider(root, audio=None, on_bad_sample="skip")
    try:
        with pytest.raises(DataError, match=r"shard audio-\d+\.tar, sample 'aud-\d+'.*no audio encoder"):
            for _ in range(6):
                p.next(0)
    finally:
        p.close()


class _Touch:
    """Unpickling this creates `path`: a pickle that runs code when it is loaded."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return (Path.touch, (self.path,))


def _media_dataset(root: Path, samples: list[tuple[str, dict]]) -> None:
    with contextlib.redirect_stdout(io.StringIO()):
        shards = write_shards(root, "m", samples, 2)
        prepare(root, shards, {"sample_type": MEDIA}, loader="media_members")


def _clip(frames: int = 20) -> bytes:
    return npy_bytes(np.ones((80, frames), dtype=np.float32))


def _good(n: int) -> list[tuple[str, dict]]:
    return [(f"g-{i:02d}", {"txt": b"<audio> says red", "audio.npy": _clip()}) for i in range(n)]


@pytest.mark.parametrize("need_images", [True, False], ids=["encoder-side", "llm-side"])
def test_a_pickled_npy_is_refused_unread(tmp_path, need_images):
    marker = tmp_path / "ran"
    buf = io.BytesIO()
    np.save(buf, np.array([_Touch(marker)], dtype=object), allow_pickle=True)
    assert pickle.loads(pickle.dumps(_Touch(tmp_path / "check"))) is None and (tmp_path / "check").exists()
    _media_dataset(tmp_path / "d", _good(2) + [("evil", {"txt": b"<audio> hi", "audio.npy": buf.getvalue()})])
    p = _provider(tmp_path / "d", need_images=need_images)
    try:
        with pytest.raises(DataError, match=r"shard m-000001\.tar, sample 'evil'.*object array \(a pickle\)"):
            for _ in range(3):
                p.next(0)
    finally:
        p.close()
    assert not marker.exists()


@pytest.mark.parametrize(
    "text, files, rule",
    [
        (
            b"<audio> one marker",
            {"0.npy": _clip(), "1.npy": _clip()},
            "1 <audio> marker(s) but the sample has 2",
        ),
        (b"no marker", {"audio.npy": _clip()}, "0 <audio> marker(s) but the sample has 1"),
        (b"<audio> <audio> two", {"audio.npy": _clip()}, "2 <audio> marker(s) but the sample has 1"),
        (b"<audio> both", {"audio.npy": _clip(), "0.npy": _clip()}, "both audio.npy and numbered"),
        (b"<audio> gap", {"0.npy": _clip(), "2.npy": _clip()}, "numbered [0, 2]; expected 0..1"),
        (b"<audio> f64", {"audio.npy": np.ones((80, 20)).tobytes()}, "not a readable .npy"),
    ],
    ids=["fewer-markers", "no-marker", "more-markers", "two-namings", "gap", "not-npy"],
)
def test_bad_audio_samples_are_named_or_counted(tmp_path, text, files, rule):
    _media_dataset(tmp_path / "d", _good(2) + [("bad", {"txt": text, **files})] + _good(3)[2:])
    p = _provider(tmp_path / "d")
    try:
        with pytest.raises(DataError, match=rf"shard m-000001\.tar, sample 'bad'.*{re.escape(rule)}"):
            for _ in range(3):
                p.next(0)
    finally:
        p.close()
    q = _provider(tmp_path / "d", on_bad_sample="skip")
    try:
        keys = [k for _ in range(3) for k in q.next(0).sample_keys]
        assert "bad" not in keys and sum(q.totals().skipped.values()) >= 1
    finally:
        q.close()


def test_mock_audio_samples():
    from mimo_jobs.data.mock import MockConfig, MockProvider, check_mock_config

    base = dict(
        seed=1,
        seq_length=48,
        mbs=8,
        num_microbatches=1,
        vocab_size=64,
        patch_size=4,
        channels=3,
        image_sizes=(8, 16),
        text_only_fraction=0.5,
    )
    cfg = MockConfig.one_module(**base, audio=RULE, audio_fraction=0.5, audio_frames=(20, 41))
    check_mock_config(cfg, 16)
    enc, llm = MockProvider(cfg, [0], True, True), MockProvider(cfg, [0], False, True)
    plain = MockProvider(MockConfig.one_module(**base), [0], True, True)
    img, aud = enc.placeholders["vision"], enc.placeholders["audio"]
    assert (img, aud) == (63, 62)
    kinds = set()
    for _ in range(4):
        b, lb, pb = enc.next(0), llm.next(0), plain.next(0)
        assert torch.equal(b.tokens, lb.tokens) and b.counts("audio") == lb.counts("audio")
        assert "audio" not in pb.inputs
        for r in range(8):
            row = b.tokens[r].tolist()
            n_aud = b.counts("audio")[r]
            assert row.count(aud) == n_aud and n_aud in (0, 5, 10)
            clips = b.inputs["audio"].items[r]
            assert (clips is None) == (n_aud == 0)
            if clips:
                assert whisper_tokens(clips[0].shape[1], 2) == n_aud and clips[0].shape[0] == 80
            assert b.loss_mask[r][torch.tensor(row) == aud].sum() == 0
            kinds.add((b.counts("vision")[r] > 0, n_aud > 0))
            if not n_aud:  # a sample without a clip is what it was without audio
                assert torch.equal(b.tokens[r], pb.tokens[r]) and torch.equal(b.labels[r], pb.labels[r])
    assert kinds == {(False, True), (True, False), (True, True), (False, False)}
    with pytest.raises(Exception, match="seq_length >= 28"):  # 16 image tokens + 10 audio + 2
        check_mock_config(
            MockConfig.one_module(
                **{**base, "seq_length": 27}, audio=RULE, audio_fraction=0.5, audio_frames=(41,)
            ),
            16,
        )
    with pytest.raises(Exception, match="no audio encoder"):
        check_mock_config(MockConfig.one_module(**base, audio_fraction=0.5, audio_frames=(41,)), 16)


def test_scan_counts_audio_clips_and_tokens(audio_data):
    from mimo_jobs.data.scan import scan
    from mimo_jobs.data.stats import summarize

    root, record = audio_data
    samples, skipped = scan(str(root), GEOM, 128, None, RULE)
    assert skipped == 0 and len(samples) == len(record)
    for s in samples:
        rec = record[s.key]
        assert s.audio_clips == len(rec["frames"]) and s.images == len(rec["images"])
        assert s.audio_tokens == sum(whisper_tokens(f, 2) for f in rec["frames"])
    doc = summarize(samples, SEQ)
    assert doc["audio_tokens"]["max"] == max(s.audio_tokens for s in samples)
    assert doc["audio_clips_per_sample"] == {
        str(n): sum(len(r["frames"]) == n for r in record.values()) for n in (0, 1, 2)
    }


def _cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mimo_jobs.cli", "data", *map(str, args)],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_cli_synth_audio_and_its_exit_codes(tmp_path):
    out = tmp_path / "ds"
    r = _cli("synth", out, "--samples", "4", "--audio", "8", "--audio-frames", "20,41", "--n-mels", "64")
    assert r.returncode == 0, r.stderr
    assert f"{out}/audio: 8 samples with audio clips (64 mel bins x 20, 41 frames)" in r.stdout
    meta = (out / "audio" / ".nv-meta" / "dataset.yaml").read_text()
    assert (
        "ConversationSample" in meta
        and "conversation_images" in (out / "audio" / ".nv-meta" / "sample_loader.py").read_text()
    )
    assert {a.shape[0] for a in _members(out / "audio").values()} == {64}
    assert "audio" not in (out / "blend.yaml").read_text()  # the blend stays image and text
    # the same arguments write the same bytes
    again = tmp_path / "again"
    assert (
        _cli(
            "synth", again, "--samples", "4", "--audio", "8", "--audio-frames", "20,41", "--n-mels", "64"
        ).returncode
        == 0
    )
    assert (again / "audio" / "audio-000000.tar").read_bytes() == (
        out / "audio" / "audio-000000.tar"
    ).read_bytes()
    for args, says in (
        (("--audio-frames", "0"), "--audio-frames: audio frames '0'"),
        (("--audio-frames", "abc"), "--audio-frames: audio frames 'abc'"),
        (("--audio-frames", "5000"), "--audio-frames 5000: clip lengths from 1 to 3000"),
        (("--n-mels", "0"), "--n-mels=0: mel bins from 1 to 256"),
        (("--audio", "-1"), "--audio=-1: count samples from 0"),
    ):
        bad = _cli("synth", tmp_path / "bad", "--audio", "4", *args)
        lines = [ln for ln in bad.stderr.splitlines() if ln.strip()]
        assert bad.returncode == 2 and len(lines) == 1 and says in lines[0], bad.stderr
        assert not (tmp_path / "bad").exists()
    # a model without an audio encoder cannot measure audio samples: named, exit 2
    st = _cli("stats", out / "audio", "--seq-length", "64")
    assert st.returncode == 2 and "no audio encoder" in st.stderr, st.stderr
    assert json.loads((out / "synth.json").read_text())["n_caps"] == 3


def test_a_conversation_places_each_clip_at_its_marker(tmp_path, hf_tokenizer):
    turns = [
        {"role": "user", "content": "<audio>\ncolor?"},
        {"role": "assistant", "content": "red"},
        {"role": "user", "content": "and <audio>?"},
        {"role": "assistant", "content": "blue"},
    ]
    samples = [
        (
            f"c-{i}",
            {"json": json.dumps({"conversation": turns}).encode(), "0.npy": _clip(20), "1.npy": _clip(41)},
        )
        for i in range(4)
    ]
    with contextlib.redirect_stdout(io.StringIO()):
        shards = write_shards(tmp_path / "c", "c", samples, 4)
        sample_type = {"__module__": "mimo_jobs.data.samples", "__class__": "ConversationSample"}
        prepare(tmp_path / "c", shards, {"sample_type": sample_type}, loader="conversation_images")
    p = _provider(tmp_path / "c", tokenizer=str(hf_tokenizer))
    try:
        b = p.next(0)
        from transformers import AutoTokenizer

        hf = AutoTokenizer.from_pretrained(hf_tokenizer)
        for r in range(4):
            row = b.tokens[r].tolist()
            assert _runs(row, {p.image_token_id, p.audio_token_id}) == [
                (p.audio_token_id, 5),
                (p.audio_token_id, 10),
            ]
            first = row.index(p.audio_token_id)
            after = hf.encode("\ncolor?", add_special_tokens=False)  # what follows the first marker
            assert row[first + 5 : first + 5 + len(after)] == after
            labels = [t for t in b.labels[r].tolist() if t != IGNORE_INDEX]
            # the answers carry the loss (this small tokenizer decodes with a space between tokens)
            assert hf.decode(labels).replace(" ", "") == "red<|im_end|>\nblue<|im_end|>\n"
            assert b.counts("audio")[r] == 15 and [c.shape[1] for c in b.inputs["audio"].items[r]] == [20, 41]
    finally:
        p.close()


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_a_clip_with_a_non_finite_value_is_refused_where_it_is_read(bad):
    import numpy as np

    from mimo_jobs.data.audio import load_clip, npy_bytes

    feats = np.zeros((8, 20), dtype=np.float32)
    assert load_clip(npy_bytes(feats)).shape == (8, 20)
    feats[3, 7] = bad
    with pytest.raises(ValueError, match="1 NaN or infinite value"):
        load_clip(npy_bytes(feats))

"""`data stats`: per-sample counts equal what the generator recorded; the summary's arithmetic by hand; the
data geometry agrees with the encoder's token count for every preset."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from mimo_jobs.data.images import ImageGeometry, geometry_of_preset
from mimo_jobs.data.stats import SampleStat, histogram, pack_first_fit, percentile, summarize
from mimo_jobs.data.synth import caption_sample, vqa_sample
from mimo_jobs.model.presets import PRESETS

GEOM = ImageGeometry(patch_size=4, image_size=16)


def test_scan_equals_the_generators_record(instruct_data):
    """Built-in tokenizer on captions + VQA (plain layout): text tokens are BOS + characters + EOS."""
    from mimo_jobs.data.scan import scan

    res, cfg = instruct_data
    recorded = json.loads((res.root / "synth.json").read_text())["image_sizes_by_key"]
    for part in (res.caps, res.vqa):
        stats, skipped = scan(str(part), GEOM, 128, None)
        assert skipped == 0
        keys = sorted(k for k in recorded if k.startswith(part.name[:3]))
        assert sorted(s.key for s in stats) == keys  # every sample once
        for s in stats:
            sizes = recorded[s.key]
            assert s.images == len(sizes) == 1
            assert s.image_tokens == sum(GEOM.tokens(h, w) for h, w in sizes)
            i = int(s.key.split("-")[1])
            if s.key.startswith("cap"):
                text = caption_sample(cfg.seed, i, cfg.image_sizes)[3]
            else:
                member = vqa_sample(cfg.seed, i, cfg.image_sizes)[3]
                text = member["context"] + member["answers"][0]
            assert s.text_tokens == len(text) + 2, s.key


def test_scan_with_the_chat_tokenizer_counts_what_training_reads(instruct_data, hf_tokenizer):
    from mimo_jobs.data.energon_provider import EnergonProvider, LoaderConfig
    from mimo_jobs.data.scan import scan

    res, _ = instruct_data
    stats = {s.key: s for s in scan(str(res.chat), GEOM, 128, str(hf_tokenizer))[0]}
    cfg = LoaderConfig(
        path=str(res.chat),
        llm_dp=1,
        mbs=4,
        num_microbatches=1,
        seq_length=64,
        geometry=GEOM,
        vocab_size=128,
        tokenizer=str(hf_tokenizer),
    )
    p = EnergonProvider(cfg, [0], need_images=False)
    try:
        b = p.next(0)
    finally:
        p.close()
    for i, key in enumerate(b.sample_keys):
        used = int((b.tokens[i] != p.tokenizer.pad_id).sum())
        assert stats[key].tokens == used and stats[key].image_tokens == b.counts("vision")[i]


def test_summary_by_hand():
    samples = [
        SampleStat("a", 16, 10, 1),
        SampleStat("b", 0, 6, 0),
        SampleStat("c", 9, 21, 1),
        SampleStat("d", 4, 4, 1),
    ]
    s = summarize(samples, seq_length=32)
    # lengths 26, 6, 30, 8 -> padded: 70 of 4*32 slots; first-fit decreasing: [30], [26, 6], [8] = 3 sequences
    assert s["packing"] == {
        "padded_efficiency": 70 / 128,
        "packed_sequences": 3,
        "packed_efficiency": 70 / 96,
    }
    assert s["images_per_sample"] == {"0": 1, "1": 3}
    assert s["image_tokens"]["mean"] == 29 / 4 and s["image_tokens"]["max"] == 16
    assert s["tokens"]["p50"] == 8 and s["tokens"]["p99"] == 30
    assert s["over_seq_length"] == 0 and len(s["per_sample"]) == 4
    assert summarize([SampleStat("x", 0, 40, 0)], seq_length=32)["over_seq_length"] == 1
    with pytest.raises(ValueError, match="seq_length=0"):
        summarize(samples, 0)


def test_packing_percentile_and_histogram_rules():
    assert pack_first_fit([5, 5, 5, 5], 10) == 2 and pack_first_fit([6, 6, 6], 10) == 3
    assert pack_first_fit([7, 3, 8, 2], 10) == 2  # decreasing: [8, 2], [7, 3]
    assert [percentile([1, 2, 3, 4], q) for q in (25, 50, 51, 100)] == [1, 2, 3, 4]
    h = histogram([0, 1, 9, 10], bins=2)
    assert h == [{"lo": 0, "hi": 5, "count": 2}, {"lo": 6, "hi": 11, "count": 2}]


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_data_geometry_gives_the_encoders_token_count(name):
    enc = PRESETS[name].encoder
    g = geometry_of_preset(name)
    for h, w in [
        (enc.image_size, enc.image_size),
        (enc.image_size // 2, enc.image_size),
        (3 * enc.image_size, enc.image_size),
        (1, 1),
    ]:
        th, tw = g.target_hw(h, w)
        assert g.tokens(h, w) == enc.tokens_for(th, tw) > 0, (h, w)
        assert th % (enc.patch_size * enc.downsample) == 0 and tw % (enc.patch_size * enc.downsample) == 0


def test_downsample_geometry_by_hand():
    g = ImageGeometry(patch_size=14, image_size=448, downsample=2)
    assert g.target_hw(448, 448) == (448, 448) and g.tokens(448, 448) == 16 * 16  # 32 patches / 2 per side
    assert g.target_hw(900, 300) == (448, 140) and g.tokens(900, 300) == 16 * 5  # 149 px -> 5 units of 28


def test_cli_stats_writes_json_beside_the_blend_and_refuses_bad_input(instruct_data, hf_tokenizer, tmp_path):
    res, cfg = instruct_data
    out = tmp_path / "s.json"
    base = [sys.executable, "-m", "mimo_jobs.cli", "data", "stats"]
    r = subprocess.run(
        base + [str(res.blend), "--seq-length", "64", "--tokenizer", str(hf_tokenizer), "--out", str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    assert doc["samples"] == cfg.total and doc["images_per_sample"] == {"1": cfg.total}
    assert "packing at 64" in r.stdout and f"wrote {out}" in r.stdout
    for args, msg in [
        ([str(res.blend), "--seq-length", "0"], "--seq-length=0"),
        ([str(res.blend), "--seq-length", "64", "--model", "nope"], "'nope' is no model this knows"),
        ([str(tmp_path / "missing"), "--seq-length", "64"], "missing"),
    ]:
        bad = subprocess.run(base + args, capture_output=True, text=True, check=False)
        assert bad.returncode == 2 and msg in bad.stderr, bad.stderr


def test_what_is_written_to_stdout_while_scanning_goes_to_stderr():
    """`data stats --json` prints one JSON document on stdout: whatever the loader writes meanwhile, through
    Python's sys.stdout or straight to file descriptor 1 (a child process, a C library), goes to stderr."""
    script = (
        "import os, subprocess, sys\n"
        "from mimo_jobs.cli.data import stdout_to_stderr\n"
        "with stdout_to_stderr():\n"
        "    print('python note')\n"
        "    os.write(1, b'fd note\\n')\n"
        "    subprocess.run(['echo', 'child note'])\n"
        "print('{\"json\": 1}')\n"
    )
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == {"json": 1}
    assert all(n in p.stderr for n in ("python note", "fd note", "child note"))


def test_a_shard_cut_short_is_one_line_naming_it(tmp_path):
    """A shard shorter than its index (a copy that did not finish) stops `data stats` with one line that
    names the shard and exit 2, not energon's traceback."""

    def cli(*args):
        return subprocess.run(
            [sys.executable, "-m", "mimo_jobs.cli", "data", *args],
            capture_output=True,
            text=True,
            timeout=600,
        )

    assert cli("synth", str(tmp_path / "d"), "-n", "32").returncode == 0
    shard = next((tmp_path / "d" / "caps").glob("*.tar"))
    with open(shard, "r+b") as f:
        f.truncate(shard.stat().st_size // 2)
    p = cli("stats", str(tmp_path / "d" / "caps"), "--model", "tiny", "--seq-length", "64")
    assert p.returncode == 2, p.stderr[-2000:]
    assert "Traceback" not in p.stderr
    assert f"shard {shard.name} ends before the samples its index lists" in p.stderr
